"""Triton's Python backend watched as the service's process tree: each model instance is a stub
process (triton_python_backend_stub), a child of tritonserver, and does the work; a real
`kneeswarm run` monitoring the server by its port must follow the stubs.

The server: the tritonserver that nvidia-pytriton bundles, started here directly on a model
repository of one Python-backend model (triton_cpu_model.py, ~20 ms of real CPU per request) of
INSTANCES instances, no batching: on this machine's 2 cores the CPUs fill before the instances
do.  The truth is the kernel's: utime + stime of tritonserver and every stub, read by the test
from /proc before, during and after the run (tests/treetruth.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import kneeswarm_run, plan_text, record_tree
from servers import Installed, Server, free_port, pytriton
from tests.treetruth import TreeCPU, check_tree_run, marked

SERVER_INSTALL = pytriton  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

INSTANCES = 4
STEPS = (1, 2, 4, 8)
HOLD_S = 8.0
STUB = "triton_python_backend_stub"
CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "x", data_type: TYPE_FP32, dims: [ -1, -1 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ -1, -1 ] } ]
instance_group [ { count: %d, kind: KIND_CPU } ]
"""


def python_backend(tr: Installed, home: Path) -> tuple[Path, Path, dict[str, str]]:
    """(tritonserver, its backend directory, its environment): the python backend pytriton bundles
    with the stub built for this Python (3.11, the venv's; pytriton copies it in the same way), the
    venv's bin first on PATH so that the stubs' embedded Python finds the venv (numpy)."""
    site = tr.home / "venv" / "lib" / "python3.11" / "site-packages"
    dist = site / "pytriton" / "tritonserver"
    backend = home / "backends" / "python"
    backend.mkdir(parents=True)
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy(dist / "backends" / "python" / f, backend / f)
    shutil.copy(dist / "python_backend_stubs" / "3.11" / STUB, backend / STUB)
    env = {"PATH": f"{tr.home / 'venv' / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
           "HOME": str(home)}
    return dist / "bin" / "tritonserver", home / "backends", env


def test_the_servers_tree_is_its_stubs_and_holds_the_kernels_cpu(tmp_path):
    tr = pytriton()
    home = tmp_path / "triton"
    model = home / "models" / "spin"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG % INSTANCES)
    shutil.copy(Path(__file__).with_name("triton_cpu_model.py"), model / "1" / "model.py")
    binary, backends, env = python_backend(tr, home)
    port, grpc, mport = free_port(), free_port(), free_port()
    server = Server([str(binary), "--model-repository", str(home / "models"), "--backend-directory", str(backends),
                     "--http-address", "127.0.0.1", "--http-port", str(port), "--grpc-address", "127.0.0.1",
                     "--grpc-port", str(grpc), "--metrics-port", str(mport), "--allow-gpu-metrics", "false"],
                    f"http://127.0.0.1:{port}", "/v2/models/spin/ready", env=env, cwd=home)
    try:
        stubs = marked(server.pid, STUB)
        assert len(stubs) == INSTANCES and set(stubs.values()) == {server.pid}, stubs
        plan = plan_text("triton-tree", server.url, "kserve", f"http://127.0.0.1:{mport}/metrics", STEPS, HOLD_S,
                         'model = "spin"\ninput_name = "x"\nshape = [1, 8]\n')
        with TreeCPU(server.pid) as truth:  # the run finds tritonserver by the target's port
            run = kneeswarm_run(plan, home / "out")
    finally:
        server.stop()
    figures = check_tree_run(run.run_dir, truth, stubs)
    record_tree("triton-tree", f"Triton Python backend, {INSTANCES} stub processes, ~20 ms CPU a request",
                "tritonserver 2.51.0 (nvidia-pytriton 0.7.0)", "kserve (v2)", figures)
