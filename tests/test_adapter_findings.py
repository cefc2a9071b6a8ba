"""``adapters_over_capacity`` on synthetic rows and gauges (analysis/findings/adapters.py).

The rows are built here: requests of four adapters in a seeded random order, each costing a base
time, plus a swap where an LRU of K slots (simulated here with an OrderedDict, apart from the
code under test) would not have kept its adapter.  The gauges are vLLM's label sets written here."""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import pandas as pd

from kneeswarm.analysis.findings.adapters import (finding, lru_misses, over_capacity_support, read_gauge,
                                                  reuse_distance)

ADAPTERS = "abcd"
PLAN = {"protocol": "openai", "request": {"model": "base", "classes": [
    {"name": f"c{a}", "model": a, "weight": 1} for a in ADAPTERS]}}


def lru(keys: list[str], slots: int) -> list[bool]:
    """Per request: whether an LRU of ``slots`` had to load its adapter."""
    kept: OrderedDict[str, None] = OrderedDict()
    out = []
    for k in keys:
        out.append(k not in kept)
        kept[k] = None
        kept.move_to_end(k)
        while len(kept) > slots:
            kept.popitem(last=False)
    return out


def rows_and_stats(swap_ms: float, slots: int = 2, n: int = 1200, seed: int = 1) -> tuple[pd.DataFrame, pd.DataFrame, list[bool]]:
    rng = np.random.default_rng(seed)
    keys = [ADAPTERS[i] for i in rng.integers(0, 4, n)]
    missed = lru(keys, slots)
    lat = 40.0 + rng.normal(0, 2.0, n) + swap_ms * np.array(missed)
    t = np.arange(n) * 0.05  # one request every 50 ms: two steps of 30 s
    rows = pd.DataFrame({"t_start": t, "latency_ms": lat, "ok": True, "class": [f"c{k}" for k in keys]})
    stats = pd.DataFrame({"index": [0, 1], "users": [1, 2], "t_lo": [0.0, 30.0], "t_hi": [30.0, 60.0], "valid": [True, True]})
    return rows, stats, missed


def gauge(states: list[tuple[str, str, str]], t: np.ndarray) -> pd.DataFrame:
    """Scrapes at ``t``: before each, every label set (max_lora, running, waiting) of ``states`` was
    current once (its time moved on), in order."""
    cols = {f'vllm:lora_requests_info{{max_lora="{k}",running_lora_adapters="{r}",waiting_lora_adapters="{w}"}}': []
            for k, r, w in states}
    for ti in t:
        for j, c in enumerate(cols):
            cols[c].append(ti - 0.5 + 0.01 * j)
    return pd.DataFrame({"t": t, **cols})


def test_reuse_distance_counts_the_adapters_asked_for_since():
    assert reuse_distance(list("abacba")).tolist() == [3, 3, 1, 3, 2, 2]
    assert lru_misses(list("abacbda"), 2) == sum(lru(list("abacbda"), 2)) == 6


def test_an_adapter_held_by_a_request_in_flight_is_neither_evicted_nor_loaded_again():
    # a runs from 0 to 10 s; b (1-2), c (3-4): c evicts b, not the running a; a again at 5 (still running)
    # and b again at 6 (evicted): a, b, c and b load -- a pure LRU would load a again too
    keys, start = list("abcab"), np.array([0.0, 1.0, 3.0, 5.0, 6.0])
    end = np.array([10.0, 2.0, 4.0, 5.5, 6.5])
    assert lru_misses(keys, 2, start, end) == 4 and lru_misses(keys, 2) == 5
    # a second request of an adapter that waits with the first (both in flight, neither loaded): one load
    assert lru_misses(list("ab") + ["c", "c"], 1, np.array([0.0, 0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0, 3.1])) == 3


def test_swaps_of_an_lru_of_two_are_found_from_the_client_alone():
    rows, stats, missed = rows_and_stats(swap_ms=30.0)
    support, at, ev = over_capacity_support(rows, stats, PLAN, None)
    assert support >= 0.95 and at == [0, 1]
    assert ev.loaded_estimate == 2 and ev.max_lora is None
    assert ev.misses == sum(missed)
    # the far requests' mean is the missed ones' (numpy on the same rows, 10 % cut at either end)
    far = np.sort(rows.loc[(rows["t_start"] < 30) & np.array(missed), "latency_ms"].to_numpy())
    cut = int(0.1 * len(far))
    assert abs(ev.per_step[0]["far_ms"] - np.mean(far[cut:len(far) - cut])) < 3.0
    f = finding(support, at, ev)
    assert f["id"] == "adapters_over_capacity" and f["steps"] == [1, 2] and "--max-loras" in f["advice"]


def test_no_swap_no_finding():
    rows, stats, _ = rows_and_stats(swap_ms=0.0)
    support, at, _ev = over_capacity_support(rows, stats, PLAN, None)
    assert at == [] and support <= 0.05


def test_the_servers_gauge_of_waits_for_a_slot_is_the_finding_and_its_max_lora_the_evidence():
    rows, stats, _ = rows_and_stats(swap_ms=0.0)  # the client sees no jump: the gauge alone says it
    prom = gauge([("2", "a,b", "c"), ("2", "c,d", "a,b")], np.arange(1.0, 60.0))
    g = read_gauge(prom, stats)
    assert g is not None and g.max_lora == 2 and g.in_use[0] == set(ADAPTERS) and g.waited[0].all()
    support, at, ev = over_capacity_support(rows, stats, PLAN, prom)
    assert support >= 0.95 and at == [0, 1] and ev.max_lora == 2
    assert ev.per_step[0]["wait_share"] == 1.0 and ev.per_step[0]["adapters_in_use"] == 4


def test_a_server_that_ran_no_more_adapters_than_its_max_lora_is_not_over_capacity():
    rows, stats, _ = rows_and_stats(swap_ms=30.0)  # whatever the client saw
    prom = gauge([("4", "a,b", ""), ("4", "a,b,c,d", "")], np.arange(1.0, 60.0))
    support, at, _ = over_capacity_support(rows, stats, PLAN, prom)
    assert at == [] and support == 0.0


def test_waiting_beside_free_slots_is_not_waiting_for_an_adapter():
    # c waits while only one adapter of two runs: a wait for the batch or the KV cache, not a slot
    rows, stats, _ = rows_and_stats(swap_ms=0.0)
    prom = gauge([("2", "a", "c"), ("2", "b", "d")], np.arange(1.0, 60.0))
    g = read_gauge(prom, stats)
    assert g is not None and not g.waited[0].any()
    assert over_capacity_support(rows, stats, PLAN, prom)[1] == []


def test_garbage_gauge_values_are_one_warning_and_the_client_judges(caplog):
    rows, stats, _ = rows_and_stats(swap_ms=30.0)
    t = np.arange(1.0, 60.0)
    prom = pd.DataFrame({"t": t, 'vllm:lora_requests_info{max_lora="x",running_lora_adapters="a",waiting_lora_adapters=""}': t,
                         'vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters="c"}': ["zz"] * len(t)})
    with caplog.at_level(logging.WARNING):
        support, at, ev = over_capacity_support(rows, stats, PLAN, prom)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines  # one per kind of garbage
    assert ev.max_lora is None and at == [0, 1] and support >= 0.95


def test_not_an_openai_mix_of_two_adapters_is_not_judged():
    rows, stats, _ = rows_and_stats(swap_ms=30.0)
    assert over_capacity_support(rows, stats, {**PLAN, "protocol": "kserve"}, None) is None
    one = {"protocol": "openai", "request": {"model": "base", "classes": [{"name": f"c{a}"} for a in ADAPTERS]}}
    assert over_capacity_support(rows, stats, one, None) is None
