"""TorchServe's Python workers watched as the service's process tree: a real `kneeswarm run`
monitoring the Java frontend by its pid must follow its worker processes, which do the work.

The model: WORKERS workers of a CPU-bound handler (torchserve_cpu_handler.py, ~20 ms of real CPU
per request), so on this machine's 2 cores the CPUs fill before the workers do.  The truth is the
kernel's: utime + stime of the frontend and every worker, read by the test from /proc before,
during and after the run (tests/treetruth.py), and the workers the test finds under the frontend.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from conftest import kneeswarm_run, plan_text, record_tree
from servers import torchserve, torchserve_server
from tests.treetruth import TreeCPU, check_tree_run, marked

SERVER_INSTALL = torchserve  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

WORKERS = 4
STEPS = (1, 2, 4, 8)
HOLD_S = 8.0
WORKER_MARK = "model_service_worker"  # TorchServe's Python worker: ts/model_service_worker.py


def test_the_frontends_tree_is_its_workers_and_holds_the_kernels_cpu(tmp_path):
    ts = torchserve()
    home = tmp_path / "torchserve"
    home.mkdir()
    server, mport = torchserve_server(ts, home, {"spin": Path(__file__).with_name("torchserve_cpu_handler.py")}, WORKERS)
    try:
        java = server.serving_pid("java")
        deadline = time.monotonic() + 240  # /ping is healthy before the workers are up (slow on a loaded host)
        while time.monotonic() < deadline and (len(marked(java, WORKER_MARK)) < WORKERS or not answers(server.url)):
            time.sleep(0.5)
        workers = marked(java, WORKER_MARK)
        assert len(workers) == WORKERS, workers
        plan = plan_text("torchserve-tree", server.url, "torchserve", f"http://127.0.0.1:{mport}/metrics", STEPS,
                         HOLD_S, 'model = "spin"\nshape = [1, 8]\n')
        with TreeCPU(java) as truth:
            run = kneeswarm_run(plan, home / "out", "--pid", str(java))
    finally:
        server.stop()
    figures = check_tree_run(run.run_dir, truth, workers)
    record_tree("torchserve-tree", f"TorchServe, {WORKERS} Python workers, ~20 ms CPU a request",
                ts.version, "torchserve", figures)


def answers(url: str) -> bool:
    """One prediction answered (a worker still loading may keep it past any short timeout)."""
    try:
        return requests.post(url + "/predictions/spin", json={"data": [1]}, timeout=60).status_code == 200
    except requests.RequestException:
        return False
