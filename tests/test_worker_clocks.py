"""Worker clocks: a Locust worker whose clock is 2.5 s ahead (libfaketime) still lands its
requests in the right steps, because the master measures and removes its offset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kneeswarm.launch import cli, conductor
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.locustfiles.clocks import ClockGate, WorkerClocks
from kneeswarm.locustfiles.steps import DRAIN_FACTOR, DRAIN_MIN_S

SHAPE_TICK_S = 1.0  # Locust's shape worker calls tick() once a second (runners.shape_worker)
SHIFT = 2.5  # seconds the worker's clock runs ahead (libfaketime, the shifted_clock fixture)


def test_offset_from_round_trips_keeps_the_fastest():
    clocks = WorkerClocks()
    assert clocks.offset("w") == 0.0
    import time

    now = time.time()
    clocks.answered("w", {"t1": now - 0.010, "t2": now + 2.0})  # slow trip
    clocks.answered("w", {"t1": now - 0.001, "t2": now + 2.5 - 0.0005})  # fast trip: trusted
    clocks.answered("w", {"t1": "garbage"})
    assert abs(clocks.offset("w") - 2.5) < 0.002
    s = clocks.summary()["w"]
    assert s["samples"] == 2 and s["error_s"] < 0.002


def test_gate_holds_rows_until_the_first_answer_then_corrects_them():
    clocks, now = WorkerClocks(), [100.0]
    gate = ClockGate(clocks, wait=10.0, now=lambda: now[0])
    rows = {"t_start": [1002.5, 1003.5], "latency_ms": [1.0, 2.0]}
    gate.admit("worker-0", rows, [(1003.0, 50.0, 80.0, 1, 0.1)])
    assert gate.release() == [] and gate.held_rows == 2  # no answer yet: nothing written
    now[0] = 105.0
    assert gate.release() == []
    import time

    t = time.time()
    clocks.answered("worker-0", {"t1": t - 0.001, "t2": t + 2.5 - 0.0005})  # 2.5 s ahead
    gate.admit("worker-0", {"t_start": [1004.5], "latency_ms": [3.0]}, [])
    out = gate.release()
    assert [w for w, _, _ in out] == ["worker-0"] * 2
    starts = [t for _, r, _ in out for t in r["t_start"]]
    assert starts == pytest.approx([1000.0, 1001.0, 1002.0], abs=0.002)
    assert out[0][2][0][0] == pytest.approx(1000.5, abs=0.002) and out[0][2][0][1:] == (50.0, 80.0, 1, 0.1)
    assert out[0][1]["latency_ms"] == [1.0, 2.0]  # only times move
    assert gate.lost() == {} and gate.warnings() == []


def test_gate_lets_a_silent_workers_rows_through_uncorrected_and_counts_them():
    clocks, now = WorkerClocks(), [0.0]
    gate = ClockGate(clocks, wait=10.0, now=lambda: now[0])
    gate.admit("worker-1", {"t_start": [5.0, 6.0, 7.0]}, [(5.0, 1.0, 1.0, 1, 0.0)])
    now[0] = 9.9
    assert gate.release() == []
    now[0] = 10.0
    (batch,) = gate.release()
    assert batch[1]["t_start"] == [5.0, 6.0, 7.0]  # as the worker stamped them
    gate.admit("worker-1", {"t_start": [8.0]}, [])
    assert len(gate.release()) == 1  # still silent: no second wait
    gate.admit("worker-2", {"t_start": [9.0]}, [])
    assert gate.release() == [] and len(gate.release(final=True)) == 1  # the end lets everything go
    assert gate.lost() == {"uncorrected_request_rows": 5, "uncorrected_generator_rows": 1}
    (w1, w2) = gate.warnings()
    assert w1.startswith("worker-1: no clock answer within 10s; 4 request rows and 1 generator samples")
    assert w2.startswith("worker-2:")


@pytest.mark.slow
def test_shifted_worker_rows_land_in_their_steps(tmp_path, start_demo_target, monkeypatch, shifted_clock):
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    monkeypatch.setattr(conductor, "WORKER_WRAPPER", shifted_clock(SHIFT))
    # steps of 2.5 s (ramp + hold), the SHIFT of 2.5 s would put every uncorrected row of step 0
    # past its end; ~250 rows at 20 ms per request (> 100 asserted)
    rc = cli.main(["run", "--target", target.url, "--steps", "1,2", "--hold", "2", "--ramp", "0.5",
                   "--settle", "0", "--workers", "1", "--pid", str(target.pid), "--out", str(tmp_path), "-q"])
    assert rc == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = RunDir(run_dir)
    meta = run.read_meta()
    offset, error = meta["worker_clocks"]["worker-0"]["offset_s"], meta["worker_clocks"]["worker-0"]["error_s"]
    # within its own bound, half the best round trip's time (a few ms here; more when the worker and
    # the master wait for a core), both rounded to the us in meta.json
    assert abs(offset - SHIFT) <= error + 2e-6, meta["worker_clocks"]
    rows, steps = run.read_requests(), run.read_steps()
    assert len(rows) > 100
    # the last step's load goes on past its t_end until the requests in flight there complete (its
    # drain: DRAIN_FACTOR x the slowest request, at least DRAIN_MIN_S; the slowest of all rows here, so
    # at least the drain as applied), and it ends at the first tick of Locust's shape worker past the
    # drain (it ticks once a second), then the stop message reaches the worker (a quarter second
    # allowed on a loaded machine). Rows left 2.5 s late would still start past that.
    drain = max(DRAIN_MIN_S, DRAIN_FACTOR * rows["latency_ms"].max() / 1000.0)
    last_tail = drain + SHAPE_TICK_S + 0.25
    for _, st in steps.iterrows():
        mine = rows[rows["step"] == st["index"]]
        assert len(mine) > 0
        # Without the correction the rows would start 2.5 s late and spill past the step's end.
        tail = last_tail if st["index"] == steps["index"].max() else 0.0
        assert mine["t_start"].max() <= st["t_end"] + tail + 0.05 + error
        assert mine["t_start"].min() >= st["t_ramp"] - 0.05 - error
    gen = run.read_generator()["worker-0"]
    assert gen["t"].max() <= steps["t_end"].max() + 1.5
    assert json.loads((run_dir / "generator" / "clocks.json").read_text())["worker-0"]["offset_s"] == offset


def locustfile_with_silent_worker(tmp_path: Path, silent_s: float, wait_s: float | None = None) -> Path:
    """The real locustfile, but the worker's clock answers are unusable for its first ``silent_s``
    seconds (as if lost), so its first rows reach the master before any offset is known."""
    f = tmp_path / "swarm_silent_worker.py"
    f.write_text(
        "import time\n"
        "from kneeswarm.locustfiles import clocks\n"
        f"{'' if wait_s is None else f'clocks.FIRST_ANSWER_WAIT = {wait_s}'}\n"
        "_start, _pong = time.monotonic(), clocks.pong\n"
        f"clocks.pong = lambda data: _pong(data) if time.monotonic() - _start > {silent_s} else {{}}\n"
        "from kneeswarm.locustfiles.swarm import *  # noqa: F401,F403\n"
    )
    return f


def sequential(rows) -> bool:
    """One closed-loop user: each request starts after the one before it ended."""
    rows = rows.sort_values("t_start")
    t, lat = rows["t_start"].to_numpy(), rows["latency_ms"].to_numpy() / 1000.0
    return bool((t[1:] >= t[:-1] + lat[:-1] - 0.002).all())


@pytest.mark.long
@pytest.mark.slow
def test_rows_before_the_first_clock_answer_are_held_and_corrected(tmp_path, start_demo_target, monkeypatch,
                                                                   shifted_clock):
    """The shifted worker's answers are lost for its first 8 s, while it already sends rows:
    they wait for the offset, so the one user's requests stay one after another on the master's
    clock (written uncorrected, the first ones would overlap the later ones by 2.5 s)."""
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    monkeypatch.setattr(conductor, "WORKER_WRAPPER", shifted_clock(SHIFT))
    monkeypatch.setattr(conductor, "SWARM", locustfile_with_silent_worker(tmp_path, 8.0))
    out = tmp_path / "runs"
    rc = cli.main(["run", "--target", target.url, "--steps", "1,2", "--hold", "7", "--ramp", "0.5",
                   "--settle", "0", "--workers", "1", "--pid", str(target.pid), "--out", str(out), "-q"])
    assert rc == 0
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    run = RunDir(run_dir)
    meta, rows, steps = run.read_meta(), run.read_requests(), run.read_steps()
    assert abs(meta["worker_clocks"]["worker-0"]["offset_s"] - SHIFT) < 0.02
    one_user = rows[rows["t_start"] < steps["t_ramp"].iloc[1]]
    assert len(one_user) > 100 and sequential(one_user)
    assert not any(k.startswith("uncorrected") for k in meta.get("lost", {})), meta.get("lost")


@pytest.mark.long
@pytest.mark.slow
def test_rows_of_a_worker_that_never_answers_are_counted_uncorrected(tmp_path, start_demo_target, monkeypatch):
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    monkeypatch.setattr(conductor, "SWARM", locustfile_with_silent_worker(tmp_path, 1e9, wait_s=2.0))
    out = tmp_path / "runs"
    rc = cli.main(["run", "--target", target.url, "--steps", "1", "--hold", "4", "--ramp", "0.5",
                   "--settle", "0", "--workers", "1", "--pid", str(target.pid), "--out", str(out), "-q"])
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert rc == (0 if summary["complete"] else 1)  # 1 where analysis counts uncorrected rows as a loss
    run = RunDir(run_dir)
    meta, rows = run.read_meta(), run.read_requests()
    gen = run.read_generator()["worker-0"]
    assert len(rows) > 0 and "worker-0" not in (meta.get("worker_clocks") or {})
    assert meta["lost"]["uncorrected_request_rows"] == len(rows)
    assert meta["lost"]["uncorrected_generator_rows"] == len(gen)
    assert any(w.startswith("load generator: worker-0: no clock answer within 2s") for w in meta["warnings"])
