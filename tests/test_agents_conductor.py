"""The conductor with host agents that fail after the start: the run goes on, the final fetch
still happens, and meta.json["warnings"] says what went wrong (a real Locust run, in process)."""

from __future__ import annotations

import pytest

from kneeswarm.agents import AgentError
from kneeswarm.agents import host as host_mod
from kneeswarm.launch import lifecycle as lifecycle_mod
from kneeswarm.launch.conductor import Conductor
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.planfile import load_plan

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_agent_failures_after_start_are_warnings_not_the_end(start_demo_target, tmp_path, monkeypatch):
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    real_fetch, real_stop = host_mod.HostAgent.fetch, host_mod.HostAgent.stop
    calls = {"fetch": 0, "final": 0}

    def fetch(self, final=False):
        if final:
            calls["final"] += 1
            return real_fetch(self, final=True)
        calls["fetch"] += 1
        if calls["fetch"] % 2:
            raise RuntimeError("disk on fire")  # not even an AgentError: the conductor must survive it
        raise AgentError(f"{self.label}: SSH dropped")

    def stop(self):
        real_stop(self)  # the agent really stops (nothing left running) ...
        raise AgentError(f"{self.label}: stop answered garbage")  # ... but says it failed

    monkeypatch.setattr(host_mod.HostAgent, "fetch", fetch)
    monkeypatch.setattr(host_mod.HostAgent, "stop", stop)
    monkeypatch.setattr(lifecycle_mod, "FETCH_PERIOD", 1.0)
    plan = load_plan(None, {"name": "flaky", "target": target.url, "load.steps": [1, 2], "load.hold": 3.0,
                            "load.ramp": 1.0, "load.settle": 0.0, "load.workers": 1,
                            "metrics_url": target.url + "/metrics"})
    plan.hosts = [HostPlan(name="local", pid=target.pid)]
    result = Conductor(plan, tmp_path, quiet=True).run()

    assert result.ended == "completed" and result.summary is not None
    meta = result.run.read_meta()
    assert meta["complete"] is True
    warnings = meta["warnings"]
    assert any(w.startswith("incremental fetch failed: disk on fire") for w in warnings), warnings
    assert "local: incremental fetch failed: SSH dropped" in warnings, warnings
    assert "local: stop failed: stop answered garbage" in warnings, warnings
    assert calls["fetch"] >= 2 and calls["final"] == 1  # the final fetch happened once (not retried in __exit__)
    h = meta["hosts"]["local"]
    assert h["fetch"]["verified"] is True
    vm = result.run.read_host_csv("local", "vmstat")
    steps = result.run.read_steps()
    assert vm["t"].max() >= steps["t_end"].max() - 1.5  # every second of the run came home at the end
    assert meta["target_metrics"]["ok"] >= 5  # the scraper ran through it all
