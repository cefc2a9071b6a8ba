"""Open loop against a target that stalls 1 s every 4 s: coordinated omission, shown.

A closed loop sends its next request only after the last one answered, so a stall silences the
samples that would have seen it; arrivals on a schedule, timed from their intended send time,
do not.  Real target process (knee mode, stall windows on its own clock), real Locust processes
(local runner, kneeswarm's own locustfile); P99 by numpy on the request rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.contracts.rundir import RunDir

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
    from kneeswarm.launch.cli import start_target, stop_target

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
    # every request answered; a failure names itself (one conn_reset in 412 rows failed this on CI:
    # the keep-alive race, now resent -- tests/test_server_shapes.py)
    failed = [f"{name}: {row['error']} (status {row['status']}, {row['latency_ms']:.0f} ms, t {row['t_start']:.2f})"
              for name, rows in (("closed", closed), ("open", opened)) for row in rows[~rows["ok"]].head(3).to_dict("records")]
    assert not failed, failed
    # The truth, from the target's settings: a request sent as a stall begins waits it out whole
    # (1000 ms, less one arrival gap of 25 ms at 40 req/s); the stalled quarter of the arrivals
    # waits 0..1000 ms evenly, so the top 1 % of all (the top 4 % of the stalled, a few requests
    # over two stalls in 9 s) sits near 900-975 ms by the phase of the schedule: above 750 always.
    assert float(opened["latency_ms"].max()) >= 1000.0 - 2 * 25.0
    assert p99_open >= 750.0
    assert p99_closed < 0.5 * p99_open  # the closed loop understates the stall
    assert rate == pytest.approx(40.0, rel=0.2)  # arrivals kept their schedule through the stalls


@pytest.mark.parametrize("load, message", [
    ({"mode": "open"}, "open loop needs load.rates"),
    ({"mode": "open", "rates": [10, 5]}, "strictly increasing"),
    ({"mode": "open", "rates": [1.5], "source_rate": 1.0}, "multiple of load.source_rate"),
    ({"mode": "half-open"}, "load.mode must be one of grid, search, soak"),
    ({"arrivals": "half-open"}, "load.arrivals must be 'closed' or 'open'"),
    ({"arrivals": "open", "rates": [10, 5]}, "strictly increasing"),
    ({"mode": "open", "rates": [2], "arrival": "bursty"}, "load.arrival must be"),
])
def test_bad_open_loop_plans_are_one_line(load, message):
    with pytest.raises(PlanError) as e:
        plan_from_dict({"load": load})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_open_loop_rates_become_arrival_sources():
    plan = plan_from_dict({"load": {"mode": "open", "rates": [5, 10, 40], "source_rate": 2.5}})
    assert plan.load.steps == [2, 4, 16]


@pytest.mark.long
@pytest.mark.slow
def test_with_two_workers_the_rate_is_split_not_multiplied(tmp_path):
    """Through the conductor (master + 2 workers): each step's measured arrival rate is the plan's."""
    from conftest import read_summary, run_cli
    from kneeswarm.launch.cli import start_target, stop_target

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


def test_arrivals_and_the_older_mode_spelling_give_the_same_open_loop():
    new = plan_from_dict({"load": {"arrivals": "open", "rates": [5, 10], "source_rate": 2.5}})
    old = plan_from_dict({"load": {"mode": "open", "rates": [5, 10], "source_rate": 2.5}})
    for plan in (new, old):
        assert (plan.load.mode, plan.load.arrivals, plan.load.steps) == ("grid", "open", [2, 4])


def target_arrivals(log: Path, t_lo: float, t_hi: float) -> int:
    """The requests the target's own log (--request-log) saw arrive in [t_lo, t_hi)."""
    times = [json.loads(line)["t"] for line in log.read_text().splitlines() if line.strip()]
    return sum(t_lo <= t < t_hi for t in times)


@pytest.mark.long
@pytest.mark.slow
def test_an_open_loop_step_sends_what_it_offers_and_reads_what_the_target_saw(start_demo_target, tmp_path):
    """Offered, sent and read agree, and a rerun draws new arrivals.  Two runs of 10/s (one source
    of 10/s) then 100/s (ten sources) against a 400/s knee target (8 slots of 20 ms).  Expected
    numbers: the target's request log (its own arrival times) over each step's window.

    Reported: one source offered 10/s read 7.0/s in every run -- its Poisson arrivals were drawn
    from the same seed each run (19 in the 2.8 s window, the 5th percentile of Poisson(28)), so a
    rerun replayed the unlucky sample instead of drawing another."""
    from test_findings_real import short_run

    gaps = []
    for i in range(2):
        log = tmp_path / f"requests-{i}.jsonl"
        target = start_demo_target("--mode", "knee", "--slots", "8", "--service-ms", "20", "--request-log", str(log))
        summary, run_dir = short_run(target, tmp_path, f"open{i}", [1, 10], **{
            "load.arrivals": "open", "load.rates": [10, 100], "load.source_rate": 10.0, "load.hold": 3.0})
        target.stop()
        one, ten = summary["steps"]
        seen = target_arrivals(log, ten["t_lo"], ten["t_hi"])
        offered = 100 * ten["window_s"]
        print(f"run {i}: offered {offered:.0f} in {ten['window_s']:.2f} s, the target saw {seen}, "
              f"the summary read {ten['requests']} (qps {ten['qps']:.1f}, errors {ten['errors']})")
        # sent = read: the window's edges move a request or two (sent at t, logged ~1 ms later)
        assert abs(ten["requests"] - seen) <= 2 + 0.02 * seen
        assert ten["qps"] * ten["window_s"] == pytest.approx(ten["requests"], abs=1)  # none failed, 4x headroom
        # offered = sent: Poisson, so the count is offered x window +- sqrt(offered x window); 3.5 sd
        assert abs(seen - offered) <= 3.5 * np.sqrt(offered)
        rows = RunDir(run_dir).read_requests()
        first = np.sort(rows[rows.users == 1]["t_start"].to_numpy())  # the one source's arrivals
        gaps.append(np.diff(first)[:10])
    # the one source's gaps between arrivals: a new Poisson draw per run, not the same sample replayed
    assert len(gaps[0]) == len(gaps[1]) == 10 and not np.allclose(gaps[0], gaps[1], atol=1e-3)
