"""A search's growth probe that ends once its scaling is certain (to save load time: "steps far from the knee
end early under hold = auto"): kneeswarm.launch.search.scaling_certain and SearchDriver.may_end, the step
schedule's ``early`` hook, the gate on the probe's measured QPS precision (EARLY_QPS_CI: ungated,
bench/search_sim.py --early shows the shorter probes' QPS noise costs accuracy), and the analysis
keeping such a step valid: the pieces alone, no Locust.  Figures are closed forms: K slots of 50 ms
serve min(N, K) x 20 req/s."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t

from kneeswarm.contracts.rundir import QPS_KNOWN_AT_MAX_HOLD, SCALING_CERTAIN
from kneeswarm.launch.search import (EARLY_QPS_CI, EFFICIENCY_MIN, MIN_PROBE_REQUESTS, PER_USER_MIN, SCALING_MARGIN, Probe, SearchDriver, Settings, scaling_certain)
from kneeswarm.locustfiles.steps import StepRecord, StepSchedule

PER_USER_QPS = 20.0  # 50 ms a request


def _scaling(users: list[int]) -> list[Probe]:
    return [Probe(users=n, qps=PER_USER_QPS * n, p99_ms=50.0, requests=1000) for n in users]


def test_a_clearly_scaling_growth_probe_is_certain_one_within_a_margin_is_not():
    s = Settings(start=1, max=64)
    below = _scaling([1, 2])
    assert scaling_certain(Probe(users=4, qps=80.0, p99_ms=50.0), below, s) is not None  # linear: share 1, eff 1
    # QPS per user just over PER_USER_MIN but within the margin: the full rule would call it scaling, not certain
    share = PER_USER_MIN + SCALING_MARGIN / 2
    p = Probe(users=4, qps=4 * PER_USER_QPS * share, p99_ms=50.0)
    assert scaling_certain(p, below, s) is None and scaling_certain(p, below, s, margin=0.0) is not None
    # efficiency just within the margin (from 2 to 4: eff = 2 x share - 1): not certain
    share = (1 + EFFICIENCY_MIN + SCALING_MARGIN / 2) / 2
    assert scaling_certain(Probe(users=4, qps=4 * PER_USER_QPS * share, p99_ms=50.0), below, s) is None
    # any error or pushback, a P99 near the rise rule (3 x 50 ms: over 75 ms), an SLA P99 over half its limit
    assert scaling_certain(Probe(users=4, qps=80.0, p99_ms=50.0, error_rate=0.001), below, s) is None
    assert scaling_certain(Probe(users=4, qps=80.0, p99_ms=50.0, pushback=0.001), below, s) is None
    assert scaling_certain(Probe(users=4, qps=80.0, p99_ms=80.0), below, s) is None
    assert scaling_certain(Probe(users=4, qps=80.0, p99_ms=50.0), below, Settings(start=1, max=64, sla_p99_ms=90.0)) is None
    # once a saturated probe exists growth is over: nothing is certain
    sat = below + [Probe(users=8, qps=2 * PER_USER_QPS, p99_ms=200.0)]
    assert scaling_certain(Probe(users=4, qps=80.0, p99_ms=50.0), sat, s) is None


class Meter:
    """A probe's figures as the master would read them: ``rows`` rows at users x 20 req/s."""

    def __init__(self) -> None:
        self.users, self.rows, self.error_rate = 1, 500, 0.0

    def figures(self, t_lo: float, horizon: float) -> dict:
        return {"requests": self.rows, "qps": PER_USER_QPS * min(self.users, 6), "p99_ms": 50.0,
                "error_rate": self.error_rate, "pushback": 0.0}

    def forget_before(self, t: float) -> None:
        pass


class Steady:  # steady.Verdict's fields may_end reads
    t_cut = 1.0
    qps_half_width = 0.0  # its QPS measured exactly: the gate passes


def _driver() -> tuple[SearchDriver, Meter]:
    meter = Meter()
    d = SearchDriver(Settings(start=1, max=64), meter, auto_hold=True, ci=0.10, min_rows=100)
    assert d.first() == 1
    return d, meter


def _judge(d: SearchDriver, meter: Meter, index: int, users: int) -> int | None:
    meter.users = users
    return d(StepRecord(index, users, 0.0, 0.5, None, 1.0), 10.0, 10.0)


def test_the_driver_ends_a_growth_probe_once_its_scaling_is_certain_never_a_refinement():
    d, meter = _driver()
    assert d.may_end(StepRecord(0, 1, 0.0, 0.5), Steady(), 10.0).startswith(SCALING_CERTAIN)  # the start
    assert _judge(d, meter, 0, 1) == 2 and _judge(d, meter, 1, 2) == 4
    meter.users = 4
    note = d.may_end(StepRecord(2, 4, 0.0, 0.5), Steady(), 10.0)  # growth to 4: 80 req/s, linear
    assert note is not None and note.startswith(SCALING_CERTAIN) and "from 500 rows" in note and "±10%" in note
    meter.rows = 99  # below the analysis's min_requests (the step would not be valid): held on
    assert d.may_end(StepRecord(2, 4, 0.0, 0.5), Steady(), 10.0) is None
    meter.rows = MIN_PROBE_REQUESTS - 1
    d.min_rows = 0  # the driver's own floor still holds
    assert d.may_end(StepRecord(2, 4, 0.0, 0.5), Steady(), 10.0) is None
    meter.rows, d.min_rows = 500, 100
    meter.error_rate = 0.002
    assert d.may_end(StepRecord(2, 4, 0.0, 0.5), Steady(), 10.0) is None
    meter.error_rate = 0.0
    # 4 and 8 scale up to 6 slots: 8 is saturated (6 x 20 over 8 users), the next probe refines
    assert _judge(d, meter, 2, 4) == 8
    nxt = _judge(d, meter, 3, 8)
    assert nxt is not None and 4 < nxt < 8 and d.last is not None and d.last.rule == "refinement"
    meter.users = nxt
    assert d.may_end(StepRecord(4, nxt, 0.0, 0.5), Steady(), 10.0) is None  # a refinement probe: held in full
    assert [r["rule"] for r in d.records] == ["start", "growth", "growth", "growth", "refinement"]
    # a grid (no search) or hold = "auto" off: never
    off = SearchDriver(Settings(start=1, max=64), Meter(), auto_hold=False)
    off.first()
    assert off.may_end(StepRecord(0, 1, 0.0, 0.5), Steady(), 10.0) is None


def _alternating_rows(mean: int, spread: int, seconds: int, t_lo: float) -> tuple[np.ndarray, np.ndarray]:
    """Closed-loop rows whose per-second counts alternate mean + spread, mean - spread (evenly spread
    in each second, the first at ``t_lo``): their sample SD is spread·√(k/(k − 1)) for an even k."""
    counts = [mean + spread * (1 if i % 2 == 0 else -1) for i in range(seconds)]
    t = np.concatenate([t_lo + i + np.arange(c) / c for i, c in enumerate(counts)])
    return t, 50.0 + np.random.default_rng(3).exponential(1.0, len(t))


def test_the_gate_holds_a_probe_on_while_its_measured_qps_half_width_exceeds_early_qps_ci():
    """steady.judge on rows of known per-second spread: its qps_half_width is Student's t for the k
    counts (closed form: t₀.₉₇₅(k − 1)·SD/√k/mean), and may_end answers only at or below EARLY_QPS_CI --
    including spreads that z (1.96) would have let through, and while the QPS is known within ci."""
    from kneeswarm.locustfiles.steady import judge

    mean, k, t_lo = 100, 8, 1000.0
    seen = {"allowed": 0, "blocked": 0, "blocked_by_t_alone": 0}
    for spread in range(0, 11):
        t, lat = _alternating_rows(mean, spread, k, t_lo)
        v = judge(t, lat, t_lo, t_lo + k, ci=0.10)
        sd = spread * math.sqrt(k / (k - 1))
        want_t = float(student_t.ppf(0.975, k - 1)) * sd / math.sqrt(k) / mean
        want_z = 1.959964 * sd / math.sqrt(k) / mean
        assert v.steady and v.t_cut == pytest.approx(t_lo) and v.qps_known == (want_z <= 0.10)
        assert v.qps_half_width == pytest.approx(want_t, abs=1e-12)
        d, _ = _driver()
        note = d.may_end(StepRecord(0, 1, 0.0, 0.5), v, t_lo + k + 1.0)  # the start probe, 500 rows: certain
        if want_t <= EARLY_QPS_CI:
            assert note is not None and note.startswith(SCALING_CERTAIN) and f"QPS ±{want_t:.1%}" in note
            seen["allowed"] += 1
        else:
            assert note is None
            seen["blocked"] += 1
            seen["blocked_by_t_alone"] += want_z <= EARLY_QPS_CI
    assert all(n > 0 for n in seen.values()), seen  # the sweep crosses the bound, and z's bound below t's


def test_the_schedule_ends_a_step_on_the_early_note_once_steady_and_its_qps_known():
    """StepSchedule with a real AutoHold on 40 req/s of steady rows: P99 needs 563 rows after the cut
    (14 s), so without ``early`` the step runs to max_hold (12 s) with the max_hold reason; with it, the
    note ends the step at the first tick past min_hold where the rows are steady and the QPS known."""
    from kneeswarm.locustfiles.steady import AutoHold

    rng = np.random.default_rng(5)
    t = np.sort(100.0 + np.arange(30 * 40) / 40.0 + rng.uniform(0, 0.01, 30 * 40))  # closed loop: evenly spread
    lat = 50 + rng.exponential(1.0, len(t))

    def run(early):
        auto = AutoHold(min_hold=3.0, max_hold=12.0, settle=1.0, ci=0.10, lag_s=0.5)
        s = StepSchedule([2, 4], ramp=0.0, hold=20.0, auto=auto, early=early)
        s.tick(100.0, 0)
        s.spawned(100.0)
        for now in np.arange(101.0, 120.0, 1.0):
            done = t < now - 0.5
            auto._t, auto._lat = [], []
            auto.add({"t_start": list(t[done]), "latency_ms": list(lat[done]), "ok": [True] * int(done.sum())})
            if s.tick(float(now), 2)[0] == 4:
                return s.log[0], now
        raise AssertionError("never ended")

    asked: list[tuple[float, bool]] = []

    def early(step, verdict, now):
        asked.append((now - step.t_steady, verdict.steady and verdict.qps_known and not verdict.known))
        return SCALING_CERTAIN + " (test)"
    step, ended = run(early)
    assert step.hold_reason == SCALING_CERTAIN + " (test)" and step.t_cut is not None and ended - 100.0 < 12.0
    assert asked and all(held >= 3.0 and ok for held, ok in asked)  # after min_hold, on such verdicts only
    full, full_end = run(None)
    assert full_end - 100.0 == pytest.approx(12.0, abs=1.0) and "max_hold" in full.hold_reason


def test_a_step_ended_once_its_scaling_was_certain_stays_valid_with_the_reason():
    from kneeswarm.analysis import with_hold_reasons

    stats = pd.DataFrame({"users": [1, 2, 4], "valid": [True, True, True], "reasons": [[], [], []],
                          "hold_reason": [f"{SCALING_CERTAIN} (x): its P99 is from 120 rows, not known within ±10%",
                                          "held 18 s (max_hold) without being known within the asked CI: ...", None]})
    out = with_hold_reasons(stats)
    assert list(out["valid"]) == [True, False, True]
    assert out["reasons"][0] == [stats["hold_reason"][0]] and out["reasons"][1] == [stats["hold_reason"][1]]
    assert out["reasons"][2] == []


def test_a_step_at_max_hold_steady_with_its_qps_known_stays_valid_with_the_note():
    """Only its P99 short of rows (the note AutoHold.decide writes): valid, the note in its reasons; a step
    at max_hold not steady, or with its QPS unknown, is not."""
    from kneeswarm.analysis import with_hold_reasons

    note = f"{QPS_KNOWN_AT_MAX_HOLD} (held 12 s, max_hold; QPS ±4.0%): its P99 is from 174 rows, not known within ±10%: ..."
    stats = pd.DataFrame({"users": [1, 2, 3], "valid": [True, True, True], "reasons": [[], [], []],
                          "hold_reason": [note, "held 12 s (max_hold) without being steady: not steady: ...",
                                          "held 12 s (max_hold) without being known within the asked CI: QPS ±14%"]})
    out = with_hold_reasons(stats)
    assert list(out["valid"]) == [True, False, False] and out["reasons"][0] == [note]
