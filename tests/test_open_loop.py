"""Open loop against a target that stalls 1 s every 4 s: coordinated omission, shown.

A closed loop sends its next request only after the last one answered, so a stall silences the
samples that would have seen it; arrivals on a schedule, timed from their intended send time,
do not.  Real target process (knee mode, stall windows on its own clock), real Locust processes
(local runner, kneeswarm's own locustfile); P99 by numpy on the request rows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kneeswarm.plan import PlanError, plan_from_dict
from kneeswarm.rundir import RunDir

from conftest import REPO

STALL = ["--mode", "knee", "--slots", "64", "--service-ms", "5", "--stall-ms", "1000", "--stall-every", "4"]


def start_local(tmp_path: Path, url: str, name: str, load: str) -> tuple[subprocess.Popen, Path]:
    """A real Locust process (local runner, kneeswarm's locustfile) started on a plan of ``load``."""
    plan = tmp_path / f"{name}.toml"
    plan.write_text(f'name = "{name}"\ntarget = "{url}"\n[load]\nramp = 0.5\nhold = 9.0\nsettle = 0.5\n{load}')
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--headless",
                             "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out), "--loglevel", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    return proc, out


def finished_run(proc: subprocess.Popen, out: Path) -> Path:
    _, err = proc.communicate(timeout=120)
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, err[-2000:]
    return runs[0]


@pytest.mark.slow
def test_open_loop_p99_shows_the_stall_that_closed_loop_hides(tmp_path):
    """The closed and the open loop side by side, against the same target, through the same stalls."""
    from kneeswarm.cli import start_target, stop_target

    proc, url = start_target(STALL)
    started = []
    try:
        started.append(start_local(tmp_path, url, "closed", "steps = [4]\n"))
        started.append(start_local(tmp_path, url, "open", 'mode = "open"\nrates = [40]\n'))
        closed, opened = (RunDir(finished_run(p, out)).read_requests() for p, out in started)
    finally:
        for p, _ in started:
            if p.poll() is None:
                p.kill()
                p.wait()
        stop_target(proc)
    p99_closed = float(np.percentile(closed["latency_ms"], 99))
    p99_open = float(np.percentile(opened["latency_ms"], 99))
    span = opened["t_start"].max() - opened["t_start"].min()
    rate = len(opened) / span
    print(f"stall 1 s every 4 s: closed loop (4 users) P99 {p99_closed:.1f} ms over {len(closed)} requests; "
          f"open loop (40 req/s, measured {rate:.1f}) P99 {p99_open:.1f} ms over {len(opened)} requests")
    assert closed["ok"].all() and opened["ok"].all()
    assert p99_open >= 900.0
    assert p99_closed < 0.5 * p99_open  # the closed loop understates the stall
    assert rate == pytest.approx(40.0, rel=0.2)  # arrivals kept their schedule through the stalls


@pytest.mark.parametrize("load, message", [
    ({"mode": "open"}, "open loop needs load.rates"),
    ({"mode": "open", "rates": [10, 5]}, "strictly increasing"),
    ({"mode": "open", "rates": [1.5], "source_rate": 1.0}, "multiple of load.source_rate"),
    ({"mode": "half-open"}, "load.mode must be 'closed' or 'open'"),
    ({"mode": "open", "rates": [2], "arrival": "bursty"}, "load.arrival must be"),
])
def test_bad_open_loop_plans_are_one_line(load, message):
    with pytest.raises(PlanError) as e:
        plan_from_dict({"load": load})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_open_loop_rates_become_arrival_sources():
    plan = plan_from_dict({"load": {"mode": "open", "rates": [5, 10, 40], "source_rate": 2.5}})
    assert plan.load.steps == [2, 4, 16]


@pytest.mark.slow
def test_with_two_workers_the_rate_is_split_not_multiplied(tmp_path):
    """Through the conductor (master + 2 workers): each step's measured arrival rate is the plan's."""
    from conftest import read_summary, run_cli
    from kneeswarm.cli import start_target, stop_target

    proc, url = start_target(["--mode", "knee", "--slots", "64", "--service-ms", "5"])
    try:
        plan = tmp_path / "plan.toml"
        plan.write_text(f'target = "{url}"\n[load]\nmode = "open"\nrates = [20, 60]\narrival = "constant"\nworkers = 2\n'
                        "ramp = 0.5\nhold = 5.0\nsettle = 1.0\n")
        res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), "-q")
    finally:
        stop_target(proc)
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    run = RunDir(run_dir)
    rows, steps = run.read_requests(), run.read_steps()
    assert set(rows["worker"]) == {"worker-0", "worker-1"}
    for rate, (_, step) in zip((20, 60), steps.iterrows()):
        window = rows[(rows.t_start >= step.t_steady + 1.0) & (rows.t_start < step.t_end)]
        measured = len(window) / (step.t_end - step.t_steady - 1.0)
        print(f"planned {rate} req/s, measured {measured:.1f} req/s over 2 workers")
        assert measured == pytest.approx(rate, rel=0.15)  # constant arrivals: only the window edges vary
    assert read_summary(run_dir)["complete"] is True
