"""Request classes: a traffic mix of several kinds of request in one run (floor 1 contract).

One endpoint rarely serves one kind of request: a Triton or KServe server serves several models,
an LLM server a base model and its LoRA adapters, a chat product short questions beside long RAG
prompts.  ``[[request.classes]]`` tables describe the mix, each with a ``name``, a ``weight`` and
any ``[request]`` key that may differ for its protocol (``CLASS_KEYS``); the plan's ``[request]``
is the default every class inherits.  Each request draws its class by weight (seeded per user:
locustfiles/protocols/mix.py), and its row records the class (the run directory's ``class``
column); the analysis gives each class its own figures, knee and findings.

Which keys may differ is the protocol's: a tensor server's requests differ by model, version and
tensor shapes, an OpenAI server's by model (vLLM, SGLang and TGI serve a LoRA adapter under its
own model name), llama.cpp's per-request ``lora`` list, lengths, prompts and datasets.  A key the
protocol does not take, and the keys that belong to the run rather than to a request (``seed``,
``timeout``, credentials, a replay, a trace, a conversation), are refused with one line.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from kneeswarm.contracts.plan import Plan, RequestPlan

logger = logging.getLogger(__name__)

#: The keys of a class table besides the [request] keys it overrides
OWN_KEYS = ("name", "weight")
_TENSOR = ("model", "version", "shape", "datatype", "batch", "data")
#: The [request] keys a class may set, per protocol: what makes one request of that protocol
#: another kind of request (its model, adapter, tensor shapes, lengths, prompts)
CLASS_KEYS: dict[str, tuple[str, ...]] = {
    "kserve": (*_TENSOR, "input_name", "inputs"),
    "kserve-grpc": (*_TENSOR, "input_name", "inputs", "contents"),
    "triton-stream": (*_TENSOR, "input_name", "inputs", "output_name", "max_tokens", "prompt", "prompt_tokens"),
    "torchserve": _TENSOR,
    "torchserve-grpc": _TENSOR,
    "tfserving": _TENSOR,
    "openai": ("model", "lora", "endpoint", "max_tokens", "prompt", "prompt_tokens", "ignore_eos", "min_tokens",
               "dataset", "lengths", "prefix"),
    "http": ("model", "path", "method", "body", "prompt", "prompt_tokens", "success_path", "data", "shape"),
}
#: Protocols whose requests can be mixed today (the gRPC ones keep one method and path per
#: channel: a mix there needs a call object per class, not written yet)
MIXABLE = ("kserve", "torchserve", "tfserving", "openai", "http")
#: [request] workloads that decide every request themselves: no mix on top of them
EXCLUSIVE = ("replay", "trace", "conversation")
#: Class names become report labels, a parquet column's values and file-name-safe keys
MAX_NAME = 64


@dataclass(frozen=True)
class RequestClass:
    """One class of a mix: its name, its weight, and the [request] settings its requests are
    built from (the plan's [request] with the class's own keys over it)."""

    name: str
    weight: float
    request: RequestPlan
    keys: tuple[str, ...] = ()  # the [request] keys the class sets itself


def shares(classes: list[RequestClass]) -> dict[str, float]:
    """Each class's expected share of the requests: its weight over the sum of weights."""
    total = sum(c.weight for c in classes)
    return {c.name: c.weight / total for c in classes} if total > 0 else {}


#: The limits a class's own SLA may set ([sla.classes.NAME]): the [sla] table's, each with its range
CLASS_SLA_KEYS = {"p99_ms": 1e308, "error_rate": 1.0, "ttft_ms": 1e308, "itl_ms": 1e308, "min_qps": 1e308}


def check_class_sla(tables: dict[str, Any] | None, names: list[str]) -> None:
    """``[sla.classes.NAME]``: each NAME a class of the mix, each table numbers within their ranges."""
    for name, table in (tables or {}).items():
        where = f"sla.classes.{name}"
        if name not in names:
            raise ClassError(f"{where}: no class {name!r} in [[request.classes]] (classes: {', '.join(names) or 'none'})")
        if not isinstance(table, dict):
            raise ClassError(f"{where} must be a table of limits ({', '.join(CLASS_SLA_KEYS)})")
        for key, v in table.items():
            if key not in CLASS_SLA_KEYS:
                raise ClassError(f"{where}: unknown key {key!r} (known: {', '.join(CLASS_SLA_KEYS)})")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= CLASS_SLA_KEYS[key]:
                raise ClassError(f"{where}.{key} must be a number >= 0{' and <= 1' if key == 'error_rate' else ''}, got {v!r}")


class ClassError(ValueError):
    """A class table that cannot be used; str() is one line (planfile adds the file's name)."""


def classes_of(plan: Plan) -> list[RequestClass]:
    """The plan's mix (empty: no ``[[request.classes]]``, one kind of request); the plan was
    validated when it was read (kneeswarm.contracts.planfile), so this raises nothing new."""
    return parse_classes(plan.request, plan.protocol)


def _as_given(where: str, value: Any, hint: Any) -> Any:
    return value


def parse_classes(request: RequestPlan, protocol: str,
                  check_type: Callable[[str, Any, Any], Any] = _as_given) -> list[RequestClass]:
    """The mix of ``request.classes`` (raw TOML tables) as RequestClass, each request merged over
    ``request``; ``check_type(where, value, hint)`` coerces a value to a RequestPlan field's
    type (planfile's checker).  Raises ClassError (one line) for: an unknown key, a key the
    protocol does not take, a missing or duplicate name, a weight that is not a number > 0."""
    tables = request.classes
    if tables is None:
        return []
    if not tables:
        raise ClassError("request.classes is empty: give at least one [[request.classes]] table, or none")
    if protocol not in MIXABLE:
        raise ClassError(f"request.classes: protocol {protocol!r} cannot mix classes yet (mixable: {', '.join(MIXABLE)})")
    if given := [k for k in EXCLUSIVE if getattr(request, k) is not None]:
        raise ClassError(f"request.classes: request.{given[0]} decides every request itself; give it without classes")
    fields = {f.name: f for f in dataclasses.fields(request)}
    allowed = CLASS_KEYS.get(protocol, ())
    out: list[RequestClass] = []
    seen: set[str] = set()
    for i, table in enumerate(tables):
        name = table.get("name")
        where = f"request.classes[{i}]" + (f" ({name})" if isinstance(name, str) and name else "")
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or name != name.strip():
            raise ClassError(f"{where}: needs a name (a non-empty string of at most {MAX_NAME} characters)")
        if name in seen:
            raise ClassError(f"{where}: the name {name!r} is given twice; each class needs its own")
        seen.add(name)
        weight = table.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            raise ClassError(f"{where}: weight must be a number > 0, got {weight!r}")
        changes: dict[str, Any] = {}
        for key, value in table.items():
            if key in OWN_KEYS:
                continue
            if key not in fields or key == "classes":
                known = ", ".join((*OWN_KEYS, *allowed))
                raise ClassError(f"{where}: unknown key {key!r} (known: {known})")
            if key not in allowed:
                raise ClassError(f"{where}: request.{key} cannot differ between classes for protocol {protocol!r} "
                                 f"(a class may set: {', '.join(allowed)})")
            changes[key] = check_type(f"{where}.{key}", value, fields[key].type)
        merged = dataclasses.replace(request, classes=None, **changes)
        out.append(RequestClass(name=name, weight=float(weight), request=merged, keys=tuple(changes)))
    return out
