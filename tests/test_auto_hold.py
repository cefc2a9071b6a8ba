"""``[load] hold = "auto"``: steps held until steady (MSER-5) and known (95 % CIs), on real runs.

Everything is asserted from steps.csv and the request rows, never from wall-clock timing of the
test: how long a step was held is t_end − t_steady as the master recorded it, and the warm-up is
the rows' own latency before and after the step's t_cut.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kneeswarm.launch.cli import start_target, stop_target
from kneeswarm.locustfiles.steady import (P99_MIN_ROWS, closed_loop_qps_half_width, judge, mser_cut, p99_half_width, qps_half_width)
from tests.conftest import bad_plan_line, read_summary, side_by_side, start_cli

FIXED_HOLD = 20.0  # the fixed hold the steady steps must beat (the plan's default hold)
# 50 ms service: the few ms of scheduling noise of a busy 2-core host stay small beside it, so P99
# can be known within ±10 % from a few thousand rows (at 10 ms the tail is the noise itself)
SERVICE_MS, SLOTS = 50, 32
WARMUP_S, WARMUP_EXTRA_MS = 8, 40  # the drifting target: +40 ms falling to 0 over its first 8 s of load
# open loop: 32 req/s cannot give P99's 563 rows within max_hold 16 s, 256 req/s can
OPEN_MAX_HOLD = 16
OPEN = 'mode = "open"\nrates = [32.0, 256.0]\nsource_rate = 16.0\n'
AUTO = '[load]\nhold = "auto"\nmin_hold = 3\nmax_hold = {max_hold}\nsettle = 1\nci = 0.10\n'


# -- the statistics alone (independent truths: numpy, a closed form) ---------------------------
def test_mser_finds_a_warm_up_and_refuses_a_trend():
    rng = np.random.default_rng(1)
    warm = np.r_[np.linspace(50, 12, 20), np.full(60, 12.0)] + rng.normal(0, 0.3, 80)
    d = mser_cut(warm, 0.10)
    assert d is not None and 15 <= d <= 25  # the drift is 20 long
    assert mser_cut(np.linspace(10, 40, 80) + rng.normal(0, 0.3, 80), 0.10) is None  # trending to the end
    assert mser_cut(12 + rng.normal(0, 0.3, 80), 0.10) == 0  # steady: nothing cut
    # a one-off stall past the warm-up (a busy host's hiccup: one second at half the rate, the next
    # recovering) is no warm-up: the cut stays at the drift's end (a series measured on a real search run)
    stalled = np.array([101, 111, 130, 136, 129, 151, 162, 163, 180, 188, 180, 167, 83, 152, 173, 170, 164,
                        170, 171, 171, 167, 183, 183], dtype=float)
    d = mser_cut(stalled, 0.10)
    assert d is not None and 4 <= d <= 9, d


def test_order_statistic_interval_of_p99():
    # 1..1000: ranks 990 ∓ 1.96·√9.9 = 983.8 .. 996.2, widened outward to whole ranks 983 and 997,
    # plus one above (the discrete interval's conservative side): the values 983 and 998
    x = np.arange(1, 1001, dtype=float)
    hw = p99_half_width(x)
    assert hw == pytest.approx((998 - 983) / 2 / np.quantile(x, 0.99), rel=1e-9)
    assert math.isinf(p99_half_width(np.arange(100.0)))  # 100 rows: no upper rank for a P99 interval
    assert qps_half_width(np.array([100.0, 100.0, 100.0])) == 0.0
    assert math.isinf(qps_half_width(np.array([100.0, 100.0])))


def test_judge_cuts_a_drift_and_waits_for_a_trend():
    rng = np.random.default_rng(2)
    t = np.sort(rng.uniform(0, 20, 8000))
    lat = 10 + np.where(t < 6, 40 * (1 - t / 6), 0) + rng.exponential(0.5, len(t))
    v = judge(t, lat, 0.0, 20.0, 0.10)
    assert v.steady and v.known and 5.0 <= v.t_cut <= 8.0, v
    early = judge(t, lat, 0.0, 9.0, 0.10)  # 9 s of data, 6 of them drifting: not steady yet
    assert not early.steady and "not steady" in early.why
    climb = judge(t, 50 + 1.0 * t + rng.exponential(0.5, len(t)), 0.0, 20.0, 0.10)  # +1 ms/s, never levels
    assert not climb.steady and "median latency" in climb.why, climb


def _cohorts(users: int, cycle: float, phase: float, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Closed-loop rows of ``users`` in step (a server that serves its requests alike answers them
    together): every ``cycle`` s from ``phase`` all of them start again; latency the cycle less 1 ms."""
    starts = phase + np.arange(int(seconds / cycle) + 2) * cycle
    t = np.repeat(starts[starts < seconds], users)
    return t, np.full(len(t), (cycle - 0.001) * 1000.0)


def _window_error(t: np.ndarray, v, horizon: float, truth_qps: float) -> float:
    """|QPS over the verdict's window [t_cut, horizon) (what the search reads) / the truth - 1|."""
    n = int(((t >= v.t_cut) & (t < horizon)).sum())
    return abs(n / (horizon - v.t_cut) / truth_qps - 1)


def test_closed_loop_qps_half_width_covers_users_in_step_where_per_second_counts_do_not():
    """N users in step, cycle C: the truth is N/C exactly.  Over random cycles, phases and windows the
    verdict's QPS half-width with the users (the count's ends, the users' requests straddling them)
    holds the window's real error in every draw (under N rows whatever the phase: N/(rows − N)), where the per-second counts'
    Student-t interval (no users) holds it less often: at C = 250 ms every second holds 4N
    and it claims ±0.0 % while a 6.4-s window is off by 1.6 %."""
    rng = np.random.default_rng(11)
    hit_users = hit_counts = n = 0
    for _ in range(400):
        users, cycle = int(rng.choice([1, 4, 8, 16])), float(rng.uniform(0.12, 0.3))
        seconds = float(rng.uniform(6.0, 16.0))
        t, lat = _cohorts(users, cycle, float(rng.uniform(0, cycle)), seconds + 1)
        with_users = judge(t, lat, 0.0, seconds, 0.10, users=users)
        counts = judge(t, lat, 0.0, seconds, 0.10)
        if not (with_users.steady and counts.steady):
            continue
        assert with_users.t_cut == counts.t_cut
        err = _window_error(t, with_users, seconds, users / cycle)
        n += 1
        hit_users += err <= with_users.qps_half_width
        hit_counts += err <= counts.qps_half_width
    assert n >= 300 and hit_users == n and hit_counts / n <= 0.9, (n, hit_users, hit_counts)
    # 250 ms divides a second: the counts are 4N each second and claim ±0.0 %; a window's ends still err
    t, lat = _cohorts(4, 0.25, 0.0, 8.0)
    v = judge(t, lat, 0.0, 6.4, 0.10, users=4)
    assert judge(t, lat, 0.0, 6.4, 0.10).qps_half_width == 0.0
    assert v.t_cut == 0.0 and _window_error(t, v, 6.4, 16.0) == pytest.approx(1 / 64)  # 104 rows, not 102.4
    assert v.qps_half_width == pytest.approx(4 / 100, rel=1e-3)  # latency constant: the ends alone, N/(rows - N)


def test_the_step_schedule_gives_auto_hold_its_users():
    """StepSchedule -> AutoHold.decide -> judge: a closed-loop step's verdict counts its users at the
    window's ends.  4 users in step every 250 ms put 16 rows in every second, where the per-second
    counts claim ±0.0 %; the schedule's verdict is judge's with users=4 on the same rows."""
    from kneeswarm.locustfiles.steady import AutoHold
    from kneeswarm.locustfiles.steps import StepSchedule

    t, lat = _cohorts(4, 0.25, 100.0, 120.0)
    auto = AutoHold(min_hold=3.0, max_hold=20.0, settle=1.0, ci=0.10, lag_s=0.5)
    s = StepSchedule([4, 8], ramp=0.0, hold=20.0, auto=auto)
    s.tick(100.0, 0)
    s.spawned(100.0)
    auto.add({"t_start": list(t[t < 107.5]), "latency_ms": list(lat[t < 107.5]), "ok": [True] * int((t < 107.5).sum())})
    s.tick(108.0, 4)
    v = auto.last
    assert v is not None and v.steady and v.t_cut is not None
    rows = int(((t >= v.t_cut) & (t < 107.5)).sum())
    assert rows > 4 and v.qps_half_width == pytest.approx(4 / (rows - 4), rel=1e-3)
    assert v.qps_half_width == judge(t, lat, 101.0, 107.5, 0.10, users=4).qps_half_width
    assert judge(t, lat, 101.0, 107.5, 0.10).qps_half_width == 0.0  # what it was without the users


def test_closed_loop_qps_half_width_takes_the_cycles_own_noise_from_the_latencies():
    """Users not in step, each a renewal process of exponential cycles (mean 50 ms): the count's noise
    is the cycles' (cv 1, ~1/√rows), far above N/rows.  The half-width, from the per-second mean
    latencies (Little's law), holds the window's real error against the truth N/0.05 in >= 90 % of
    300 seeds; the count's ends alone would hold it in under 60 %."""
    rng = np.random.default_rng(12)
    hit = ends_only = 0
    for _ in range(300):
        users, seconds = int(rng.choice([1, 2, 4])), 10.0
        cyc = [rng.exponential(0.05, 600) for _ in range(users)]
        t = np.concatenate([np.concatenate([[0.0], np.cumsum(c)[:-1]]) for c in cyc])
        lat = np.concatenate(cyc) * 1000.0
        keep = t < seconds + 1
        hw = closed_loop_qps_half_width(users, t[keep], lat[keep], 0.0, seconds)
        rows = int((t < seconds).sum())
        err = abs(rows / seconds / (users / 0.05) - 1)
        hit += err <= hw
        ends_only += err <= users / (rows - users)
    assert hit >= 270 and ends_only < 180, (hit, ends_only)
    assert closed_loop_qps_half_width(4, np.arange(10.0), np.ones(10), 0.0, 2.5) == math.inf  # under 3 s


def test_open_loop_is_judged_on_the_share_of_arrivals_not_their_poisson_count():
    """Open loop: rows start at their intended send time, so the count of a second is the generator's
    Poisson draw; a steady server (every arrival served in 50 ms + noise) is steady and known from the
    share of arrivals that succeeded.  The same rows judged on their counts (the closed loop's rule)
    read the Poisson swings of 32 req/s as a trend or a warm-up in a quarter of the seeds."""
    done, as_counts = 0, 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        t = np.sort(rng.uniform(0.0, 40.0, rng.poisson(32 * 40)))
        lat = 50 + rng.exponential(1.0, len(t))
        v = judge(t, lat, 0.0, 40.0, 0.10, t_sent=t)
        done += v.done
        as_counts += judge(t, lat, 0.0, 40.0, 0.10).done
    assert done == 40, done
    assert as_counts <= 35, as_counts  # the control: the count rule does hold steady Poisson steps back


def test_open_loop_share_interval_and_what_still_holds_a_step():
    from scipy.stats import binomtest

    from kneeswarm.locustfiles.steady import share_half_width

    for ok, n in ((300, 300), (240, 300), (5, 40)):  # Wilson score interval, scipy's, relative to the share
        ci = binomtest(ok, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert share_half_width(ok, n) == pytest.approx((ci.high - ci.low) / 2 / (ok / n), rel=1e-6)
    assert math.isinf(share_half_width(0, 10)) and math.isinf(share_half_width(0, 0))
    rng = np.random.default_rng(4)
    t = np.sort(rng.uniform(0.0, 30.0, rng.poisson(200 * 30)))
    lat = 50 + rng.exponential(1.0, len(t))
    # a steady 20 % of the arrivals failing: steady, and the share (0.8) known
    ok = rng.uniform(size=len(t)) >= 0.2
    v = judge(t[ok], lat[ok], 0.0, 30.0, 0.10, t_sent=t)
    assert v.done and "share of the offered" in v.why, v
    # failures growing from none to half of the arrivals: the share trends, not steady
    ok = rng.uniform(size=len(t)) >= 0.5 * t / 30.0
    v = judge(t[ok], lat[ok], 0.0, 30.0, 0.10, t_sent=t)
    assert not v.steady and "QPS" in v.why, v
    # a queue building (latency +2 ms a second): the latency series says so, however steady the arrivals
    v = judge(t, lat + 2.0 * t, 0.0, 30.0, 0.10, t_sent=t)
    assert not v.steady and "median latency" in v.why, v
    # too few rows for a P99 interval (10 req/s over 30 s): steady, not known, and the reason says why
    few = np.sort(rng.uniform(0.0, 30.0, 300))
    v = judge(few, 50 + rng.exponential(1.0, 300), 0.0, 30.0, 0.10, t_sent=few)
    assert v.steady and not v.known and f"needs {P99_MIN_ROWS} requests" in v.why, v


# -- real runs ----------------------------------------------------------------------------------
def _steps(run_dir: Path) -> pd.DataFrame:
    st = pd.read_csv(run_dir / "steps.csv")
    st["held"] = st["t_end"] - st["t_steady"]
    return st


def _rows(run_dir: Path) -> pd.DataFrame:
    df = pd.concat([pd.read_parquet(p) for p in sorted((run_dir / "requests").glob("part-*.parquet"))])
    return df[df["ok"] == True]  # noqa: E712


@pytest.mark.long
@pytest.mark.slow
def test_auto_hold_ends_steady_steps_early_and_holds_a_warming_one_longer(tmp_path):
    targets = {"steady": start_target(["--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS)]),
               "drift": start_target(["--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS),
                                      "--warmup-s", str(WARMUP_S), "--warmup-extra-ms", str(WARMUP_EXTRA_MS)]),
               "short": start_target(["--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS),
                                      "--warmup-s", "20", "--warmup-extra-ms", "400"]),
               "open": start_target(["--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS)])}
    # short: max_hold 12 s, still drifting (+400 ms falling over 20 s: -20 ms/s, far more than ±10 %); open: open loop at 200 then 400 requests/s
    runs = {"steady": ("10,20", 30), "drift": ("10", 40), "short": ("10", 12), "open": (None, OPEN_MAX_HOLD)}
    try:
        with side_by_side() as started:
            for name, (steps, max_hold) in runs.items():
                plan = tmp_path / f"{name}.toml"
                plan.write_text(AUTO.format(max_hold=max_hold) + ("" if steps else OPEN))
                started[name] = start_cli("run", str(plan), "--target", targets[name][1],
                                          *(["--steps", steps] if steps else []),
                                          "--ramp", "1", "--workers", "1", "--out", str(tmp_path / name), "-q")
            outs = {name: p.communicate(timeout=240) for name, p in started.items()}
            codes = {name: p.returncode for name, p in started.items()}
    finally:
        for proc, _ in targets.values():
            stop_target(proc)
    assert codes == {"steady": 0, "drift": 0, "short": 0, "open": 0}, outs
    dirs = {name: next((tmp_path / name).iterdir()) for name in runs}
    steady, drift, short, open_loop = (_steps(dirs[n]) for n in ("steady", "drift", "short", "open"))
    print(steady[["users", "held", "t_cut", "hold_reason"]], drift[["users", "held", "t_cut", "hold_reason"]],
          short[["users", "held", "hold_reason"]], sep="\n")

    # steady target: every step ends before a fixed 20 s hold would, steady and known (no reason)
    assert (steady["held"] < FIXED_HOLD).all() and steady["hold_reason"].isna().all()
    assert all(s["valid"] for s in read_summary(dirs["steady"])["steps"])
    # open loop (Poisson arrivals on a schedule, latency from the intended send time): judged on the
    # share of arrivals served, the generator's Poisson swings are no trend.  256 req/s: steady and
    # known before max_hold.  32 req/s: steady, but the step's whole window holds fewer rows than a
    # P99 interval needs (counted here), so it ends at max_hold saying so -- before, its reason was
    # "not steady: QPS still trending" (32 req/s swings ±18 % a second) or a bare "P99 unknown"
    slow, fast = open_loop.iloc[0], open_loop.iloc[1]
    print(open_loop[["users", "held", "hold_reason"]].to_string())
    assert len(open_loop) == 2 and pd.isna(fast["hold_reason"]) and fast["held"] < OPEN_MAX_HOLD - 1
    window = _rows(dirs["open"])
    window = window[(window["step"] == 0) & (window["t_start"] >= slow["t_steady"] + 1) & (window["t_start"] < slow["t_end"])]
    assert len(window) < P99_MIN_ROWS
    assert "max_hold" in slow["hold_reason"] and "not steady" not in slow["hold_reason"], slow["hold_reason"]
    assert f"needs {P99_MIN_ROWS} requests" in slow["hold_reason"]

    # drifting target: the warm-up is cut, and the step held longer than the steady one
    d = drift.iloc[0]
    assert pd.isna(d["hold_reason"]) and d["held"] > steady.iloc[0]["held"]
    rows = _rows(dirs["drift"])
    rows = rows[(rows["step"] == 0) & (rows["t_start"] >= d["t_steady"] + 1)]
    before = rows.loc[rows["t_start"] < d["t_cut"], "latency_ms"]
    after = rows.loc[rows["t_start"] >= d["t_cut"], "latency_ms"]
    assert len(before) > 50 and d["t_cut"] - d["t_steady"] > 2.0  # a real cut, seconds into the step
    # the cut rows carry the drift (tens of ms), the kept rows are the service time plus noise
    assert np.median(before) > np.median(after) + WARMUP_EXTRA_MS / 8, (np.median(before), np.median(after))
    assert np.median(after) < SERVICE_MS + WARMUP_EXTRA_MS / 4
    # the analysis starts the step's window at the cut: its request count is the kept rows'
    step0 = read_summary(dirs["drift"])["steps"][0]
    assert step0["requests"] == len(rows[(rows["t_start"] >= d["t_cut"]) & (rows["t_start"] < d["t_end"])])

    # max_hold reached while still drifting: ended there, with the reason in steps[].reasons
    s = short.iloc[0]
    assert s["held"] == pytest.approx(12.0, abs=1.5) and "max_hold" in str(s["hold_reason"])
    reasons = read_summary(dirs["short"])["steps"][0]["reasons"]
    assert any("max_hold" in r and "not steady" in r for r in reasons), reasons
    assert not read_summary(dirs["short"])["steps"][0]["valid"]


@pytest.mark.parametrize("load,needle", [
    ('hold = "auto"\nmin_hold = 1\nsettle = 2', "load.min_hold"),
    ('hold = "auto"\nmin_hold = 30\nmax_hold = 10', "load.max_hold"),
    ('hold = "auto"\nci = 0', "load.ci"),
    ('hold = "soon"', "load.hold"),
])
def test_bad_auto_hold_bounds_are_one_line_exit_2_no_run_dir(tmp_path, load, needle):
    assert needle in bad_plan_line(tmp_path, load)


def test_schedule_under_auto_hold_waits_for_min_hold_and_stops_at_max_hold():
    """StepSchedule with a real AutoHold fed synthetic rows (no Locust): a steady, well-known step
    ends at the first tick past min_hold where the verdict is in; a drifting one at max_hold,
    with the reason in its steps.csv row."""
    from kneeswarm.locustfiles.steady import AutoHold
    from kneeswarm.locustfiles.steps import StepSchedule

    rng = np.random.default_rng(3)
    auto = AutoHold(min_hold=3.0, max_hold=20.0, settle=1.0, ci=0.10, lag_s=2.0)
    s = StepSchedule([2, 4], ramp=0.0, hold=20.0, auto=auto)
    assert s.tick(100.0, 0) == (2, 2.0)
    s.spawned(100.0)
    t = np.sort(rng.uniform(100.0, 130.0, 30 * 400))  # 400/s, steady 50 ms ± noise
    lat = 50 + rng.exponential(1.0, len(t))
    ended = None
    for now in np.arange(101.0, 125.0, 1.0):
        done = t < now - 0.5  # what has arrived by now
        auto._t, auto._lat = [], []
        auto.add({"t_start": list(t[done]), "latency_ms": list(lat[done]), "ok": [True] * int(done.sum())})
        if s.tick(float(now), 2)[0] == 4:
            ended = now
            break
    assert ended is not None and 103.0 <= ended < 120.0, ended
    step = s.log[0]
    assert step.t_end == ended and step.hold_reason is None and step.t_cut == pytest.approx(101.0, abs=1.0)
    assert step.full_row()[:5] == step.row() and len(step.full_row()) == 7

    # the next step drifts for good: it ends at max_hold with the reason
    s.spawned(ended)
    lat2 = 50 + 3.0 * (t - ended)  # rising 3 ms a second, without end
    for now in np.arange(ended + 1, ended + 25, 1.0):
        done = (t >= ended) & (t < now - 0.5)
        auto._t, auto._lat = [], []
        auto.add({"t_start": list(t[done]), "latency_ms": list(lat2[done]), "ok": [True] * int(done.sum())})
        if s.tick(float(now), 4) is None:
            break
    last = s.log[1]
    assert s.done and last.t_end - last.t_steady == pytest.approx(20.0, abs=1.0)
    assert "max_hold" in last.hold_reason and "not steady" in last.hold_reason


def test_web_form_takes_auto_as_the_hold():
    from kneeswarm.locustfiles.webui import form_overrides

    assert form_overrides({"kneeswarm_hold": "auto"}) == {"load.hold": "auto"}
    assert form_overrides({"kneeswarm_hold": "12"}) == {"load.hold": 12.0}
    with pytest.raises(ValueError, match="hold"):
        form_overrides({"kneeswarm_hold": "soon"})


def test_a_steady_step_whose_p99_lacks_rows_at_max_hold_ends_with_a_note_not_a_flaw():
    """18 requests/s for 12 s: steady, QPS known (the rows' count), but fewer rows than P99's
    order-statistic interval needs (563 for ±10 %), so the step ends at max_hold with the note that
    keeps it valid; the same rows drifting end with the flaw."""
    from kneeswarm.contracts.rundir import HOLD_NOTES, QPS_KNOWN_AT_MAX_HOLD
    from kneeswarm.locustfiles.steady import AutoHold

    rng = np.random.default_rng(7)
    steady = 50 + rng.exponential(5.0, 13 * 18)  # one user, one request after another: ~18/s
    t = 100.0 + np.concatenate([[0.0], np.cumsum(steady[:-1])]) / 1000.0
    assert len(t[(t >= 101.0) & (t < 112.0)]) < 563  # fewer rows than the P99 interval needs, counted here
    for lat, flaw in ((steady, False), (50 + 8.0 * (t - 100.0), True)):
        auto = AutoHold(min_hold=3.0, max_hold=12.0, settle=1.0, ci=0.10, lag_s=0.5)
        auto.add({"t_start": list(t), "latency_ms": list(lat), "ok": [True] * len(t)})
        end, t_cut, reason = auto.decide(100.0, 112.5, users=1)
        assert end and reason is not None and "max_hold" in reason, reason
        if flaw:
            assert not reason.startswith(HOLD_NOTES) and "not steady" in reason, reason
        else:
            assert reason.startswith(QPS_KNOWN_AT_MAX_HOLD) and "needs 563 requests" in reason, reason
