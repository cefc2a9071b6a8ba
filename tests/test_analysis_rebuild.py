"""`kneeswarm analyze` on a run whose controller died before parsing: the server metrics are
rebuilt from the real pidstat/vmstat output in hosts/<host>/raw/, on the master's clock."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kneeswarm import analysis
from kneeswarm.collectors import get
from conftest import run_cli
from kneeswarm.contracts.plan import AnalysisPlan, LoadPlan, Plan
from kneeswarm.contracts.rundir import RunDir

FIXTURES = Path(__file__).parent / "fixtures" / "collectors"
OFFSET = 100.0  # the host's clock runs this many seconds ahead of the master's (as recorded in meta.json)
RECORD_S = 7  # seconds of real pidstat/vmstat output
RAMP, HOLD, SETTLE = 0.5, 2.5, 0.5


def record_raw(raw: Path, seconds: int) -> tuple[float, float, int]:
    """Run the collectors' own pidstat and vmstat commands for ``seconds`` seconds on a sleeping
    child, writing raw/pidstat.txt and raw/vmstat.txt; (start, end, pid) on this machine's clock."""
    raw.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs = []
    try:
        start = time.time()
        for name, pid in (("pidstat", child.pid), ("vmstat", None)):
            argv, env = get(name).command(pid, 1)
            out = (raw / get(name).raw_file).open("w")
            procs.append((subprocess.Popen(argv + [str(seconds)], stdout=out, env=env), out))
        for p, out in procs:
            p.wait(timeout=seconds + 10)
            out.close()
        return start, time.time(), child.pid
    finally:
        for p, _ in procs:
            p.kill()
        child.kill()
        child.wait()


def clock_entry(offset: float, t: float) -> dict:
    """meta.json["hosts"][label]["clock"] as the agents record it (kneeswarm.collectors.correction)."""
    side = {"offset": offset, "error": 1e-4, "rtt_min": 2e-4, "rtt_median": 3e-4, "rounds": 8, "kept": 4, "t": t}
    return {"before": side, "after": None, "drift_ppm": None}


def killed_run(tmp_path: Path) -> tuple[RunDir, float]:
    """A run directory as a controller killed mid-run leaves it: raw files, no parsed CSVs."""
    rd = RunDir.create(tmp_path, "killed")
    start, end, pid = record_raw(rd.raw_dir("local"), RECORD_S)
    plan = Plan(load=LoadPlan(steps=[1, 2, 4], ramp=RAMP, hold=HOLD, settle=SETTLE),
                analysis=AnalysisPlan(min_requests=0))
    rd.plan_path.write_text(plan.to_toml())
    t0 = start - OFFSET + 1.0  # the master's clock
    step = RAMP + HOLD
    rd.write_steps([[0, 1, t0, t0 + RAMP, t0 + step], [1, 2, t0 + step, t0 + step + RAMP, t0 + 2 * step],
                    [2, 4, t0 + 2 * step, "", ""]])  # killed during step 2's ramp
    rd.raw_dir("remote-1").mkdir(parents=True)  # a recorded host with no clock offset in meta.json
    shutil.copy(FIXTURES / "vmstat-procps-4.0.2.txt", rd.raw_dir("remote-1") / "vmstat.txt")
    rd.update_meta(run_id=rd.path.name, complete=False, ended="running",
                   hosts={"local": {"pid": pid, "clock": clock_entry(OFFSET, t0)}, "remote-1": {}, "ghost": {}})
    return rd, start


def window_mean(df: pd.DataFrame, col: str, lo: float, hi: float) -> float:
    t = df["t"].to_numpy(dtype=float)
    return float(np.mean(df[col].to_numpy(dtype=float)[(t >= lo) & (t < hi)]))


@pytest.mark.slow
def test_analyze_rebuilds_server_metrics_from_raw(tmp_path):
    rd, start = killed_run(tmp_path)
    assert not list(rd.host_dir("local").glob("*.csv"))
    s = analysis.analyze(rd.path)

    vm = pd.read_csv(rd.host_dir("local") / "vmstat.csv")
    pr = pd.read_csv(rd.host_dir("local") / "process.csv")
    assert len(vm) >= RECORD_S - 1 and len(pr) >= RECORD_S - 2
    # on the master's clock: the host's times less the recorded offset
    assert start - OFFSET - 1.0 <= vm["t"].min() and vm["t"].max() <= start - OFFSET + RECORD_S + 2.0
    steps = pd.read_csv(rd.steps_path)
    for i in (0, 1):
        lo, hi = steps["t_steady"][i] + SETTLE, steps["t_end"][i]
        srv = s["steps"][i]["server"]["local"]
        for col in ("us", "sy", "cs", "r"):
            assert srv[col] == pytest.approx(window_mean(vm, col, lo, hi), rel=1e-9, abs=1e-12), col
        for col in ("cpu_pct", "rss_mb", "threads"):
            assert srv[col] == pytest.approx(window_mean(pr, col, lo, hi), rel=1e-9, abs=1e-12), col

    assert s["complete"] is False
    w = s["warnings"]
    assert w[0].startswith('meta.json still says "ended": "running"')
    for line in ("local: parsed CSVs were missing; analysis rebuilt them from raw/",
                 "remote-1: parsed CSVs were missing; analysis rebuilt them from raw/",
                 "remote-1: uncorrected clock: no measured clock offset in meta.json; its samples keep the "
                 "host's own times",
                 "step 2 (4 users) has no recorded end: its window was cut where the next step began or at the "
                 "last request's completion",
                 "no request parts (requests/part-*.parquet): no request was recorded",
                 "ghost: no host data (no parsed CSVs under hosts/ghost/)"):
        assert line in w, line
    assert not any(x.startswith("local: uncorrected clock") for x in w)
    assert (rd.host_dir("remote-1") / "vmstat.csv").exists()
    assert s["hosts"]["local"]["parse"]["vmstat"]["lines"] > 0

    done = run_cli("analyze", str(rd.path), timeout=120)  # the real console command, again
    # the report is written, and the exit code says the load never completed (ended: running)
    assert done.returncode == 1 and "the load did not complete" in done.stderr, done.stderr
    assert (rd.report_dir / "index.html").is_file()
    assert "analysis rebuilt them from raw/" not in done.stdout  # parsed once; now read as they are
    assert "the controller was killed" in done.stdout


def test_analyze_rebuilds_from_recorded_fixtures_on_the_master_clock(tmp_path):
    """The same without running anything: real recorded vmstat and pidstat output copied into raw/."""
    from kneeswarm.collectors import parse_raw

    rd = RunDir.create(tmp_path, "fixtures")
    rd.plan_path.write_text(Plan(load=LoadPlan(steps=[1, 2], ramp=RAMP, hold=HOLD, settle=SETTLE)).to_toml())
    raw = rd.raw_dir("local")
    raw.mkdir(parents=True)
    shutil.copy(FIXTURES / "vmstat-procps-4.0.2.txt", raw / "vmstat.txt")
    shutil.copy(FIXTURES / "pidstat-12.6.1-t.txt", raw / "pidstat.txt")
    host_t = parse_raw("vmstat", (raw / "vmstat.txt").read_text()).frames["vmstat"]["t"]
    t0 = float(host_t.iloc[0]) - OFFSET  # the master's clock
    span = (float(host_t.iloc[-1]) - float(host_t.iloc[0])) / 2
    rd.write_steps([[0, 1, t0, t0 + RAMP, t0 + span], [1, 2, t0 + span, t0 + span + RAMP, t0 + 2 * span]])
    rd.update_meta(run_id=rd.path.name, complete=True, ended="completed",
                   hosts={"local": {"clock": clock_entry(OFFSET, t0)}})
    s = analysis.analyze(rd.path)
    vm = pd.read_csv(rd.host_dir("local") / "vmstat.csv")
    assert vm["t"].iloc[0] == pytest.approx(t0)  # host time less the offset in meta.json
    for i, (lo, hi) in enumerate(((t0 + RAMP + SETTLE, t0 + span), (t0 + span + RAMP + SETTLE, t0 + 2 * span))):
        srv = s["steps"][i]["server"]["local"]
        for col in ("us", "sy", "cs", "r"):
            assert srv[col] == pytest.approx(window_mean(vm, col, lo, hi), rel=1e-9, abs=1e-12), col
    assert "local: parsed CSVs were missing; analysis rebuilt them from raw/" in s["warnings"]
    assert s["complete"] is True  # rebuilt, nothing lost
