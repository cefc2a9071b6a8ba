"""The row watermark (locustfiles/watermark.py): auto-hold and the search judge a step only on rows
that are all in.  Fast tests, no Locust in this process: the worker's in-flight marks, the master's
horizon over its workers, the clock gate that carries each watermark with its rows, and AutoHold /
SearchDriver judging up to the horizon.  The real processes (a worker, a local runner, requests
slower than the report interval) are in tests/test_watermark_runs.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kneeswarm.locustfiles.clocks import ClockGate, WorkerClocks
from kneeswarm.locustfiles.watermark import Horizon, InFlight

LAG_S = 6.0  # the fallback: the old fixed guess of how late rows arrive


def test_the_watermark_is_the_earliest_start_not_yet_recorded():
    f = InFlight()
    assert f.watermark(100.0) == 100.0  # nothing in flight: every row is in up to now
    f.begin(90.0)  # a slow request sent at 90 ...
    f.begin(95.0)
    f.begin(95.0)  # ... and two sharing one start
    assert f.watermark(100.0) == 90.0 and len(f) == 3
    f.end(95.0)
    assert f.watermark(100.0) == 90.0  # the slow one still holds it back
    f.end(90.0)
    assert f.watermark(100.0) == 95.0  # the other request of 95 is still out
    f.end(95.0)
    assert f.watermark(101.0) == 101.0 and len(f) == 0
    f.begin(105.0)  # open loop: an arrival drawn for later is no reason to pass now
    assert f.watermark(101.0) == 101.0
    f.end(105.0)
    f.end(105.0)  # an end without its begin changes nothing
    assert len(f) == 0


def test_the_horizon_is_the_least_watermark_of_the_workers_present():
    h = Horizon(LAG_S)
    assert h.at(100.0, []) == 100.0 - LAG_S  # no worker connected: the fixed guess
    h.update("worker-1", 97.0)
    h.update("worker-2", 92.5)  # a worker with a slow request out since 92.5
    assert h.at(100.0, ["worker-1", "worker-2"]) == 92.5
    # worker-3 sent no watermark (an old worker): it counts as now - lag_s
    assert h.at(100.0, ["worker-1", "worker-2", "worker-3"]) == 92.5
    assert h.at(100.0, ["worker-1", "worker-3"]) == 100.0 - LAG_S
    # worker-2 left (not present): its old watermark no longer holds the horizon back
    assert h.at(100.0, ["worker-1"]) == 97.0
    h.update("worker-1", 99.0)  # a later report: the horizon advances with it
    assert h.at(100.0, ["worker-1"]) == 99.0
    h.update("worker-1", 103.0)  # a worker clock ahead of the master's: never past now
    assert h.at(100.0, ["worker-1"]) == 100.0


def test_the_gate_lets_a_watermark_through_only_with_its_rows_and_on_the_masters_clock():
    clocks, now = WorkerClocks(), [0.0]
    gate = ClockGate(clocks, wait=10.0, now=lambda: now[0])
    t = time.time()
    # the worker's clock is 2.5 s ahead; its report: a row of 1003.0 and the watermark 1004.0
    gate.admit("worker-0", {"t_start": [1003.0], "latency_ms": [1.0]}, [], 1004.0)
    assert gate.release() == [] and gate.take_watermarks() == {}  # no clock answer: rows and watermark held
    clocks.answered("worker-0", {"t1": t - 0.001, "t2": t + 2.5 - 0.0005})
    gate.admit("worker-0", None, [], 1005.0)  # a report with no rows (no user on it) still moves it
    (batch,) = gate.release()  # the empty report is no batch
    assert batch[1]["t_start"] == pytest.approx([1000.5], abs=0.002)
    assert gate.take_watermarks() == {"worker-0": pytest.approx(1002.5, abs=0.002)}  # the last one, shifted
    assert gate.take_watermarks() == {}  # taken once
    gate.admit("worker-9", None, [])  # an old worker's empty report: nothing held
    assert gate.held_rows == 0 and gate.release() == []


def _steady_rows(t0: float, t1: float, rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(t0, t1, int((t1 - t0) * rate)))
    return t, 50 + rng.exponential(1.0, len(t))


def test_auto_hold_judges_up_to_the_horizon_not_a_fixed_lag():
    """A steady 400/s step from 100 s, every row in up to 114 s.  With the horizon at 114 it is
    steady and known at 115; with the fixed 6 s lag it is judged only to 109.  Rows past the
    horizon (not yet complete: here rows of a different level) are never judged."""
    from kneeswarm.locustfiles.steady import AutoHold, judge

    t, lat = _steady_rows(100.0, 114.0, 400, 5)
    late_t = np.linspace(114.0, 115.0, 400)  # rows that started after the horizon, at 10x the latency
    rows = {"t_start": [*t, *late_t], "latency_ms": [*lat, *([500.0] * len(late_t))], "ok": [True] * (len(t) + 400)}
    seen: list[float] = []
    auto = AutoHold(min_hold=3.0, max_hold=20.0, settle=1.0, ci=0.10, lag_s=LAG_S,
                    horizon=lambda now: seen.append(now) or 114.0)
    auto.add(rows)
    end, t_cut, reason = auto.decide(100.0, 115.0)
    assert seen == [115.0] and end and reason is None
    truth = judge(t, lat, 101.0, 114.0, 0.10)  # the same rule on the rows before the horizon alone
    assert auto.last is not None and auto.last.why == truth.why and t_cut == truth.t_cut
    fixed = AutoHold(min_hold=3.0, max_hold=20.0, settle=1.0, ci=0.10, lag_s=LAG_S)
    fixed.add(rows)
    fixed.decide(100.0, 115.0)
    assert fixed.last is not None and fixed.last.why == judge(t, lat, 101.0, 115.0 - LAG_S, 0.10).why


def test_the_search_measures_a_probe_up_to_the_horizon_and_records_its_window(tmp_path):
    from kneeswarm.contracts.rundir import SEARCH_FILE, RunDir
    from kneeswarm.launch.search import MIN_PROBE_REQUESTS, SearchDriver, Settings
    from kneeswarm.locustfiles.steady import ProbeMeter
    from kneeswarm.locustfiles.steps import WAIT, StepRecord

    run = RunDir(tmp_path / "run")
    run.generator_dir.mkdir(parents=True)
    horizon = [101.0]
    d = SearchDriver(Settings(start=1, max=64), ProbeMeter(), run, settle=1.0, lag_s=LAG_S,
                     horizon=lambda now: horizon[0])
    d.first()
    t = np.arange(100.0, 112.0, 0.1)  # 10 req/s from 100 s, all of 50 ms
    d.meter.add({"t_start": list(t), "latency_ms": [50.0] * len(t), "ok": [True] * len(t), "status": [200] * len(t)})
    step = StepRecord(0, 1, 99.0, 100.0)
    assert d(step, 112.0, 12.0) == WAIT  # a slow request holds the horizon at 101: no rows yet to judge
    horizon[0] = 109.0  # a report moved it: [101, 109) holds 80 rows
    assert d(step, 112.0, 12.0) == 2
    (probe,) = d.probes
    assert probe.requests == 80 >= MIN_PROBE_REQUESTS and probe.qps == pytest.approx(10.0)
    assert probe.window_s == pytest.approx(8.0)
    import json

    rec = json.loads((run.generator_dir / SEARCH_FILE).read_text())["probes"][0]
    assert rec["window"] == [101.0, 109.0] and rec["t_judged"] == 112.0
