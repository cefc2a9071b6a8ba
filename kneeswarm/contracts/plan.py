"""The plan: what to load, how hard, for how long, and what to watch (floor 1 contract).

The plan's tables as dataclasses, their defaults and what follows from them.  A plan is a TOML
file; command-line flags override it; kneeswarm.contracts.planfile reads and validates it
(``load_plan``).  ``Plan.to_toml`` writes the resolved plan into the run directory; secrets never
appear there, only the name of the environment variable.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import tomli_w

#: Seconds of controller silence after which a host agent stops everything: the plan's default
#: is the agent's own fallback (one number, in the agent's defaults, which the agent ships with).
from kneeswarm.agents.remote.defaults import DEFAULT_SCOPE, HEARTBEAT_TIMEOUT, SCOPES

logger = logging.getLogger(__name__)

#: Protocol names; the registry in locustfiles/protocols must list the same (a test checks it).
PROTOCOLS = ("kserve", "openai", "torchserve", "tfserving", "http", "kserve-grpc", "triton-stream", "torchserve-grpc")
#: the protocols spoken over gRPC: their target is grpc://host:port or grpcs://host:port
GRPC_PROTOCOLS = ("kserve-grpc", "triton-stream", "torchserve-grpc")
OPENAI_ENDPOINTS = ("chat", "completions")
TENSOR_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                    "FP16", "FP32", "FP64", "BYTES")
DEFAULT_STEPS = (1, 2, 4, 8, 16, 32)
#: ``[load] cooldown``: seconds between two repetitions.  What the last step left at the server
#: (the requests it queued, an open loop's backlog, connections closing) is served and gone before
#: the next repetition's first step, which would otherwise measure it: the knee target's queue at
#: 16 users over 4 slots of 50 ms empties in 0.2 s, a real server's batch of long generations takes
#: seconds; the previous run's own analysis adds a few more.
DEFAULT_COOLDOWN = 5.0


class PlanError(ValueError):
    """A plan that cannot be run; str() is the one-line message for the user."""


@dataclass
class LoadPlan:
    steps: list[int] = field(default_factory=lambda: list(DEFAULT_STEPS))
    ramp: float = 2.0  # seconds to go from the previous step's users to this step's
    hold: float | str = 20.0  # seconds each step is held after its ramp, or "auto": until steady and known
    ci: float = 0.10  # hold = "auto": QPS and P99 known within this relative half-width of a 95 % CI
    min_hold: float = 5.0  # hold = "auto": seconds each step is held at least
    max_hold: float = 60.0  # hold = "auto": seconds each step is held at most (then a reason in steps[].reasons)
    settle: float = 2.0  # seconds after the ramp excluded from the step's statistics
    workers: int = 0  # Locust worker processes; 0 = number of cores
    wait_ms: float = 0.0  # think time between a user's requests (closed loop)
    @property
    def auto_hold(self) -> bool:
        return self.hold == "auto"

    def hold_s(self) -> float:
        """The longest a step is held: ``hold``, or ``max_hold`` under ``hold = "auto"``."""
        return self.max_hold if self.auto_hold else float(self.hold)

    # -- the strategy: "grid" (the planned steps), "search" (probes as it goes), "soak" (one load held)
    mode: str = "grid"  # legacy "closed" / "open" still accepted: they set `arrivals` (grid)
    # -- open loop: arrivals on a schedule, latency from the intended send time ----------------
    arrivals: str = "closed"  # "closed" (steps are users) or "open" (steps are arrival rates)
    rates: list[float] | None = None  # open loop: requests/s per step, strictly increasing
    arrival: str = "poisson"  # open loop: "poisson" or "constant" inter-arrival times
    source_rate: float = 1.0  # open loop: requests/s of one arrival source (a Locust user)
    max_inflight: int = 1000  # open loop: in-flight cap per load-generator process (arrivals
    #                           beyond it are recorded as `dropped` failures)
    # -- mode = "search": the probes are chosen as the run goes, not guessed (kneeswarm/launch/search.py)
    start: float = 1.0  # search: the first probe (users; open loop: requests/s)
    max: float = 512.0  # search: never beyond this many users (open loop: requests/s)
    growth: float = 2.0  # search: each probe multiplies the last by this until one saturates
    precision: float = 0.10  # search: the knee is bracketed within max(1 user, precision x its users)
    max_duration: float = 1800.0  # search: seconds of load at most (the search stops there)
    # -- length x concurrency sweep (the knee moves with them): the plan once per [input, output] tokens shape
    shapes: list[list[int]] | None = None
    # -- repetition: the same plan run `repeat` times against the same server, one run directory
    #    each, `cooldown` seconds apart, and a merged result (kneeswarm.analysis.runs.repeat)
    repeat: int = 1
    cooldown: float = DEFAULT_COOLDOWN
    # -- soak (mode = "soak": leaks, drift): one load held for `duration`, one step per `window`
    users: int | None = None  # soak, closed loop: the users held
    rate: float | None = None  # soak, open loop: the arrival rate held, requests/s
    duration: float | None = None  # soak: seconds the load is held once all its users run
    window: float | None = None  # soak: seconds per point of the time series (default SOAK_WINDOW)


#: ``[load] mode``: the strategy that chooses the steps.
MODES = ("grid", "search", "soak")
#: Soak (``mode = "soak"``): the default window, and the fewest windows the trend test can judge
#: (kneeswarm.analysis.summary.soak tests at alpha 0.01: Mann–Kendall over 5 windows cannot reach it, p >= 2/5! = 0.017).
SOAK_WINDOW = 60.0
SOAK_MIN_WINDOWS = 6
SOAK_KEYS = ("users", "rate", "duration", "window")
#: ``[load] arrivals``: closed loop (steps are users) or open loop (steps are arrival rates).
LOOPS = ("closed", "open")


def arrivals_of(load: dict[str, Any]) -> str:
    """The loop ("closed" or "open") of a ``[load]`` table read back from a run's plan.toml:
    ``arrivals``, or the older spelling ``mode = "open"``."""
    loop = str(load.get("arrivals", "closed")).lower()
    return "open" if loop == "open" or str(load.get("mode", "")).lower() == "open" else "closed"


@dataclass
class RequestPlan:
    model: str = "demo"
    shape: list[int] = field(default_factory=lambda: [1, 64])
    datatype: str = "FP32"
    data: str = "random"  # "random" (seeded per user) or "fixed"
    timeout: float = 10.0  # seconds before a request counts as a timeout error
    seed: int = 0
    # -- credentials (every protocol) ----------------------------------------------------
    api_key_env: str | None = None  # NAME of the env var whose value goes in "Authorization: Bearer"
    # -- tensor protocols (kserve, torchserve, tfserving) --------------------------------
    version: str | None = None  # model version in the path (kserve, tfserving, torchserve)
    batch: int = 1  # items per request: replaces the first dimension of every input's shape
    input_name: str = "input"  # name of the single input (kserve) when `inputs` is not given
    inputs: list[dict] | None = None  # kserve, several inputs: [[request.inputs]] name, shape, datatype (gRPC: data)
    # -- gRPC (kserve-grpc, triton-stream, torchserve-grpc) --------------------------------------
    output_name: str | None = None  # triton-stream: the output tensor holding the text or token ids ("text_output")
    rpc: str | None = None  # torchserve-grpc: "Predictions" (default) or "StreamPredictions"
    contents: str | None = None  # kserve-grpc, triton-stream: tensors "raw" (raw_input_contents, default) or "typed"
    # -- openai ------------------------------------------------------------------------
    endpoint: str = "chat"  # "chat" (/v1/chat/completions) or "completions" (/v1/completions)
    stream: bool = True  # SSE streaming (TTFT, ITL measured)
    max_tokens: int = 64  # max output tokens per request
    prompt: str | None = None  # fixed prompt text; default: a synthetic one of prompt_tokens words
    prompt_tokens: int = 32  # synthetic prompt length (words; ~tokens, see protocols/openai.py)
    include_usage: bool = True  # stream_options.include_usage: the server's own token counts
    ignore_eos: bool = False  # vLLM/SGLang extension: always produce max_tokens
    min_tokens: int | None = None  # vLLM extension: at least this many output tokens
    dataset: str | None = None  # JSONL of {"prompt"} or {"messages"} (+ "max_tokens") records
    lengths: dict | None = None  # [request.lengths] input/output = {dist, mean, stdev, min, max}
    replay: str | None = None  # JSONL of recorded {"body": {...}, "t": seconds?} (protocols/workload.py)
    tokenizer: str | None = None  # a Hugging Face tokenizer.json: token counts (else words approximate them)
    # LLM workloads as served (protocols/workload.py): shared prefixes, multi-turn sessions, a Mooncake trace
    prefix: dict | None = None  # [request.prefix] tokens, count, share
    conversation: dict | None = None  # [request.conversation] turns = {dist...} | n, think_ms = {dist...} | ms
    trace: str | None = None  # Mooncake trace JSONL: timestamp (ms), input_length, output_length, hash_ids
    trace_block_tokens: int = 512  # tokens per hash id of the trace (Mooncake's traces: 512)
    # -- http (generic JSON) ---------------------------------------------------------------
    path: str | None = None  # request path (http); overrides the protocol's path elsewhere
    method: str = "POST"
    body: str | None = None  # JSON template: {{prompt}} {{data}} {{model}} {{user}} placeholders
    health_path: str | None = None  # overrides the protocol's health path
    success_path: str | None = None  # dotted JSON path that must be present in a 2xx answer (http)
    # -- a traffic mix (kneeswarm.contracts.classes): [[request.classes]] name, weight and the keys that differ
    lora: list[dict] | None = None  # openai: llama.cpp's per-request adapters, [{id = 0, scale = 1.0}] (its `lora` field)
    classes: list[dict] | None = None  # [[request.classes]]: each request draws one by weight; [request] is their default






@dataclass
class EndpointPlan:
    """[endpoint]: how the target is reached -- TLS trust, a client certificate, headers, a
    gateway's path prefix.  The same settings serve the health check and preflight, the load,
    and the scrape of metrics_url (headers there only when it has the target's scheme, host and
    port: a secret header never goes to another server)."""

    ca_bundle: str | None = None  # PEM file of the CA(s) that signed the server's certificate (replaces the system's)
    verify: bool = True  # false: the server's certificate is not checked (the report says: unverified TLS)
    client_cert: str | None = None  # PEM client certificate (mutual TLS); may hold its key too
    client_key: str | None = None  # PEM private key of client_cert, when not in that file
    headers: dict | None = None  # header name -> value on every request, e.g. {Host = "demo.example.com"}
    headers_env: dict | None = None  # header name -> NAME of the env var holding its value (secrets)
    base_path: str | None = None  # prefix of every path the protocol sends, e.g. "/serving/demo" (a gateway's route)
    server_name: str | None = None  # the name TLS asks for (SNI) and checks in the certificate, where target is an address

    def tls_keys(self) -> list[str]:
        """The TLS keys set (they mean something for an https:// URL only)."""
        return [k for k in ("ca_bundle", "client_cert", "client_key", "server_name") if getattr(self, k)] + \
            ([] if self.verify else ["verify"])

    def resolved_headers(self) -> dict[str, str]:
        """headers with headers_env's values read from the environment; ValueError (one line)
        naming the variable when one is unset or empty."""
        out = {str(k): str(v) for k, v in (self.headers or {}).items()}
        for name, env in (self.headers_env or {}).items():
            value = os.environ.get(env)
            if not value:
                raise ValueError(f"endpoint.headers_env: environment variable {env} (header {name}) is not set (or empty)")
            out[str(name)] = value
        return out

    def secrets(self) -> list[str]:
        """The values of headers_env (to be redacted from every message)."""
        return [v for env in (self.headers_env or {}).values() if (v := os.environ.get(env))]

    def requests_kwargs(self) -> dict[str, Any]:
        """``verify`` and ``cert`` for the requests library.  With ``verify = false`` urllib3's
        InsecureRequestWarning is silenced: the plan asked for it, the report says it, and the
        warning would break the one-line error of a run that cannot start."""
        if not self.verify:
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        kw: dict[str, Any] = {"verify": self.ca_bundle or self.verify}
        if self.client_cert:
            kw["cert"] = (self.client_cert, self.client_key) if self.client_key else self.client_cert
        return kw

    def requests_session(self) -> Any:
        """A requests Session for the target's origin: with ``server_name``, its https
        connections ask for that name (SNI) and check it in the certificate (urllib3's
        ``server_hostname`` / ``assert_hostname``), whatever address the URL holds."""
        import requests
        from requests.adapters import HTTPAdapter

        name = self.server_name

        class _ServerName(HTTPAdapter):
            def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
                kwargs.update(server_hostname=name, assert_hostname=name)
                super().init_poolmanager(*args, **kwargs)

        session = requests.Session()
        if name:
            session.mount("https://", _ServerName())
        return session

    def ssl_context(self, create: Any = ssl.create_default_context) -> ssl.SSLContext:
        """An SSL context for https:// (``create``: ssl's or gevent.ssl's create_default_context)."""
        ctx = create(cafile=self.ca_bundle) if self.ca_bundle else create()
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


@dataclass
class MonitorPlan:
    interval: float = 1.0  # collector sampling interval, seconds (whole seconds for pidstat/vmstat)
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # agents stop everything when the controller is silent this long
    #: which processes are the service, on every host whose [[hosts]] entry does not say (the
    #: local one monitored by default too): "tree", the process found and its descendants, found
    #: again at every sample; "cgroup", every process of its cgroup (a container's, a pod's);
    #: "process", the process found alone (agents/remote/tree.py)
    scope: str = DEFAULT_SCOPE


#: The keys of ``[[hosts]] kubernetes = {...}`` (kneeswarm.agents.kubernetes builds kubectl's argv from them).
KUBERNETES_KEYS = ("namespace", "pod", "selector", "container", "context", "debug_image", "kubectl")


@dataclass
class HostPlan:
    """One monitored server; ``ssh`` absent means this machine, without SSH."""

    name: str | None = None  # label in the run directory; default: the host part of ssh, or "local"
    ssh: str | None = None  # "user@host[:port]"
    key_file: str | None = None
    passphrase_env: str | None = None  # name of the env var that holds the key's passphrase
    jump: str | None = None  # "user@bastion[:port]" (ProxyJump)
    known_hosts: str | None = None  # default: ~/.ssh/known_hosts
    pid: int | None = None
    process: str | None = None  # regex on the command line
    port: int | None = None  # the process listening on this TCP port
    scope: str | None = None  # "tree", "cgroup" or "process" ([monitor] scope's words); default: [monitor] scope
    collectors: list[str] | None = None  # default: every one the preflight finds
    keep_remote: bool = False  # keep the remote run directory after the verified fetch
    python: str | None = None  # the host's python3 (default "python3" on its PATH; RHEL 8: /usr/libexec/platform-python)

    # -- reached without SSH, through a command that opens a shell where the server runs ----------
    #: argv prefix of that command: ["kubectl", "exec", "-i", "-n", "serving", "pod/triton-0", "-c",
    #: "server", "--"], ["docker", "exec", "-i", "triton"], ["nsenter", "-t", "PID", "-a"]
    exec: list[str] | None = None
    #: the kubectl prefix built from {namespace, pod | selector, container, context, debug_image,
    #: kubectl} (kneeswarm.agents.kubernetes; KUBERNETES_KEYS); a selector: one host per pod
    kubernetes: dict | None = None

    @property
    def is_local(self) -> bool:
        """This machine, without SSH or an exec prefix."""
        return self.ssh is None and self.exec is None and self.kubernetes is None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.ssh:
            return self.ssh.split("@")[-1].split(":")[0]
        if self.kubernetes:  # a selector's hosts are named by their pods once listed
            return str(self.kubernetes.get("pod") or self.kubernetes.get("selector"))
        return "local"


@dataclass
class AnalysisPlan:
    min_requests: int = 100  # fewer steady requests than this: the step's P99 is not trusted
    generator_cpu_max: float = 90.0  # a worker busier than this: the generator was the bottleneck


@dataclass
class SlaPlan:
    """[sla]: upper limits a step must meet (analysis/models/capacity.py); unset keys are not checked."""

    p99_ms: float | None = None  # P99 latency of the step's steady window, ms
    error_rate: float | None = None  # failed share of the step's requests, 0..1
    ttft_ms: float | None = None  # P99 time to first token (streaming runs; skipped where not measured)
    itl_ms: float | None = None  # P99 inter-token latency (streaming runs; skipped where not measured)
    min_qps: float | None = None  # the best step meeting the SLA must also deliver at least this QPS
    classes: dict | None = None  # [sla.classes.NAME]: a traffic mix's class's own limits (the keys above)

    def is_set(self) -> bool:
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))


@dataclass
class CapacityPlan:
    """[capacity]: inputs of the capacity plan; unset keys take analysis/models/capacity.py's defaults."""

    peak_qps: float | None = None  # the peak load to serve, requests/s (replicas are planned for it)
    spare: int | None = None  # failover instances added to the replicas (default 2)
    queue_tolerance_ms: float | None = None  # queueing time a request may spend (default 1000 ms)
    headroom: float | None = None  # QPS share left unused at the recommended concurrency (default 0.30)
    safe_fraction: float | None = None  # safe QPS per instance / max stable QPS (default 0.70)






@dataclass
class Plan:
    name: str = "run"
    target: str = "http://127.0.0.1:8000"
    protocol: str = "kserve"
    metrics_url: str | None = None
    load: LoadPlan = field(default_factory=LoadPlan)
    request: RequestPlan = field(default_factory=RequestPlan)
    monitor: MonitorPlan = field(default_factory=MonitorPlan)
    analysis: AnalysisPlan = field(default_factory=AnalysisPlan)
    sla: SlaPlan = field(default_factory=SlaPlan)
    capacity: CapacityPlan = field(default_factory=CapacityPlan)
    endpoint: EndpointPlan = field(default_factory=EndpointPlan)
    hosts: list[HostPlan] = field(default_factory=list)

    # -- derived -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The target with endpoint.base_path: what every protocol path is appended to."""
        return join_base(self.target, self.endpoint.base_path)

    def metrics_origin_is_target(self) -> bool:
        """metrics_url has the target's scheme, host and port."""
        return bool(self.metrics_url and _origin(self.metrics_url) == _origin(self.target))

    def metrics_headers(self, secrets: bool = True) -> dict[str, str]:
        """The endpoint's headers for the scrape of metrics_url: only when it is the target's
        origin (scheme, host, port), so that a secret header never goes to another server;
        ``secrets=False``: without headers_env's (ValueError only for an unset one of those)."""
        if not self.metrics_origin_is_target():
            return {}
        if not secrets:
            return {str(k): str(v) for k, v in (self.endpoint.headers or {}).items()}
        return self.endpoint.resolved_headers()

    def step_durations(self) -> float:
        """Total planned seconds of load (all ramps and holds; a soak ramps once; a search:
        max_duration, plus the probe that may be running when it is reached)."""
        if self.load.mode == "soak":
            return self.load.ramp + len(self.load.steps) * self.load.hold_s()
        if self.load.mode == "search":
            return self.load.max_duration + self.load.ramp + self.load.hold_s()
        return len(self.load.steps) * (self.load.ramp + self.load.hold_s())

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def join_base(url: str, base_path: str | None) -> str:
    """``url`` with ``base_path`` appended (no doubled or trailing slash)."""
    return url.rstrip("/") + (base_path.rstrip("/") if base_path else "")


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(url)
    return u.scheme, (u.hostname or "").lower(), u.port or (443 if u.scheme == "https" else 80)


def _drop_none(value: Any) -> Any:
    """TOML has no null: leave unset keys out (they read back as their defaults)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value














def is_soak(load: dict[str, Any]) -> bool:
    """A ``[load]`` table read back from a run's plan.toml is a soak (mode = "soak")."""
    return str(load.get("mode", "")).lower() == "soak"






















