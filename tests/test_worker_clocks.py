"""Worker clocks: a Locust worker whose clock is 2.5 s ahead (libfaketime) still lands its
requests in the right steps, because the master measures and removes its offset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kneeswarm import cli, conductor
from kneeswarm.rundir import RunDir
from locustfiles.clocks import WorkerClocks

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SHIFT = 2.5
FAKE_ENV = ["env", f"LD_PRELOAD={LIBFAKETIME}", f"FAKETIME=+{SHIFT}s", "DONT_FAKE_MONOTONIC=1"]


def faketime_works() -> bool:
    if not Path(LIBFAKETIME).exists():
        return False
    out = subprocess.run([*FAKE_ENV, sys.executable, "-c", "import time; print(time.time())"],
                         capture_output=True, text=True, timeout=30)
    import time

    return out.returncode == 0 and abs(float(out.stdout) - time.time() - SHIFT) < 1.0


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


@pytest.mark.slow
@pytest.mark.skipif(not faketime_works(), reason="libfaketime (Debian faketime) missing or not working")
def test_shifted_worker_rows_land_in_their_steps(tmp_path, start_demo_target, monkeypatch):
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    monkeypatch.setattr(conductor, "WORKER_WRAPPER", FAKE_ENV)
    rc = cli.main(["run", "--target", target.url, "--steps", "1,2", "--hold", "4", "--ramp", "0.5",
                   "--settle", "0", "--workers", "1", "--pid", str(target.pid), "--out", str(tmp_path), "-q"])
    assert rc == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = RunDir(run_dir)
    meta = run.read_meta()
    offset = meta["worker_clocks"]["worker-0"]["offset_s"]
    assert abs(offset - SHIFT) < 0.02, meta["worker_clocks"]
    rows, steps = run.read_requests(), run.read_steps()
    assert len(rows) > 100
    for _, st in steps.iterrows():
        mine = rows[rows["step"] == st["index"]]
        assert len(mine) > 0
        # Without the correction the rows would start 2.5 s late and spill past the step's end.
        assert mine["t_start"].max() <= st["t_end"] + 0.05
        assert mine["t_start"].min() >= st["t_ramp"] - 0.05
    gen = run.read_generator()["worker-0"]
    assert gen["t"].max() <= steps["t_end"].max() + 1.5
    assert json.loads((run_dir / "generator" / "clocks.json").read_text())["worker-0"]["offset_s"] == offset
