"""docker-compose.yml: images cannot be pulled here, so the file is parsed and the exact commands
of its services run as plain processes on loopback (service names -> 127.0.0.1, the container's
paths -> this checkout and tmp_path, fixed ports -> free ones, the plan -> a short one)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
import requests

from kneeswarm.launch.conductor import free_port
from kneeswarm.contracts.rundir import RunDir

from conftest import REPO, answers_200, read_summary, wait_for

yaml = pytest.importorskip("yaml")

COMPOSE = REPO / "docker-compose.yml"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_names_the_services_and_keeps_the_web_ui_on_loopback():
    c = _compose()["services"]
    assert {"target", "master", "worker", "headless"} <= set(c)
    assert c["master"]["ports"] == ["127.0.0.1:8089:8089"]  # published on this machine only
    assert not any("5557" in str(p) for s in c.values() for p in s.get("ports", []))  # the master channel stays inside
    assert c["headless"]["profiles"] == ["headless"] and any(v.endswith(":/runs") for v in c["headless"]["volumes"])
    assert c["target"]["build"]["args"]["EXTRAS"] == "demo"  # only the target image has the demo's dependencies
    for name in ("master", "worker", "headless"):
        assert c[name]["command"][0] in ("kneeswarm", "locust")  # the same CLI as everywhere else
    assert "--kneeswarm-out" in c["master"]["command"] and "/runs" in c["master"]["command"]


def _local(argv: list[str], subs: dict[str, str]) -> list[str]:
    out = []
    for a in argv:
        for pattern, repl in subs.items():
            a = re.sub(pattern, repl, a)
        out.append(a)
    exe = {"kneeswarm": [sys.executable, "-m", "kneeswarm.launch.cli"], "locust": [sys.executable, "-m", "locust"]}
    return exe[out[0]] + out[1:]


def _spawn(argv: list[str], log) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, text=True)


@pytest.mark.slow
def test_compose_commands_run_as_plain_processes(tmp_path):
    services = _compose()["services"]
    target_port, master_port, web_port = free_port(), free_port(), free_port()
    plan = tmp_path / "plan.toml"
    text = (REPO / "compose" / "plan.toml").read_text()
    text = re.sub(r"steps = \[.*\]", "steps = [1, 2]", text)
    # hold 1.5 s: the test reads the files, steps and end of each run, not its figures
    text = re.sub(r"hold = .*", "hold = 1.5", text).replace("ramp = 2.0", "ramp = 0.5").replace("settle = 2.0", "settle = 0.5")
    plan.write_text(text)
    subs = {r"^0\.0\.0\.0$": "127.0.0.1", r"^8000$": str(target_port), r"^5557$": str(master_port),
            r"^8089$": str(web_port), r"^master:5557$": f"127.0.0.1:{master_port}",
            r"^/app/compose/plan\.toml$": str(plan), r"^/app/": str(REPO) + "/", r"^/runs$": str(tmp_path / "runs"),
            r"^--mode$": "--mode", r"^onnx$": "knee"}  # the knee target: no ONNX model to build on 2 cores
    # the plan names the service `target`: here it is on loopback
    plan.write_text(plan.read_text().replace("http://target:8000", f"http://127.0.0.1:{target_port}"))
    procs = []
    try:
        tlog = (tmp_path / "target.log").open("w")
        procs.append(_spawn(_local(services["target"]["command"], subs), tlog))
        wait_for(lambda: answers_200(f"http://127.0.0.1:{target_port}/v2/health/ready"), 60, "the target")
        procs.append(_spawn(_local(services["master"]["command"], subs), (tmp_path / "master.log").open("w")))
        procs.append(_spawn(_local(services["worker"]["command"], subs), (tmp_path / "worker.log").open("w")))
        base = f"http://127.0.0.1:{web_port}"
        wait_for(lambda: answers_200(base + "/") and requests.get(base + "/stats/requests", timeout=2).json()["workers"], 60,
                 "the web UI with its worker")
        r = requests.post(base + "/swarm", data={"user_count": 1, "spawn_rate": 1}, timeout=10)
        assert r.json()["success"], r.text
        # the headless profile's run goes at the same time, against the same target, into the same runs/
        headless = subprocess.Popen(_local(services["headless"]["command"], subs), env={**os.environ, "PYTHONPATH": str(REPO)},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(headless)
        _, headless_err = headless.communicate(timeout=240)
        assert headless.returncode == 0, headless_err[-2000:]
        wait_for(lambda: len(list((tmp_path / "runs").glob("*/report/index.html"))) == 2, 120,
                 "the web UI run's report (and the headless run's)")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert len(runs) == 2  # the web UI's run and the headless profile's, both in the mounted directory
    for run_dir in runs:
        assert (run_dir / "report" / "index.html").is_file()
        assert (run_dir / "hosts" / "target" / "prometheus.csv").is_file()  # the plan's metrics_url, scraped
        assert [st["users"] for st in read_summary(run_dir)["steps"]] == [1, 2]
        assert RunDir(run_dir).read_meta()["ended"] == "completed"
