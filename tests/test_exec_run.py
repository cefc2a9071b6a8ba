"""`kneeswarm run` whose only monitored host is reached through the exec transport, into the
"containers" of tests/containers.py (unshare'd namespaces, no sshd): a busybox container (no
python3, no pidstat, no vmstat) reached by its debug container, and a container with python3
entered directly.  Every step has the server's figures (its process from the /proc sampler, its
cgroup's CPU seconds and throttling), the cgroup's CPU time stays within the half CPU the test's
quota allows (the kernel enforces it: an independent bound), the analysis bounds the service by that
quota, and nothing of the agent is left in the container.
"""

from __future__ import annotations

import math

import pytest
import tomli_w

from kneeswarm.contracts.rundir import RunDir

from conftest import read_summary, run_cli
from containers import PERIOD_US, QUOTA_US, Container, skip_without_namespaces, start_container, start_debug

pytestmark = [pytest.mark.slow, pytest.mark.long]

STEPS, HOLD, RAMP, SETTLE = [1, 4], 4.0, 1.0, 1.0
SERVER = ["--mode", "knee", "--slots", "4", "--service-ms", "5", "--cpu-work-per-inflight", "2"]
QUOTA_TOL = 0.1  # CPUs: cgroup_cpus over a step window against the quota (window edges, sampling)


def _plan(path, c: Container, prefix: list[str]) -> None:
    path.write_text(tomli_w.dumps({
        "name": "exec", "target": c.url,
        "load": {"steps": STEPS, "hold": HOLD, "ramp": RAMP, "settle": SETTLE, "workers": 1},
        "monitor": {"interval": 1},
        "hosts": [{"name": "ctr", "exec": prefix, "port": c.port}],
    }))


@pytest.mark.parametrize("python", [False, True], ids=["busybox-via-debug-container", "python-container"])
def test_a_run_monitors_the_container_through_exec(tmp_path, python):
    skip_without_namespaces()
    c = start_container(tmp_path, python, SERVER)
    try:
        prefix = c.prefix() if python else start_debug(c).prefix()
        _plan(tmp_path / "plan.toml", c, prefix)
        res = run_cli("run", str(tmp_path / "plan.toml"), "--out", str(tmp_path / "runs"), timeout=240)
        assert res.returncode == 0, res.stderr[-3000:]
        assert [cmd for _, cmd in c.processes() if "remote.pyz" in cmd] == []
        (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    finally:
        c.stop()
    meta = RunDir(run_dir).read_meta()
    host = meta["hosts"]["ctr"]
    assert host["transport"] == "exec" and host["complete"] and host["agent"]["kind"] == "python", host
    assert host["exec"].startswith("exec:nsenter -t ") and host["left_on_server"] is None
    steps = read_summary(run_dir)["steps"]
    assert [s["users"] for s in steps] == STEPS
    for s in steps:
        srv = s["server"]["ctr"]
        assert srv["cpu_pct"] is not None and math.isfinite(srv["cpu_pct"]) and srv["threads"] >= 1, srv
        assert srv["cgroup_cpus"] is not None and srv["throttled_share"] is not None, srv
        assert srv["cgroup_cpus"] <= QUOTA_US / PERIOD_US + QUOTA_TOL, srv
    # the analysis bounds the service by the container's quota, as the test wrote it (whether 4
    # users get throttled depends on what else the machine runs: not asserted)
    service = read_summary(run_dir)["hosts"]["ctr"]["service"]
    assert service["bound"] == "quota" and service["quota_cpus"] == QUOTA_US / PERIOD_US, service
    assert (run_dir / "report" / "index.html").is_file()
