"""Reading a plan: TOML (or a dict) in, a validated ``Plan`` out (floor 1 contract).

``load_plan`` validates strictly: an unknown key, a wrong type or a bad step list raises
``PlanError`` (kneeswarm.contracts.plan) with one line that names the input and the problem.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import ssl
import tomllib
from pathlib import Path
from typing import Any

from kneeswarm.contracts.classes import ClassError, check_class_sla, parse_classes
from kneeswarm.contracts.plan import (GRPC_PROTOCOLS, KUBERNETES_KEYS, LOOPS, MODES, OPENAI_ENDPOINTS, PROTOCOLS, SCOPES,
                                      SOAK_KEYS, SOAK_MIN_WINDOWS, SOAK_WINDOW, TENSOR_DATATYPES, AnalysisPlan,
                                      CapacityPlan, EndpointPlan, HostPlan, LoadPlan,
                                      MonitorPlan, Plan, PlanError, RequestPlan, SlaPlan)

logger = logging.getLogger(__name__)



#: A header name as HTTP allows it (RFC 9110 token)
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_SERVER_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")


# (key, lowest, highest, whether the lowest is allowed) of the [sla] and [capacity] numbers
_GATE_RANGES: dict[str, tuple[tuple[str, float, float, bool], ...]] = {
    "sla": (("p99_ms", 0.0, float("inf"), False), ("error_rate", 0.0, 1.0, True),
            ("ttft_ms", 0.0, float("inf"), False), ("itl_ms", 0.0, float("inf"), False),
            ("min_qps", 0.0, float("inf"), True)),
    "capacity": (("peak_qps", 0.0, float("inf"), False), ("spare", 0, float("inf"), True),
                 ("queue_tolerance_ms", 0.0, float("inf"), True), ("headroom", 0.0, 1.0, True),
                 ("safe_fraction", 0.0, 1.0, False)),
}


def _validate_gates(plan: Plan, source: str) -> None:
    """[sla] and [capacity]: every number set must lie in its range (one line naming the key)."""
    for table, ranges in _GATE_RANGES.items():
        section = getattr(plan, table)
        for key, lo, hi, lo_ok in ranges:
            v = getattr(section, key)
            if v is None:
                continue
            if v != v or v > hi or v < lo or (v == lo and not lo_ok):
                low = f">= {lo:g}" if lo_ok else f"> {lo:g}"
                bound = low if hi == float("inf") else f"{low} and <= {hi:g}"
                raise PlanError(f"{source}: {table}.{key} must be {bound}, got {v!r}")


_SECTIONS: dict[str, type] = {
    "load": LoadPlan,
    "request": RequestPlan,
    "monitor": MonitorPlan,
    "analysis": AnalysisPlan,
    "sla": SlaPlan,
    "capacity": CapacityPlan,
    "endpoint": EndpointPlan,
}


def _check_type(source: str, where: str, value: Any, hint: Any) -> Any:
    """Coerce ``value`` to the dataclass field's annotated type, or raise PlanError."""
    hint = str(hint)
    optional = "None" in hint
    base = hint.replace(" | None", "")
    if value is None and optional:
        return None
    ok: bool
    if base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif base == "str":
        ok = isinstance(value, str)
    elif base == "float | str":  # seconds, or a word (load.hold = "auto"): the word is checked in _validate
        ok = isinstance(value, (int, float, str)) and not isinstance(value, bool)
        value = float(value) if ok and not isinstance(value, str) else value
    elif base == "bool":
        ok = isinstance(value, bool)
    elif base == "list[str]":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif base == "dict":
        ok = isinstance(value, dict)
    elif base == "list[dict]":
        ok = isinstance(value, list) and all(isinstance(v, dict) for v in value)
    elif base == "list[float]":
        ok = isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        value = [float(v) for v in value] if ok else value
    elif base == "list[int]":
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    elif base == "list[list[int]]":
        ok = isinstance(value, list) and all(isinstance(v, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v) for v in value)
    else:  # pragma: no cover - a new field type must be added above
        raise AssertionError(f"unhandled plan field type {hint}")
    if not ok:
        kind = {"list[list[int]]": "a list of [input, output] integer pairs", "list[int]": "a list of integers", "list[float]": "a list of numbers", "list[str]": "a list of strings", "bool": "true or false",
                "list[dict]": "an array of tables", "dict": "a table",
                "float | str": "a number or a word"}.get(base, base)
        raise PlanError(f"{source}: {where} must be {kind}, got {value!r}")
    return value


def _fill(source: str, cls: type, table: dict[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise PlanError(f"{source}: unknown key '{prefix}{key}' (known: {known})")
        if key == "hosts" and cls is Plan:
            if not isinstance(value, list) or not all(isinstance(h, dict) for h in value):
                raise PlanError(f"{source}: hosts must be an array of tables ([[hosts]])")
            kwargs[key] = [_fill(source, HostPlan, h, f"hosts[{i}].") for i, h in enumerate(value)]
        elif key in _SECTIONS and cls is Plan:
            if not isinstance(value, dict):
                raise PlanError(f"{source}: [{key}] must be a table")
            kwargs[key] = _fill(source, _SECTIONS[key], value, f"{key}.")
        else:
            kwargs[key] = _check_type(source, f"{prefix}{key}", value, fields[key].type)
    return cls(**kwargs)


def _open_loop(plan: Plan, source: str) -> None:
    """Open loop: each step's rate becomes a number of arrival sources of source_rate req/s each
    (Locust users; Locust splits them over the workers, so the rate is split, not multiplied)."""
    load = plan.load
    if load.mode in LOOPS:  # the older spelling: [load] mode = "open" meant the loop, on a grid
        load.arrivals, load.mode = load.mode, "grid"
    if load.mode not in MODES:
        raise PlanError(f"{source}: load.mode must be one of {', '.join(MODES)}, got {load.mode!r}")
    if load.arrivals not in LOOPS:
        raise PlanError(f"{source}: load.arrivals must be 'closed' or 'open', got {load.arrivals!r}")
    if load.mode == "soak":
        return _soak(load, source)
    if given := [k for k in SOAK_KEYS if getattr(load, k) is not None]:
        raise PlanError(f"{source}: load.{given[0]} is a soak key: it needs load.mode = \"soak\" (mode is {load.mode!r})")
    if load.mode == "search":
        if load.arrivals == "open":
            _arrival_keys(load, source)
        _search(load, source)
        return
    if load.arrivals == "closed":
        return
    _arrival_keys(load, source)
    rates = load.rates or []
    if not rates or any(r <= 0 for r in rates) or any(b <= a for a, b in zip(rates, rates[1:])):
        raise PlanError(f"{source}: open loop needs load.rates: positive requests/s, strictly increasing, got {rates}")
    sources = [r / load.source_rate for r in rates]
    if any(abs(n - round(n)) > 1e-6 for n in sources):
        raise PlanError(f"{source}: every load.rates entry must be a multiple of load.source_rate "
                        f"({load.source_rate:g} req/s), got {rates}")
    load.steps = [int(round(n)) for n in sources]


def _arrival_keys(load: LoadPlan, source: str) -> None:
    if load.arrival not in ("poisson", "constant"):
        raise PlanError(f"{source}: load.arrival must be 'poisson' or 'constant', got {load.arrival!r}")
    if load.source_rate <= 0 or load.max_inflight < 1:
        raise PlanError(f"{source}: load.source_rate must be > 0 and load.max_inflight >= 1")


def _soak(load: LoadPlan, source: str) -> None:
    """mode = "soak": one load (``users``, or ``rate`` with open-loop arrivals) held ``duration``
    seconds, cut into windows of ``window`` seconds.  Each window is one step of that same load
    (steps = [load] x windows, hold = window: locustfiles/steps.py keeps the load running across
    them), so steps.csv, the rows' step stamps and every per-step figure are per window."""
    load.window = SOAK_WINDOW if load.window is None else load.window
    where = f"{source}: mode = \"soak\""
    if load.arrivals == "closed":
        if load.users is None or load.rate is not None:
            raise PlanError(f"{where} with closed-loop arrivals needs load.users (load.rate is for arrivals = \"open\")")
        if load.users < 1:
            raise PlanError(f"{where}: load.users must be >= 1, got {load.users}")
        held = load.users
    else:
        if load.rate is None or load.users is not None:
            raise PlanError(f"{where} with open-loop arrivals needs load.rate (requests/s), not load.users")
        _arrival_keys(load, source)
        sources = load.rate / load.source_rate
        if load.rate <= 0 or abs(sources - round(sources)) > 1e-6:
            raise PlanError(f"{where}: load.rate must be a positive multiple of load.source_rate "
                            f"({load.source_rate:g} req/s), got {load.rate:g}")
        held = int(round(sources))
    if load.duration is None or load.duration <= 0 or load.window <= 0:
        raise PlanError(f"{where} needs load.duration > 0 and load.window > 0 seconds "
                        f"(got duration {load.duration}, window {load.window})")
    n = load.duration / load.window
    if abs(n - round(n)) > 1e-6 or round(n) < SOAK_MIN_WINDOWS:
        raise PlanError(f"{where}: load.duration ({load.duration:g}s) must be a whole number of windows "
                        f"({load.window:g}s), at least {SOAK_MIN_WINDOWS} of them (the trend test needs {SOAK_MIN_WINDOWS})")
    if load.hold == "auto" or load.settle >= load.window:
        raise PlanError(f"{where}: each window is held load.window seconds (hold = \"auto\" is for step "
                        f"sweeps), and load.settle ({load.settle:g}s) must be shorter than it")
    load.steps, load.hold, load.rates = [held] * int(round(n)), float(load.window), None


def _search(load: LoadPlan, source: str) -> None:
    """mode = "search": start, max, growth, precision, max_duration that make sense; the steps
    (open loop: the rates) are chosen as the run goes, so the plan holds none."""
    if load.precision <= 0 or load.precision >= 1:
        raise PlanError(f"{source}: load.precision must be > 0 and < 1 (a relative bracket width), got {load.precision:g}")
    if load.growth <= 1:
        raise PlanError(f"{source}: load.growth must be > 1 (each probe multiplies the last), got {load.growth:g}")
    if load.start <= 0 or load.max < load.start:
        raise PlanError(f"{source}: load.start must be > 0 and load.max >= load.start, got start {load.start:g}, "
                        f"max {load.max:g}")
    if load.max_duration <= 0:
        raise PlanError(f"{source}: load.max_duration must be > 0 seconds, got {load.max_duration:g}")
    unit = load.source_rate if load.arrivals == "open" else 1.0
    for key in ("start", "max"):
        n = getattr(load, key) / unit
        if abs(n - round(n)) > 1e-6:
            what = f"a multiple of load.source_rate ({unit:g} req/s)" if unit != 1.0 else "a whole number of users"
            raise PlanError(f"{source}: load.{key} must be {what}, got {getattr(load, key):g}")
    load.steps, load.rates = [], None


def search_conflicts(data: dict[str, Any], source: str) -> None:
    """``mode = "search"`` chooses the steps: a plan that also gives ``steps`` or ``rates`` is
    contradictory (one line, before anything runs)."""
    raw = data.get("load")
    load: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if load.get("mode") != "search":
        return
    given = [k for k in ("steps", "rates") if load.get(k)]
    if given:
        raise PlanError(f"{source}: load.{given[0]} and load.mode = \"search\" are both given; the search chooses "
                        "the steps: give load.start and load.max instead")


def _hold(load: LoadPlan, source: str) -> None:
    """load.hold (seconds, or "auto" with ci, min_hold, max_hold that make sense) and settle."""
    if load.ramp < 0 or load.settle < 0:
        raise PlanError(f"{source}: load.ramp and load.settle must be >= 0")
    if isinstance(load.hold, str):
        if load.hold != "auto":
            raise PlanError(f"{source}: load.hold must be float seconds or \"auto\", got {load.hold!r}")
        if not 0 < load.ci < 1:
            raise PlanError(f"{source}: load.ci must be between 0 and 1 (a relative half-width), got {load.ci}")
        if not load.settle < load.min_hold <= load.max_hold:
            raise PlanError(f"{source}: hold = \"auto\" needs load.settle ({load.settle}s) < load.min_hold "
                            f"({load.min_hold}s) <= load.max_hold ({load.max_hold}s)")
        return
    if load.hold <= 0:
        raise PlanError(f"{source}: load.hold must be > 0 seconds, got {load.hold}")
    if load.settle >= load.hold:
        raise PlanError(f"{source}: load.settle ({load.settle}s) must be shorter than load.hold ({load.hold}s)")


def _repeat(load: LoadPlan, source: str) -> None:
    """load.repeat (runs of the plan, at least 1) and load.cooldown (seconds between them); a
    repetition of a sweep of shapes or of a soak is refused: a sweep's runs are not the same plan,
    and a soak's windows are already its repetitions over time."""
    if load.repeat < 1:
        raise PlanError(f"{source}: load.repeat must be >= 1 (runs of the plan), got {load.repeat}")
    if not 0 <= load.cooldown < float("inf"):
        raise PlanError(f"{source}: load.cooldown must be >= 0 seconds, got {load.cooldown!r}")
    if load.repeat > 1 and load.shapes is not None:
        raise PlanError(f"{source}: load.repeat and load.shapes are both given; repeat one shape's plan at a time")
    if load.repeat > 1 and load.mode == "soak":
        raise PlanError(f"{source}: load.repeat is for step sweeps and searches; a soak's windows are its "
                        "repetitions (give load.duration instead)")


def _validate(plan: Plan, source: str) -> None:
    _open_loop(plan, source)
    steps = plan.load.steps
    if plan.load.mode == "search":
        pass
    elif not steps:
        raise PlanError(f"{source}: load.steps is empty; give at least one user count, e.g. [1, 2, 4, 8]")
    if any(s < 1 for s in steps):
        raise PlanError(f"{source}: load.steps must be positive user counts, got {steps}")
    if plan.load.mode != "soak" and any(b <= a for a, b in zip(steps, steps[1:])):
        raise PlanError(f"{source}: load.steps must be strictly increasing, got {steps}")
    _hold(plan.load, source)
    _repeat(plan.load, source)
    if plan.load.workers < 0:
        raise PlanError(f"{source}: load.workers must be >= 0, got {plan.load.workers}")
    if plan.protocol not in PROTOCOLS:
        raise PlanError(f"{source}: protocol '{plan.protocol}' is not supported (supported: {', '.join(PROTOCOLS)})")
    _validate_target(plan, source)
    if plan.request.timeout <= 0:
        raise PlanError(f"{source}: request.timeout must be > 0 seconds")
    _validate_request(plan, source)
    _validate_endpoint(plan, source)
    if plan.monitor.interval < 1:
        raise PlanError(f"{source}: monitor.interval must be >= 1 second, got {plan.monitor.interval}")
    labels = [h.label for h in plan.hosts]
    if len(set(labels)) != len(labels):
        raise PlanError(f"{source}: two [[hosts]] share a name ({labels}); give each a distinct name")
    if plan.monitor.scope not in SCOPES:
        raise PlanError(f"{source}: monitor.scope must be one of {', '.join(SCOPES)}, got {plan.monitor.scope!r}")
    for i, h in enumerate(plan.hosts):
        if sum(x is not None for x in (h.pid, h.process, h.port)) > 1:
            raise PlanError(f"{source}: hosts[{i}] ({h.label}): give one of pid, process or port, not several")
        if h.scope is not None and h.scope not in SCOPES:
            raise PlanError(f"{source}: hosts[{i}] ({h.label}): scope must be one of {', '.join(SCOPES)}, got {h.scope!r}")
        _validate_reach(h, f"{source}: hosts[{i}] ({h.label})")


#: A Kubernetes object name (RFC 1123 subdomain: pods, namespaces) and a container name (a DNS label)
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_K8S_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: The keys that only mean something over SSH
_SSH_KEYS = ("key_file", "passphrase_env", "jump", "known_hosts")


def _validate_reach(h: HostPlan, where: str) -> None:
    """How a host is reached: ssh, an exec prefix or the kubernetes table, at most one of them,
    each with the keys it takes (one line naming the key)."""
    given = [k for k in ("ssh", "exec", "kubernetes") if getattr(h, k) is not None]
    if len(given) > 1:
        raise PlanError(f"{where}: give one of ssh, exec or kubernetes, not {' and '.join(given)}")
    if not given or given == ["ssh"]:
        return
    if stray := [k for k in _SSH_KEYS if getattr(h, k) is not None]:
        raise PlanError(f"{where}: {stray[0]} is for ssh hosts; {given[0]} reaches this one")
    if h.exec is not None:
        if not h.exec or not h.exec[0].strip():
            raise PlanError(f"{where}: exec must be a command line prefix, e.g. [\"kubectl\", \"exec\", \"-i\", "
                            f"\"pod/NAME\", \"--\"], got {h.exec!r}")
        if not h.name:
            raise PlanError(f"{where}: a host reached by exec needs a name (its folder in the run directory)")
        return
    k = h.kubernetes or {}
    if unknown := sorted(set(k) - set(KUBERNETES_KEYS)):
        raise PlanError(f"{where}: unknown key 'kubernetes.{unknown[0]}' (known: {', '.join(sorted(KUBERNETES_KEYS))})")
    for key, value in k.items():
        if not isinstance(value, str) or not value.strip():
            raise PlanError(f"{where}: kubernetes.{key} must be a non-empty string, got {value!r}")
    if ("pod" in k) == ("selector" in k):
        raise PlanError(f"{where}: kubernetes needs one of pod (one pod) or selector (a label selector: "
                        "one host per pod), not {}".format("both" if "pod" in k else "neither"))
    if "debug_image" in k and "container" not in k:
        raise PlanError(f"{where}: kubernetes.debug_image needs kubernetes.container (the server's container, "
                        "whose processes the debug container shares: kubectl debug --target)")
    for key, pattern in (("pod", _K8S_NAME), ("namespace", _K8S_LABEL), ("container", _K8S_LABEL)):
        if key in k and not pattern.match(k[key]):
            raise PlanError(f"{where}: kubernetes.{key} {k[key]!r} is not a Kubernetes name")


def _validate_request(plan: Plan, source: str) -> None:
    """The [request] keys that depend on the protocol."""
    r = plan.request
    if r.data not in ("random", "fixed"):
        raise PlanError(f"{source}: request.data must be 'random' or 'fixed', got {r.data!r}")
    if not r.shape or any(d < 1 for d in r.shape):
        raise PlanError(f"{source}: request.shape must be positive dimensions, got {r.shape}")
    if r.batch < 1:
        raise PlanError(f"{source}: request.batch must be >= 1, got {r.batch}")
    if r.endpoint not in OPENAI_ENDPOINTS:
        raise PlanError(f"{source}: request.endpoint must be one of {', '.join(OPENAI_ENDPOINTS)}, got {r.endpoint!r}")
    if r.max_tokens < 1 or r.prompt_tokens < 1:
        raise PlanError(f"{source}: request.max_tokens and request.prompt_tokens must be >= 1")
    if r.api_key_env is not None and not r.api_key_env.replace("_", "").isalnum():
        raise PlanError(f"{source}: request.api_key_env must name an environment variable, got {r.api_key_env!r}")
    for key in ("path", "health_path"):
        value = getattr(r, key)
        if value is not None and not value.startswith("/"):
            raise PlanError(f"{source}: request.{key} must start with '/', got {value!r}")
    if plan.protocol == "http" and not r.path:
        raise PlanError(f"{source}: protocol 'http' needs request.path (and usually request.body)")
    for i, spec in enumerate(r.inputs or []):
        where = f"{source}: request.inputs[{i}]"
        unknown = set(spec) - {"name", "shape", "datatype", "data"}
        if unknown:
            raise PlanError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: data, datatype, name, shape)")
        if "data" in spec and (plan.protocol not in GRPC_PROTOCOLS or not isinstance(spec["data"], list)):
            raise PlanError(f"{where}: data (the input's values, a list) is for the gRPC protocols "
                            f"({', '.join(GRPC_PROTOCOLS)})")
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise PlanError(f"{where}: needs a name")
        shape = spec.get("shape")
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
            raise PlanError(f"{where} ({spec['name']}): shape must be positive dimensions, got {shape!r}")
        if str(spec.get("datatype", "FP32")).upper() not in TENSOR_DATATYPES:
            raise PlanError(f"{where} ({spec['name']}): datatype {spec.get('datatype')!r} is not a KServe v2 datatype")
    if r.dataset and r.lengths:
        raise PlanError(f"{source}: give request.dataset or request.lengths, not both")
    if r.replay and (r.dataset or r.lengths):
        raise PlanError(f"{source}: request.replay sends recorded bodies: give it without request.dataset "
                        "or request.lengths")
    if r.lengths is not None and (set(r.lengths) - {"input", "output"} or not r.lengths):
        raise PlanError(f"{source}: request.lengths takes an input and/or an output table")
    _validate_llm_workload(plan, source)
    _validate_grpc_request(plan, source)
    if str(r.datatype).upper() not in TENSOR_DATATYPES:
        raise PlanError(f"{source}: request.datatype {r.datatype!r} is not a KServe v2 datatype")
    _validate_lora(plan, source)
    _validate_classes(plan, source)


def _validate_lora(plan: Plan, source: str) -> None:
    """request.lora: llama.cpp's per-request adapter list, [{id, scale}] (protocol openai)."""
    lora = plan.request.lora
    if lora is None:
        return
    if plan.protocol != "openai":
        raise PlanError(f"{source}: request.lora (llama.cpp's per-request adapters) is for protocol 'openai'")
    for i, a in enumerate(lora):
        ident, scale = a.get("id"), a.get("scale", 1.0)
        if set(a) - {"id", "scale"} or isinstance(ident, bool) or not isinstance(ident, int) or ident < 0 \
                or isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise PlanError(f"{source}: request.lora[{i}] must be {{id = N >= 0, scale = number}}, got {a!r}")


def _validate_classes(plan: Plan, source: str) -> None:
    """[[request.classes]] (kneeswarm.contracts.classes): the tables' own checks, then each class's
    merged [request] through the same checks as the plan's own, its messages naming the class."""
    try:
        classes = parse_classes(plan.request, plan.protocol,
                                lambda where, value, hint: _check_type(source, where, value, hint))
        check_class_sla(plan.sla.classes, [c.name for c in classes])
    except ClassError as e:
        raise PlanError(f"{source}: {e}") from None
    for i, c in enumerate(classes):
        try:
            _validate_request(dataclasses.replace(plan, request=c.request, sla=dataclasses.replace(plan.sla, classes=None)),
                              source)
        except PlanError as e:
            said = str(e).removeprefix(f"{source}: ")
            raise PlanError(f"{source}: request.classes[{i}] ({c.name}): {said}") from None


#: the [request] keys that belong to one gRPC protocol
GRPC_ONLY = {"output_name": "triton-stream", "rpc": "torchserve-grpc"}
TORCHSERVE_RPCS = ("Predictions", "StreamPredictions")


def _validate_target(plan: Plan, source: str) -> None:
    """target: http(s):// for the HTTP protocols; grpc://host:port or grpcs://host:port for the gRPC
    ones, where endpoint.base_path (an HTTP route) and verify = false (grpc's TLS always checks the
    certificate) have no meaning."""
    import urllib.parse

    if plan.protocol not in GRPC_PROTOCOLS:
        if not plan.target.startswith(("http://", "https://")):
            hint = " (grpc:// is for the gRPC protocols: kserve-grpc, triton-stream, torchserve-grpc)" \
                if plan.target.startswith(("grpc://", "grpcs://")) else ""
            raise PlanError(f"{source}: target must be an http:// or https:// URL, got {plan.target!r}{hint}")
        return
    u = urllib.parse.urlsplit(plan.target)
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme not in ("grpc", "grpcs") or not u.hostname or port is None or u.path not in ("", "/"):
        raise PlanError(f"{source}: protocol {plan.protocol!r} needs target = \"grpc://host:port\" (or grpcs:// for "
                        f"TLS), got {plan.target!r}")
    if plan.endpoint.base_path:
        raise PlanError(f"{source}: endpoint.base_path is an HTTP route; gRPC has none (protocol {plan.protocol!r})")
    if not plan.endpoint.verify:
        raise PlanError(f"{source}: endpoint.verify = false: gRPC's TLS always checks the server's certificate; "
                        "give its CA in endpoint.ca_bundle")


def _validate_grpc_request(plan: Plan, source: str) -> None:
    r = plan.request
    for key, protocol in GRPC_ONLY.items():
        if getattr(r, key) is not None and plan.protocol != protocol:
            raise PlanError(f"{source}: request.{key} is for protocol '{protocol}'")
    if r.contents is not None and (plan.protocol not in ("kserve-grpc", "triton-stream")
                                   or r.contents not in ("raw", "typed")):
        raise PlanError(f"{source}: request.contents is \"raw\" or \"typed\", for protocols kserve-grpc and "
                        f"triton-stream (got {r.contents!r}, protocol {plan.protocol!r})")
    if r.rpc is not None and r.rpc not in TORCHSERVE_RPCS:
        raise PlanError(f"{source}: request.rpc must be one of {', '.join(TORCHSERVE_RPCS)}, got {r.rpc!r}")
    if plan.protocol in GRPC_PROTOCOLS and (r.replay or r.dataset or r.lengths):
        given = next(k for k in ("replay", "dataset", "lengths") if getattr(r, k))
        raise PlanError(f"{source}: request.{given} is not for protocol {plan.protocol!r} (its requests are tensors: "
                        "request.inputs)")


PREFIX_KEYS = ("tokens", "count", "share")


CONVERSATION_KEYS = ("turns", "think_ms")


def _validate_llm_workload(plan: Plan, source: str) -> None:
    """[request.prefix], [request.conversation] and request.trace (LLM workloads): their shapes; the
    distribution tables inside a conversation are checked where they are read (workload.LengthDist)."""
    r = plan.request
    workloads = [k for k in ("prefix", "conversation", "trace", "replay") if getattr(r, k) is not None]
    if workloads and workloads != ["replay"] and plan.protocol != "openai":
        raise PlanError(f"{source}: request.{workloads[0]} is for protocol 'openai'")
    if len(workloads) > 1 and not (set(workloads) == {"prefix", "conversation"}):
        raise PlanError(f"{source}: give one of request.{', request.'.join(workloads)}")
    if r.trace and (r.dataset or r.lengths):
        raise PlanError(f"{source}: request.trace gives the lengths: give it without request.dataset or request.lengths")
    shapes = plan.load.shapes
    if shapes is not None:
        if not shapes or any(len(v) != 2 or min(v) < 1 for v in shapes):
            raise PlanError(f"{source}: load.shapes must be [input, output] token pairs >= 1, e.g. [[128, 128], "
                            f"[2048, 128]], got {shapes}")
        if plan.protocol != "openai" or r.dataset or r.lengths or r.trace or r.replay or r.conversation is not None:
            raise PlanError(f"{source}: load.shapes sets each run's prompt and output length: it needs protocol "
                            "'openai' and synthetic prompts (no dataset, lengths, trace, replay or conversation)")
    if r.trace_block_tokens < 1:
        raise PlanError(f"{source}: request.trace_block_tokens must be >= 1, got {r.trace_block_tokens}")
    if r.prefix is not None:
        p = r.prefix
        unknown = set(p) - set(PREFIX_KEYS)
        if unknown:
            raise PlanError(f"{source}: request.prefix: unknown key {sorted(unknown)[0]!r} (known: count, share, tokens)")
        for key in ("tokens", "count"):
            v = p.get(key, 1)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanError(f"{source}: request.prefix.{key} must be an integer >= 1, got {v!r}")
        share = p.get("share", 1.0)
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0.0 <= share <= 1.0:
            raise PlanError(f"{source}: request.prefix.share must be a number in [0, 1], got {share!r}")
    if r.conversation is not None:
        unknown = set(r.conversation) - set(CONVERSATION_KEYS)
        if unknown:
            raise PlanError(f"{source}: request.conversation: unknown key {sorted(unknown)[0]!r} "
                            "(known: think_ms, turns)")
        if plan.load.arrivals != "closed":
            raise PlanError(f"{source}: request.conversation needs load.arrivals = \"closed\" "
                            "(a session's next turn waits for its answer)")


def _validate_endpoint(plan: Plan, source: str) -> None:
    """[endpoint]: the shape of its keys (the files are read by check_endpoint_files)."""
    e = plan.endpoint
    if e.base_path is not None and (not e.base_path.startswith("/") or "?" in e.base_path or "#" in e.base_path):
        raise PlanError(f"{source}: endpoint.base_path must be a path starting with '/', got {e.base_path!r}")
    if e.ca_bundle and not e.verify:
        raise PlanError(f"{source}: endpoint.verify = false checks no certificate: give it or endpoint.ca_bundle, not both")
    if e.server_name is not None and not _SERVER_NAME.match(e.server_name):
        raise PlanError(f"{source}: endpoint.server_name must be a DNS name, got {e.server_name!r}")
    if e.client_key and not e.client_cert:
        raise PlanError(f"{source}: endpoint.client_key needs endpoint.client_cert (the certificate it belongs to)")
    urls = [u for u in (plan.target, plan.metrics_url) if u]
    if e.tls_keys() and not any(u.startswith(("https://", "grpcs://")) for u in urls):
        raise PlanError(f"{source}: endpoint.{e.tls_keys()[0]} is for TLS, but the target is not https:// or "
                        f"grpcs:// ({plan.target})")
    seen: dict[str, str] = {}
    for key in ("headers", "headers_env"):
        for name, value in (getattr(e, key) or {}).items():
            if not _HEADER_NAME.match(name):
                raise PlanError(f"{source}: endpoint.{key}: {name!r} is not a valid header name")
            if not isinstance(value, str) or "\r" in value or "\n" in value:
                raise PlanError(f"{source}: endpoint.{key}.{name} must be a one-line string, got {value!r}")
            if key == "headers_env" and not _ENV_NAME.match(value):
                raise PlanError(f"{source}: endpoint.headers_env.{name} must name an environment variable, got {value!r}")
            if name.lower() in seen:
                raise PlanError(f"{source}: header {name!r} is given twice (endpoint.{seen[name.lower()]} and endpoint.{key})")
            seen[name.lower()] = key
    if "authorization" in seen and plan.request.api_key_env:
        raise PlanError(f"{source}: request.api_key_env sets Authorization; endpoint.{seen['authorization']} sets it too")


def check_endpoint_files(plan: Plan, source: str = "plan") -> None:
    """[endpoint]'s files exist, can be read and hold what they should (a CA bundle, a client
    certificate and its key); PlanError with one line naming the key, the file and the fault."""
    e = plan.endpoint
    for key in ("ca_bundle", "client_cert", "client_key"):
        path = getattr(e, key)
        if path is None:
            continue
        p = Path(path)
        if not p.is_file():
            raise PlanError(f"{source}: endpoint.{key}: {path}: no such file")
        if not os.access(p, os.R_OK):
            raise PlanError(f"{source}: endpoint.{key}: {path}: not readable")
    if e.ca_bundle:
        try:
            ssl.create_default_context(cafile=e.ca_bundle)
        except ssl.SSLError as err:
            raise PlanError(f"{source}: endpoint.ca_bundle: {e.ca_bundle}: no PEM certificate in it ({err.reason or err})") from None
    if e.client_cert:
        try:
            ssl.create_default_context().load_cert_chain(e.client_cert, e.client_key)
        except ssl.SSLError as err:
            what = f"{e.client_cert} and {e.client_key}" if e.client_key else e.client_cert
            raise PlanError(f"{source}: endpoint.client_cert: {what}: not a PEM certificate with its private key "
                            f"({err.reason or err})") from None


def plan_from_dict(data: dict[str, Any], source: str = "plan") -> Plan:
    search_conflicts(data, source)
    plan = _fill(source, Plan, data, "")
    _validate(plan, source)
    _validate_gates(plan, source)
    return plan


def load_plan(path: str | Path | None, overrides: dict[str, Any] | None = None) -> Plan:
    """Read a plan file (or start from defaults) and apply dotted overrides like {"load.steps": [1, 2]}."""
    data: dict[str, Any] = {}
    source = "plan"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise PlanError(f"{source}: no such file") from None
        except tomllib.TOMLDecodeError as e:
            raise PlanError(f"{source}: not valid TOML ({e})") from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        table = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            table = table.setdefault(p, {})
        table[leaf] = value
    plan = plan_from_dict(data, source)
    check_endpoint_files(plan, source)
    return plan
