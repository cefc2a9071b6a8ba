"""The demo target's LoRA adapters (kneeswarm.target.lora): K slots kept least recently used first out,
a request of an adapter not loaded waits for a slot and a swap, vLLM's ``vllm:lora_requests_info``.

The truth is worked by hand from the order of the requests (which adapters an LRU of two keeps),
and read back from the real target's own counters."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import pytest
import requests

from kneeswarm.collectors.prometheus import parse_exposition
from kneeswarm.target.lora import Adapters
from kneeswarm.target.metrics import TargetMetrics


def _metrics() -> TargetMetrics:
    return TargetMetrics({"mode": "knee", "model": "base"}, workers=1, queue_capacity=0)


def _lora_states(m: TargetMetrics) -> dict[tuple[str, str], float]:
    """{(running, waiting): time} of the gauge's label sets."""
    out = {}
    for key, v in parse_exposition(m.render().decode()).items():
        if key.startswith("vllm:lora_requests_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            out[(labels["running_lora_adapters"], labels["waiting_lora_adapters"])] = v
    return out


def test_one_request_at_a_time_swaps_what_an_lru_of_two_does_not_keep():
    # a b a c b d a through two slots: a, b load; a is kept; c evicts b (least recent), b evicts a,
    # d evicts c, a evicts b: six swaps, a 2, b 2, c 1, d 1
    m = _metrics()

    async def go() -> Adapters:
        slots = Adapters(m, ("a", "b", "c", "d"), max_loras=2, swap_ms=1.0)
        for name in "abacbda":
            await slots.acquire(name)
            slots.release(name)
        return slots

    slots = asyncio.run(go())
    got = parse_exposition(m.render().decode())
    assert slots.swaps == 6
    assert {a: got[f'kneeswarm_target_lora_swaps_total{{adapter="{a}"}}'] for a in "abcd"} == {"a": 2, "b": 2, "c": 1, "d": 1}
    assert list(slots.loaded) == ["d", "a"]


def test_a_request_waits_while_the_slots_run_other_adapters_and_those_adapters_go_on():
    """One slot: a runs; b waits; another a joins the running a at once (vLLM skips the waiting b and
    schedules the a behind it); b runs once the last a ends, after its swap."""
    m = _metrics()

    async def go() -> list[str]:
        slots = Adapters(m, ("a", "b"), max_loras=1, swap_ms=0.0)
        order: list[str] = []
        await slots.acquire("a")
        waiter = asyncio.ensure_future(slots.acquire("b"))
        await asyncio.sleep(0)
        assert _lora_states(m)[("a", "b")] == max(_lora_states(m).values())  # the current state: b waits, a runs
        await slots.acquire("a")
        order.append("a joined")
        slots.release("a")
        await asyncio.sleep(0)
        assert not waiter.done()  # one a still runs
        slots.release("a")
        await waiter
        order.append("b ran")
        slots.release("b")
        return order

    assert asyncio.run(go()) == ["a joined", "b ran"]
    got = parse_exposition(m.render().decode())
    assert got['kneeswarm_target_lora_swaps_total{adapter="a"}'] == 1
    assert got['kneeswarm_target_lora_swaps_total{adapter="b"}'] == 1


def test_a_client_that_leaves_while_waiting_holds_no_slot():
    m = _metrics()

    async def go() -> Adapters:
        slots = Adapters(m, ("a", "b"), max_loras=1, swap_ms=0.0)
        await slots.acquire("a")
        waiter = asyncio.ensure_future(slots.acquire("b"))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        slots.release("a")
        await slots.acquire("a")  # the slot is free again: a runs at once
        slots.release("a")
        return slots

    slots = asyncio.run(go())
    assert slots.holders == {} and slots.waiting == [] and slots.swaps == 1


def test_the_real_target_serves_adapters_by_name_and_counts_each_swap(start_demo_target):
    t = start_demo_target("--mode", "knee", "--model-name", "base", "--adapters", "a,b,c,d", "--max-loras", "2",
                          "--swap-ms", "5", "--ttft-ms", "1")
    listed = requests.get(t.url + "/v1/models", timeout=5).json()["data"]
    assert [d["id"] for d in listed] == ["base", "a", "b", "c", "d"] and {d.get("parent") for d in listed[1:]} == {"base"}
    for name in ["a", "b", "a", "c", "b", "d", "a", "base"]:  # one at a time: the LRU of two, as above
        r = requests.post(t.url + "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200, r.text
    assert requests.post(t.url + "/v1/completions", json={"model": "e", "prompt": "hi"}, timeout=10).status_code == 404
    got = t.metrics()
    assert {a: got[f'kneeswarm_target_lora_swaps_total{{adapter="{a}"}}'] for a in "abcd"} == {"a": 2, "b": 2, "c": 1, "d": 1}
    assert {a: got[f'kneeswarm_target_lora_requests_total{{adapter="{a}"}}'] for a in "abcd"} == {"a": 3, "b": 2, "c": 1, "d": 1}
    states = {k: v for k, v in got.items() if k.startswith("vllm:lora_requests_info{")}
    assert all('max_lora="2"' in k for k in states)
    assert 'running_lora_adapters=""' in max(states, key=states.__getitem__)  # idle now: the latest state runs none


@pytest.mark.parametrize("args", [["--adapters", "a,,b"], ["--adapters", "a,a"], ["--adapters", "a", "--kv-tokens", "100"],
                                  ["--adapters", "demo"], ["--max-loras", "0"], ["--swap-ms", "-1"]])
def test_bad_adapter_arguments_exit_2_in_one_line(args):
    proc = subprocess.run([sys.executable, "-m", "kneeswarm.target", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
