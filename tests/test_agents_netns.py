"""The server in its own network namespace: the link goes down for 10 s mid-run; nothing is lost.

The test creates a namespace and a veth pair (ip netns, iproute2), runs a real sshd inside it,
and always removes both.  Skipped where namespaces cannot be created (not root, no iproute2).
"""

from __future__ import annotations

import json
import os
import time

import pandas as pd
import pytest

from kneeswarm.agents import AgentSettings, open_agent
from kneeswarm.agents import heartbeat as heartbeat_mod
from kneeswarm.agents import link as link_mod
from kneeswarm.agents import ssh as ssh_mod
from kneeswarm.contracts.plan import HostPlan
from kneeswarm.contracts.rundir import RunDir

from conftest import ip, skip_without_netns

try:
    from sshd_fixture import SSHD, start_busy, stop_proc
except ImportError:  # tests/ imported as a package
    from tests.sshd_fixture import SSHD, start_busy, stop_proc

LINK_DOWN = 10.0


@pytest.fixture
def netns():
    skip_without_netns()
    tag = f"{os.getpid() % 10000}"
    ns, veth_host, veth_ns = f"ksw-{tag}", f"kswh{tag}", f"kswn{tag}"
    subnet = 200 + os.getpid() % 50
    host_ip, ns_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    try:
        r = ip("netns", "add", ns, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
        ip("link", "add", veth_host, "type", "veth", "peer", "name", veth_ns)
        ip("link", "set", veth_ns, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", veth_host)
        ip("link", "set", veth_host, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", veth_ns)
        ip("netns", "exec", ns, "ip", "link", "set", veth_ns, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield {"ns": ns, "veth": veth_host, "ip": ns_ip}
    finally:
        ip("link", "del", veth_host, check=False)
        ip("netns", "del", ns, check=False)


@pytest.mark.long
def test_link_down_for_10s_mid_run_loses_no_sample(netns, tmp_path, monkeypatch):
    monkeypatch.setattr(ssh_mod, "SFTP_TIMEOUT", 3.0)
    monkeypatch.setattr(ssh_mod, "CONNECT_TIMEOUT", 3.0)
    monkeypatch.setattr(ssh_mod, "BANNER_TIMEOUT", 5.0)
    monkeypatch.setattr(heartbeat_mod, "HEARTBEAT_PERIOD", 1.0)
    monkeypatch.setattr(heartbeat_mod, "WATCH_REPLY_TIMEOUT", 3.0)
    monkeypatch.setattr(link_mod, "RECONNECT_BACKOFF", (0.5, 1.0, 2.0))
    monkeypatch.setattr(link_mod, "RECONNECT_WINDOW", 4.0)
    server = SSHD.start(tmp_path / "sshd", listen=netns["ip"], netns=netns["ns"])
    busy = start_busy()
    kh = server.write_known_hosts(tmp_path / "known_hosts")
    run = RunDir.create(tmp_path, "netns")
    plan = HostPlan(name="srv", ssh=server.target, key_file=str(server.user_key), known_hosts=str(kh), pid=busy.pid,
                    collectors=["vmstat", "procfs", "pidstat"])
    try:
        with open_agent(plan, run, AgentSettings(interval=1, max_duration=120, heartbeat_timeout=30)) as agent:
            agent.preflight()
            agent.start()
            t_start = time.time()
            time.sleep(3.0)
            agent.fetch()
            ip("link", "set", netns["veth"], "down")
            down_at = time.monotonic()
            try:
                time.sleep(2.0)
                assert agent.fetch() == {}  # postponed (after RECONNECT_WINDOW of retries), not fatal
                time.sleep(max(0.0, LINK_DOWN - (time.monotonic() - down_at)))
            finally:
                ip("link", "set", netns["veth"], "up")
            time.sleep(3.0)
            t_stop = time.time()  # when the stop is asked: samples run until then (stop() itself takes a round trip)
            agent.stop()
            agent.fetch(final=True)
            assert agent.fetch_info["verified"]
            agent.write_parsed()
    finally:
        stop_proc(busy)
        server.stop()
    lines = (run.raw_dir("srv") / "procfs.jsonl").read_text().splitlines()
    ts = sorted(float(json.loads(line)["t"]) for line in lines)
    assert ts[0] < t_start + 1.5 and ts[-1] > t_stop - 2.0
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert max(gaps) < 1.5, gaps  # every second is there, through the outage
    vm = pd.read_csv(run.host_dir("srv") / "vmstat.csv")
    assert vm["t"].diff().dropna().max() < 1.5 and len(vm) >= int(t_stop - t_start) - 2
