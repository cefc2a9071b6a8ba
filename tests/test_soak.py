"""Soak (leaks, drift): one load held for a duration, one step per window, and the trends over the
windows.  Real runs against the demo target with a known leak (--leak-kb-per-request), a known
latency drift (--drift-ms-per-min) and neither; the expected figures come from the target's
settings and from numpy over the run's own request rows, never from kneeswarm.analysis.summary.soak."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kneeswarm.analysis.summary.soak import SOAK_IDS, soak_findings, soak_section
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from tests.conftest import (REPO, only_run_dir, read_summary, run_cli, side_by_side, start_cli, start_target,
                            stop_target)

# Each real run: 2 users against 2 slots of 50 ms (about 35 QPS on this machine, no queueing),
# 7 windows of 2 s after a 1-s ramp and 1-s settle: 16 s of load.  Seven windows, not the fewest
# (SOAK_MIN_WINDOWS = 6): at alpha 0.01 Mann-Kendall over 6 windows needs a perfectly monotonic
# series, over 7 it allows one pair out of order.  2-s windows hold whole 1-s samples of the
# collectors (2 each), so each window's mean RSS, fds and threads sit at the same place in every
# window and the fitted slopes carry no sampling-phase error.
SOAK_PLAN = """
name = "{name}"
[load]
mode = "soak"
users = 2
duration = 14
window = 2
ramp = 1
settle = 1
workers = 1
"""
WINDOWS = 7
# 96 kB a request (below glibc's 128-kB mmap threshold: heap, no page rounding): about 3.5 MB/s, so
# that the few MB the target's RSS settles by in the first windows move the 12-s fitted slope by a
# few per cent only (measured at 64 kB: +9 %, the first windows growing 0.6 MB/s faster)
LEAK_KB = 96
# +15 ms per second: +210 ms over the soak's 14 s, against a 50-ms service time (the same rise per
# window as 600 ms/min gave over 3-s windows: the later windows' QPS well under half the first's)
DRIFT_MS_PER_MIN = 900.0
FD_EVERY, THREAD_EVERY = 10, 25  # the target opens one fd every 10 requests, starts a thread every 25
# The soak runs the tests below read, each against its own demo target built with one fault (or none)
SOAK_TARGETS = {
    "leak": ["--leak-kb-per-request", str(LEAK_KB)],
    "fds": ["--leak-fd-every", str(FD_EVERY), "--leak-thread-every", str(THREAD_EVERY)],
    "drift": ["--drift-ms-per-min", str(DRIFT_MS_PER_MIN)],
    "steady": [],
}


@pytest.fixture(scope="module")
def soak_runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The four soak runs of SOAK_TARGETS, side by side (each a real `kneeswarm run` with its own
    target's pid and /metrics): {name: (its run directory, its summary)}.  Each test reads only its
    own run, and every expected figure comes from that run's rows or its target's settings; the
    runs share the machine as each already shared it with the other tests' processes."""
    tmp = tmp_path_factory.mktemp("soak")
    targets: dict[str, subprocess.Popen] = {}
    try:
        with side_by_side() as started:
            for name, flags in SOAK_TARGETS.items():
                targets[name], url = start_target(["--mode", "knee", "--slots", "2", "--service-ms", "50", *flags])
                plan = tmp / f"{name}.toml"
                plan.write_text(SOAK_PLAN.format(name=name))
                started[name] = start_cli("run", str(plan), "--target", url, "--pid", str(targets[name].pid),
                                          "--metrics-url", url + "/metrics", "--out", str(tmp / name), "-q",
                                          env={**os.environ, "PYTHONPATH": str(REPO)})
            errs = {name: p.communicate(timeout=240)[1] for name, p in started.items()}
    finally:
        for proc in targets.values():
            stop_target(proc)
    for name, p in started.items():
        assert p.returncode == 0, (name, errs[name][-3000:])
    return {name: (only_run_dir(tmp / name), read_summary(only_run_dir(tmp / name))) for name in SOAK_TARGETS}


def rows(run: Path) -> dict[str, np.ndarray]:
    t = pa.concat_tables([pq.read_table(p, columns=["t_start", "latency_ms", "ok", "step"])
                          for p in sorted(glob.glob(str(run / "requests" / "part-*.parquet")))])
    return {c: t[c].to_numpy(zero_copy_only=False) for c in t.column_names}


def soak_ids(summary: dict) -> set[str]:
    return {f["id"] for f in summary["findings"] if f["id"] in SOAK_IDS}


def assert_windows_tile(run: Path, summary: dict) -> None:
    """steps.csv: one step per window, all at the same users, each window starting where the one
    before ended; each window's QPS and P99 equal numpy's over the rows in it."""
    import pandas as pd

    steps = pd.read_csv(run / "steps.csv")
    assert len(steps) == WINDOWS and set(steps["users"]) == {2}
    assert np.allclose(steps["t_ramp"].to_numpy()[1:], steps["t_end"].to_numpy()[:-1])
    assert np.allclose(steps["t_steady"].to_numpy()[1:], steps["t_ramp"].to_numpy()[1:])  # no ramp after the first
    r = rows(run)
    for w in summary["steps"]:
        m = (r["t_start"] >= w["t_lo"]) & (r["t_start"] < w["t_hi"])
        ok = m & r["ok"].astype(bool)
        assert w["requests"] == int(m.sum()) and set(r["step"][m]) == {w["index"]}
        assert w["qps"] == pytest.approx(ok.sum() / w["window_s"], rel=1e-9)
        assert w["p99_ms"] == pytest.approx(np.percentile(r["latency_ms"][ok], 99), rel=1e-9)
    later = summary["steps"][1:]
    assert all(a["t_hi"] == pytest.approx(b["t_lo"]) for a, b in zip(later, later[1:]))  # no settle after the first


@pytest.mark.long
def test_soak_leak_is_memory_growth_at_96kb_times_qps(soak_runs):
    run, summary = soak_runs["leak"]
    assert_windows_tile(run, summary)
    r = rows(run)
    first, last = summary["steps"][0], summary["steps"][-1]
    span = (r["t_start"] >= first["t_lo"]) & (r["t_start"] < last["t_hi"]) & r["ok"].astype(bool)
    qps = span.sum() / (last["t_hi"] - first["t_lo"])  # from the rows: the requests the target answered
    expected_mb_s = LEAK_KB / 1024.0 * qps
    (growth,) = [f for f in summary["findings"] if f["id"] == "memory_growth"]
    print(f"memory_growth {growth['evidence']['slope_mb_per_s']:.4g} MB/s, {LEAK_KB} kB x {qps:.2f} QPS = {expected_mb_s:.4g} MB/s")
    assert growth["evidence"]["slope_mb_per_s"] == pytest.approx(expected_mb_s, rel=0.20), (growth, qps)
    assert growth["evidence"]["hours_to_limit"] > 0 and growth["evidence"]["limit_mb"] > 0
    assert summary["knee"]["users"] is None and summary["knee"]["method"] == "none"  # not a step sweep
    soak = summary["soak"]
    assert soak["windows"] == WINDOWS and len(soak["series"]["hosts"]["local"]["fds"]) == WINDOWS
    assert all(v is not None and v > 0 for v in soak["series"]["hosts"]["local"]["fds"])  # the fds sampler ran
    assert "requests_s" in soak["series"]["hosts"]["target"]["target"]  # the server's own series, per window
    md = (run / "report" / "summary.md").read_text()
    assert "`memory_growth`" in md and "Soak windows" in md and "**Knee:**" not in md
    from kneeswarm.analysis.measure.live import LiveRun
    from kneeswarm.contracts.rundir import RunDir

    live = LiveRun(RunDir(run)).figures(now=last["t_hi"] + 3600)  # the live export's figures: the summary's
    assert [(f.requests, f.qps, f.p99_ms) for f in live.steps] == [(w["requests"], pytest.approx(w["qps"]),
                                                                    pytest.approx(w["p99_ms"])) for w in summary["steps"]]
    html = (run / "report" / "index.html").read_text()
    assert "Soak: each window" in html and "Throughput and latency against users" not in html  # no knee figure


def answered_qps(run: Path, summary: dict) -> float:
    """The requests the target answered per second over the soak's windows, from the rows."""
    r = rows(run)
    first, last = summary["steps"][0], summary["steps"][-1]
    span = (r["t_start"] >= first["t_lo"]) & (r["t_start"] < last["t_hi"]) & r["ok"].astype(bool)
    return span.sum() / (last["t_hi"] - first["t_lo"])


@pytest.mark.long
@pytest.mark.slow
def test_soak_fd_and_thread_leaks_are_fd_growth_and_thread_growth(soak_runs):
    # The target keeps an fd open every 10 requests and a thread waiting every 25: its fds grow by
    # QPS / 10 a second and its threads by QPS / 25 (QPS from the rows: the requests it answered).
    run, summary = soak_runs["fds"]
    qps = answered_qps(run, summary)
    found = {f["id"]: f["evidence"] for f in summary["findings"]}
    print(f"{qps:.2f} QPS:", {k: v.get("slope_per_minute") for k, v in found.items()})
    assert found["fd_growth"]["slope_per_minute"] == pytest.approx(60.0 * qps / FD_EVERY, rel=0.20), found
    assert found["thread_growth"]["slope_per_minute"] == pytest.approx(60.0 * qps / THREAD_EVERY, rel=0.20), found
    assert found["fd_growth"]["host"] == found["thread_growth"]["host"] == "local"
    assert not {"latency_drift", "throughput_decay"} & set(found)


@pytest.mark.long
def test_soak_drift_is_latency_drift(soak_runs):
    run, summary = soak_runs["drift"]
    ids = soak_ids(summary)
    assert "latency_drift" in ids and "memory_growth" not in ids, summary["findings"]
    (drift,) = [f for f in summary["findings"] if f["id"] == "latency_drift"]
    print(f"latency_drift {drift['evidence']['slope_per_minute']:.4g} ms/min for {DRIFT_MS_PER_MIN:g}")
    # P50 = the 50-ms service + the drift at that time: its slope is the target's drift
    assert drift["evidence"]["slope_per_minute"] == pytest.approx(DRIFT_MS_PER_MIN, rel=0.20), drift
    # ... and, 2 users in a closed loop, QPS = 2 / latency falls with it: throughput_decay, its median
    # the windows' QPS from the rows
    (decay,) = [f for f in summary["findings"] if f["id"] == "throughput_decay"]
    r = rows(run)
    ok = r["ok"].astype(bool)
    per_window = [((r["t_start"] >= w["t_lo"]) & (r["t_start"] < w["t_hi"]) & ok).sum() / w["window_s"]
                  for w in summary["steps"]]
    assert decay["evidence"]["median"] == pytest.approx(float(np.median(per_window)), rel=0.02), (decay, per_window)
    assert decay["evidence"]["change"] < 0 and per_window[-1] < 0.5 * per_window[0], per_window


@pytest.mark.long
def test_soak_steady_target_has_no_soak_finding(soak_runs):
    run, summary = soak_runs["steady"]
    assert_windows_tile(run, summary)
    assert soak_ids(summary) == set(), summary["findings"]
    assert "nothing crept" in (run / "report" / "summary.md").read_text()
    assert_progress_keeps_one_window(run)


def assert_progress_keeps_one_window(run: Path) -> None:
    """The conductor's progress (and the web UI's live table through it) frees each window's rows
    once its line is printed, and still shows that window's figures: numpy's over its rows."""
    import io

    from kneeswarm.launch.lifecycle import live_steps
    from kneeswarm.contracts.planfile import load_plan
    from kneeswarm.launch.progress import Progress
    from kneeswarm.contracts.rundir import RunDir

    rd = RunDir(run)
    plan = load_plan(rd.plan_path)
    progress = Progress(rd, plan, stream=io.StringIO(), live=False)
    live = live_steps(rd, progress, plan)
    held = [i for i, s in progress._steps.items() if s.t]  # noqa: SLF001
    assert held == [WINDOWS - 1], held  # only the last window's rows are kept
    r, steps = rows(run), rd.read_steps()
    for row, st in zip(live[:-1], steps.to_dict("records")):
        t_from = st["t_steady"] + (plan.load.settle if st["index"] == 0 else 0.0)
        m = (r["step"] == st["index"]) & (r["t_start"] >= t_from) & r["ok"].astype(bool)
        assert row["requests"] == int((r["step"] == st["index"]).sum())
        assert row["p50_ms"] == pytest.approx(np.percentile(r["latency_ms"][m], 50), abs=0.05)  # rounded to 0.1


# -- the analysis alone, on windows whose trends are known by construction ---------------------
def windows(rss, fds=None, threads=None, p50=None, qps=None, window=60.0):
    n = len(rss)
    out = []
    for i in range(n):
        srv = {"rss_mb": rss[i], "fds": (fds or [20.0] * n)[i], "threads": (threads or [8.0] * n)[i]}
        out.append({"index": i, "users": 4, "t_lo": 1000.0 + i * window, "t_hi": 1000.0 + (i + 1) * window,
                    "window_s": window, "qps": (qps or [100.0] * n)[i], "p50_ms": (p50 or [20.0] * n)[i],
                    "p99_ms": 40.0, "errors": {}, "error_rate": 0.0, "server": {"srv": srv}})
    return out


def findings_of(steps, hosts=None):
    summary = {"steps": steps, "hosts": hosts or {"srv": {"memory_total_kb": 4 * 1024 * 1024}}}
    summary["soak"] = soak_section(summary, {"load": {"mode": "soak", "users": 4, "duration": 600, "window": 60}})
    return summary, soak_findings(summary)


def test_soak_trends_find_what_was_built_in_and_nothing_else():
    rng = np.random.default_rng(1)
    noise = lambda n, s: list(rng.normal(0, s, n))  # noqa: E731
    n = 12
    steady = windows([500 + x for x in noise(n, 2)], p50=[20 + x for x in noise(n, 0.5)],
                     qps=[100 + x for x in noise(n, 1)])
    assert findings_of(steady)[1] == []
    leak = windows([500 + 0.5 * 60 * i + x for i, x in enumerate(noise(n, 2))])  # 0.5 MB/s
    summary, found = findings_of(leak)
    (f,) = found
    assert f["id"] == "memory_growth" and f["evidence"]["slope_mb_per_s"] == pytest.approx(0.5, rel=0.05)
    last = summary["soak"]["series"]["t"][-1]
    assert f["evidence"]["hours_to_limit"] == pytest.approx((4096 - (500 + 0.5 * last)) / 0.5 / 3600, rel=0.05)
    grow = windows([500.0] * n, fds=[20.0 + 3 * i for i in range(n)], threads=[8.0 + i for i in range(n)])
    assert {f["id"] for f in findings_of(grow)[1]} == {"fd_growth", "thread_growth"}
    few = windows([500.0] * n, fds=[20.0] * 6 + [21.0] * 6)  # one more connection: below FD_MIN_GROWTH
    assert findings_of(few)[1] == []
    slow = windows([500.0] * n, p50=[20.0 + 2 * i for i in range(n)], qps=[100.0 - 2 * i for i in range(n)])
    assert {f["id"] for f in findings_of(slow)[1]} == {"latency_drift", "throughput_decay"}


# -- bad plans: one line, exit 2, no run directory -----------------------------------------------
@pytest.mark.parametrize("load, message", [
    ({"mode": "soak", "duration": 60}, "needs load.users"),
    ({"mode": "soak", "users": 4, "rate": 10.0, "duration": 60}, "needs load.users"),
    ({"mode": "soak", "arrivals": "open", "users": 4, "duration": 60}, "needs load.rate"),
    ({"mode": "soak", "arrivals": "open", "rate": 2.5, "source_rate": 2.0, "duration": 60, "window": 10},
     "multiple of load.source_rate"),
    ({"mode": "soak", "users": 4, "duration": 50, "window": 10}, "at least 6"),
    ({"mode": "soak", "users": 4, "duration": 65, "window": 10}, "whole number of windows"),
    ({"mode": "soak", "users": 4}, "needs load.duration"),
    ({"mode": "soak", "users": 4, "duration": 60, "window": 10, "hold": "auto"}, "hold = \"auto\""),
    ({"mode": "soak", "users": 4, "duration": 60, "window": 10, "settle": 10}, "settle"),
    ({"users": 4}, "load.users is a soak key"),
    ({"duration": 60}, "load.duration is a soak key"),
])
def test_soak_plan_rejects(load, message):
    with pytest.raises(PlanError, match=None) as e:
        plan_from_dict({"target": "http://127.0.0.1:1", "load": load})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_soak_plan_resolves_windows_and_reads_back():
    plan = plan_from_dict({"target": "http://x:1", "load": {"mode": "soak", "arrivals": "open", "rate": 20,
                                                            "duration": 600, "window": 60}})
    assert plan.load.steps == [20] * 10 and plan.load.hold == 60.0  # 20 sources of 1 req/s, one step per window
    again = plan_from_dict(plan.to_dict())
    assert (again.load.steps, again.load.hold, again.load.rate) == ([20] * 10, 60.0, 20.0)
    closed = plan_from_dict({"target": "http://x:1", "load": {"mode": "soak", "users": 3, "duration": 360}})
    assert closed.load.steps == [3] * 6 and closed.load.window == 60.0  # the default window


def test_soak_bad_plan_on_the_command_line(tmp_path):
    plan = tmp_path / "bad.toml"
    plan.write_text('target = "http://127.0.0.1:1"\n[load]\nmode = "soak"\nusers = 2\nduration = 10\nwindow = 4\n')
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "whole number of windows" in res.stderr and not (tmp_path / "runs").exists()


def test_target_help_names_the_soak_faults():
    out = subprocess.run([sys.executable, "-m", "kneeswarm.target", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "--leak-kb-per-request" in out and "--drift-ms-per-min" in out
    assert "--leak-fd-every" in out and "--leak-thread-every" in out


@pytest.mark.long
def test_demo_soak_runs_end_to_end(tmp_path):
    """`kneeswarm demo --soak`: the bundled target held at 2 users in 6 windows; the report is a soak's.
    Windows of 2.5 s, the shortest over the demo's settle of 2 s (a soak's settle must be shorter)."""
    res = run_cli("demo", "--soak", "15", "--window", "2.5", "--users", "2", "--out", str(tmp_path), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "window 6/6: 2 users" in res.stderr  # the progress counts windows
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = read_summary(run)
    assert summary["soak"]["windows"] == 6 and [s["users"] for s in summary["steps"]] == [2] * 6
    assert summary["knee"]["method"] == "none" and "### Capacity plan" not in (run / "report" / "summary.md").read_text()
