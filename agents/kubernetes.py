"""``[[hosts]] kubernetes = {...}``: the kubectl command lines behind the exec transport.

    kubernetes = { namespace = "serving", pod = "triton-0", container = "server", context = "prod" }
        -> kubectl --context prod -n serving exec -i pod/triton-0 -c server -- ARGV...
    kubernetes = { namespace = "serving", selector = "app=triton", container = "server" }
        -> kubectl -n serving get pods -l app=triton -o json, then one host per running pod
    kubernetes = { ..., debug_image = "python:3.12-slim" }
        -> kubectl -n serving debug pod/triton-0 --target server --image python:3.12-slim
           --container kneeswarm-XXXXXX --profile general -- sh -c '...; exec sleep LIFETIME'
           then kubectl -n serving exec -i pod/triton-0 -c kneeswarm-XXXXXX -- ARGV...

The debug container is the way out for an image without a shell or python3 (distroless) or the
collectors' tools: an ephemeral container from ``debug_image`` that shares the server container's
process namespace (``--target``), so the agent runs there, finds the server in ``/proc`` and reads
its cgroup.  It lives at most ``lifetime`` seconds (the agent's own limit) and is stopped when
the transport closes; Kubernetes keeps a terminated ephemeral container in the pod's spec until
the pod goes (they cannot be removed), one per run.

kubectl parses these argvs itself: tests/test_kubernetes_argv.py runs them with a real kubectl
against a recording API server on loopback and reads the requests it made.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from kneeswarm.contracts.plan import HostPlan

from kneeswarm.agents.errors import AgentError, TransportError
from kneeswarm.agents.exec import ExecTransport

logger = logging.getLogger(__name__)

KUBECTL_TIMEOUT = 60.0  # seconds for one kubectl call that is not an exec (get pods, debug)
DEBUG_START_TIMEOUT = 180.0  # seconds for the debug container to run (its image pulled on the node)
DEBUG_POLL = 2.0  # seconds between checks that it runs
DEBUG_PROFILE = "general"  # kubectl debug's profile: SYS_PTRACE, so /proc/PID/io and fd of the server can be read
DEBUG_LIFETIME = 6 * 3600.0  # seconds a debug container lives when no lifetime is given
#: Where the debug container's shell writes its pid (its own file system), for the stop at close.
DEBUG_PIDFILE = "/tmp/kneeswarm-debug.pid"


@dataclass(frozen=True)
class KubernetesTarget:
    """A pod (or a selector's pods) and the container the server runs in."""

    namespace: str | None = None
    pod: str | None = None
    selector: str | None = None
    container: str | None = None
    context: str | None = None
    debug_image: str | None = None
    kubectl: str = "kubectl"

    @classmethod
    def from_plan(cls, host: HostPlan) -> KubernetesTarget:
        k = dict(host.kubernetes or {})
        return cls(**{f.name: k[f.name] for f in dataclasses.fields(cls) if f.name in k})

    # -- the command lines -----------------------------------------------------------------
    def base(self) -> list[str]:
        """kubectl with the context and namespace (global flags, before the verb)."""
        out = [self.kubectl]
        if self.context:
            out += ["--context", self.context]
        if self.namespace:
            out += ["-n", self.namespace]
        return out

    def exec_prefix(self, pod: str, container: str | None = None) -> list[str]:
        """``kubectl exec -i`` into ``container`` (default: the target's) of ``pod``, up to ``--``."""
        c = container or self.container
        return [*self.base(), "exec", "-i", f"pod/{pod}", *(["-c", c] if c else []), "--"]

    def list_argv(self) -> list[str]:
        return [*self.base(), "get", "pods", "-l", str(self.selector), "-o", "json"]

    def debug_argv(self, pod: str, name: str, lifetime: float) -> list[str]:
        """``kubectl debug``: an ephemeral container ``name`` from debug_image sharing the server
        container's process namespace, its shell sleeping ``lifetime`` seconds (its pid noted)."""
        script = f"echo $$ > {DEBUG_PIDFILE}; exec sleep {max(1, round(lifetime))}"
        return [*self.base(), "debug", f"pod/{pod}", "--image", str(self.debug_image),
                "--target", str(self.container), "--container", name, "--profile", DEBUG_PROFILE,
                "--quiet", "--", "sh", "-c", script]

    def where(self) -> str:
        ns = f" in namespace {self.namespace}" if self.namespace else ""
        ctx = f" (context {self.context})" if self.context else ""
        return f"{ns}{ctx}"

    # -- calls -----------------------------------------------------------------------------
    def kubectl_json(self, argv: list[str], what: str) -> Any:
        out = _kubectl(argv, what)
        try:
            return json.loads(out)
        except ValueError:
            raise AgentError(f"kubernetes: {what}: kubectl printed no JSON") from None

    def pods(self) -> list[str]:
        """The running pods the selector matches, by name (AgentError when none)."""
        data = self.kubectl_json(self.list_argv(), f"listing pods with selector {self.selector!r}")
        items = data.get("items") if isinstance(data, dict) else None
        names = sorted(
            str(p["metadata"]["name"]) for p in (items if isinstance(items, list) else [])
            if isinstance(p, dict) and (p.get("status") or {}).get("phase") == "Running"
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        )
        if not names:
            raise AgentError(f"kubernetes: selector {self.selector!r}{self.where()} matches no running pod")
        return names

    def transport(self, label: str, python: list[str] | None, lifetime: float | None = None) -> ExecTransport:
        """The exec transport into the pod (a debug container first where debug_image is set)."""
        if self.pod is None:
            raise AgentError(f"{label}: kubernetes selector {self.selector!r} not expanded into pods")
        if self.debug_image:
            return DebugTransport(self, self.pod, label, python, lifetime or DEBUG_LIFETIME)
        return ExecTransport(self.exec_prefix(self.pod), label, python)


def _kubectl(argv: list[str], what: str) -> bytes:
    """Run a kubectl command (not an exec) to completion; its stdout, or AgentError (one line)."""
    try:
        p = subprocess.run(argv, capture_output=True, timeout=KUBECTL_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise AgentError(f"kubernetes: {argv[0]} is not installed (needed for {what})") from None
    except subprocess.TimeoutExpired:
        raise TransportError(f"kubernetes: {what}: kubectl did not answer in {KUBECTL_TIMEOUT:g}s") from None
    if p.returncode != 0:
        lines = [ln.strip() for ln in p.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        raise AgentError(f"kubernetes: {what}: {lines[-1][:300] if lines else f'kubectl exit code {p.returncode}'}")
    return p.stdout


class DebugTransport(ExecTransport):
    """The exec transport into an ephemeral debug container of the pod, started on connect."""

    def __init__(self, target: KubernetesTarget, pod: str, label: str, python: list[str] | None, lifetime: float):
        self.target = target
        self.pod = pod
        self.lifetime = lifetime
        #: the ephemeral container's name (a DNS label; a new one per transport: they cannot be reused)
        self.debug_name = f"kneeswarm-{secrets.token_hex(3)}"
        self.created = False
        super().__init__(target.exec_prefix(pod, self.debug_name), label, python, connect=True)

    def connect(self) -> None:
        if not self.created:
            _kubectl(self.target.debug_argv(self.pod, self.debug_name, self.lifetime),
                     f"starting debug container {self.debug_name} in pod {self.pod}")
            self.created = True
            logger.info("%s: debug container %s (%s) started in pod %s", self.label, self.debug_name,
                        self.target.debug_image, self.pod)
        deadline = time.monotonic() + DEBUG_START_TIMEOUT
        while True:  # bounded: DEBUG_START_TIMEOUT (the image is pulled on the node first)
            try:
                super().connect()
                return
            except TransportError as e:
                if time.monotonic() + DEBUG_POLL > deadline:
                    raise TransportError(f"{self.label}: debug container {self.debug_name} did not run within "
                                         f"{DEBUG_START_TIMEOUT:g}s ({self.bare(e)})") from None
                time.sleep(DEBUG_POLL)

    def bare(self, e: BaseException) -> str:
        text = str(e)
        return text[len(self.label) + 2:] if text.startswith(f"{self.label}: ") else text

    def close(self) -> None:
        """Stop the debug container's shell (the container then ends; its record stays in the pod)."""
        if not self.created:
            return
        try:
            self.run(["sh", "-c", f"kill $(cat {DEBUG_PIDFILE})"], timeout=30)
        except AgentError as e:  # closing must never raise over the real error; it ends at its lifetime anyway
            logger.warning("%s: stopping debug container %s: %s", self.label, self.debug_name, e)


def expand_hosts(hosts: list[HostPlan]) -> list[HostPlan]:
    """Each ``kubernetes.selector`` host replaced by one host per running pod it matches, named by
    the pod (``NAME-POD`` where the host has a name); other hosts as they are."""
    out: list[HostPlan] = []
    for h in hosts:
        k = h.kubernetes
        if not k or "selector" not in k:
            out.append(h)
            continue
        for pod in KubernetesTarget.from_plan(h).pods():
            sugar = {key: v for key, v in k.items() if key != "selector"}
            out.append(dataclasses.replace(h, name=f"{h.name}-{pod}" if h.name else pod, kubernetes={**sugar, "pod": pod}))
    labels = [h.label for h in out]
    if dup := sorted({x for x in labels if labels.count(x) > 1}):
        raise AgentError(f"kubernetes: two hosts are called {dup[0]!r} (a pod matched twice?); give each a distinct name")
    return out
