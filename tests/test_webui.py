"""The Locust web UI path: `locust -f locustfiles/swarm.py` with the web UI, Start pressed over HTTP.

Each start of a swarm records to a new run directory under --kneeswarm-out, and
`kneeswarm analyze` reports it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from kneeswarm.conductor import free_port
from kneeswarm.rundir import RunDir

from conftest import REPO, read_summary, run_cli, wait_for

pytestmark = pytest.mark.slow


def test_web_ui_start_records_a_run(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "ui"\n[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 3.0\nsettle = 0.5\n')
    port = free_port()
    out = tmp_path / "runs"
    ui = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-host", "127.0.0.1",
         "--web-port", str(port), "--host", target.url, "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return requests.get(base + "/", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, 60, "the web UI")
        r = requests.post(base + "/swarm", data={"user_count": 1, "spawn_rate": 1, "host": target.url}, timeout=10)
        assert r.status_code == 200, r.text

        def finished() -> bool:
            runs = list(out.glob("*/steps.csv")) if out.exists() else []
            return bool(runs) and RunDir(runs[0].parent).read_steps()["t_end"].notna().sum() == 2

        wait_for(finished, 60, "both steps to finish")
        assert requests.get(base + "/stats/requests", timeout=5).json()["state"] in ("stopped", "stopping", "cleanup")
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    meta = RunDir(run_dir).read_meta()
    assert (run_dir / "plan.toml").exists() and meta["launcher"] == "locust"
    assert meta["ended"] == "completed" and meta["complete"] is True
    assert meta["lost"] == {} and meta["warnings"] == []  # written by the plugin itself: nothing lost
    res = run_cli("analyze", str(run_dir), timeout=120)
    assert res.returncode == 0, res.stderr
    s = read_summary(run_dir)
    assert s["complete"] is True
    assert [st["users"] for st in s["steps"]] == [1, 2]
    assert all(st["requests"] > 0 for st in s["steps"])
