"""The web UI runs a gRPC plan: Chromium shows the protocol as a choice among every protocol, the
gRPC ones included; Start runs it against a real gRPC server, and the run's rows are what that
server served."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, answers_200, chromium_or_skip, chromium_page, wait_for
from kneeswarm.contracts.plan import PROTOCOLS
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.launch.conductor import free_port
from test_grpc_runs import GrpcServer

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_web_ui_in_chromium_runs_a_grpc_plan(tmp_path):
    browsers = chromium_or_skip()
    server = GrpcServer()
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "ui-grpc"\ntarget = "grpc://127.0.0.1:{server.port}"\nprotocol = "kserve-grpc"\n'
                    '[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 2.0\nsettle = 0.5\n'
                    '[request]\nmodel = "double"\ninput_name = "x"\nshape = [1, 8]\n[analysis]\nmin_requests = 10\n')
    port, out = free_port(), tmp_path / "runs"
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-port",
                           str(port), "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out)], cwd=tmp_path,
                          stdout=subprocess.DEVNULL, stderr=(tmp_path / "ui.log").open("w"), text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
        with chromium_page(browsers, base + "/", viewport={"width": 1400, "height": 1000}) as (_browser, page):
            protocol = page.locator("[name=kneeswarmProtocol]")
            protocol.wait_for(state="attached", timeout=30_000)
            assert protocol.input_value() == "kserve-grpc"  # the plan's, in the form's menu
            page.get_by_role("combobox").filter(has_text="kserve-grpc").click()
            options = page.get_by_role("option").all_inner_texts()
            assert set(PROTOCOLS) <= {o.strip() for o in options}, options
            page.keyboard.press("Escape")
            page.get_by_role("button", name="Start").click()
            page.locator("#kneeswarm-report-link").wait_for(timeout=120_000)
    finally:
        ui.terminate()
        ui.wait(timeout=60)
        lines = server.lines()
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    rows = RunDir(run_dir).read_requests()
    served = [line for line in lines if line.startswith("served ModelInfer")]
    assert len(rows) > 20 and rows["ok"].all() and (rows["status"] == 200).all()
    assert 0 <= len(served) - len(rows) <= 2  # the calls in flight at the stop (the web UI runs no preflight)
    assert RunDir(run_dir).read_meta()["ended"] == "completed"
