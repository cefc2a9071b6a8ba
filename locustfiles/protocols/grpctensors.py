"""Tensors as the Open Inference Protocol's gRPC messages carry them, and the gRPC protocols' base.

A request's tensors go in ``raw_input_contents``, one bytes entry per input in the inputs' order,
each the tensor's values flat, row-major, little-endian (BYTES: each element a 4-byte little-endian
length and its bytes; BOOL: one byte each) -- the layout the protocol specifies for raw contents and
Triton, KServe and TorchServe read.  ``[request] contents = "typed"`` sends them in each input's
typed ``contents`` instead (``fp32_contents``, ``int_contents``, ...), for a server that reads only
those; FP16 has no typed field.  An input's values are the plan's (``[[request.inputs]] data``,
strings with ``{{prompt}}``, ``{{max_tokens}}`` or ``{{user}}`` filled) or synthetic ones as over HTTP
(tensors.values).  A request is serialized once, when the user starts (BODY_VARIANTS of them, as
the HTTP protocols pre-build their bodies): the user sends its bytes as they are.
"""

from __future__ import annotations

import array
import logging
import math
import random
import struct
import sys
from typing import Any

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import BadPayload, Protocol, ProtocolError
from kneeswarm.locustfiles.protocols.grpcbase import metadata_of
from kneeswarm.locustfiles.protocols.tensors import batched, values
from kneeswarm.locustfiles.protocols.workload import WORDS, token_counter

logger = logging.getLogger(__name__)

#: array module type codes of the fixed-size datatypes (FP16 goes through struct's "e")
ARRAY_CODES = {"FP32": "f", "FP64": "d", "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q",
               "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q"}
ITEM_SIZE = {**{k: array.array(v).itemsize for k, v in ARRAY_CODES.items()}, "FP16": 2, "BOOL": 1}
_LENGTH = struct.Struct("<I")


def raw_tensor(datatype: str, flat: list[Any]) -> bytes:
    """``flat`` values of ``datatype`` in the protocol's raw layout."""
    dt = datatype.upper()
    if dt == "BYTES":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
        return b"".join(_LENGTH.pack(len(b)) + b for b in items)
    if dt == "BOOL":
        return bytes(1 if v else 0 for v in flat)
    if dt == "FP16":
        return struct.pack(f"<{len(flat)}e", *flat)
    a = array.array(ARRAY_CODES[dt], flat)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


#: the InferTensorContents field of each datatype (``[request] contents = "typed"``); FP16 has none
TYPED_FIELDS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def typed_contents(datatype: str, flat: list[Any]) -> dict[str, list[Any]]:
    """``flat`` as the keyword of an InferTensorContents: {field: values} (BYTES: as bytes)."""
    dt = datatype.upper()
    if dt not in TYPED_FIELDS:
        raise ProtocolError(f"request.contents = \"typed\": {dt} has no typed field in the protocol (send it raw)")
    if dt == "BYTES":
        flat = [v if isinstance(v, bytes) else str(v).encode() for v in flat]
    return {TYPED_FIELDS[dt]: flat}


def bytes_elements(raw: bytes) -> list[bytes]:
    """The elements of a BYTES tensor in raw layout; BadPayload when the lengths do not add up."""
    out: list[bytes] = []
    i = 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise BadPayload(f"BYTES tensor: {len(raw) - i} stray bytes after {len(out)} elements")
        (n,) = _LENGTH.unpack_from(raw, i)
        if i + 4 + n > len(raw):
            raise BadPayload(f"BYTES tensor: element {len(out)} says {n} bytes, {len(raw) - i - 4} left")
        out.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    return out


class GrpcProtocol(Protocol):
    """A protocol spoken over gRPC: requests are serialized messages (``PreparedRequest.body``),
    sent to ``path`` ("/package.Service/Method") as ``kind`` ("unary", "unary_stream" or
    "stream_stream"); answers are ``response_type`` messages, judged by ``check_message``.
    locustfiles/grpcuser.py sends them; the conductor calls ``preflight(target)``."""

    grpc = True
    kind = "unary"
    path = ""
    response_type: Any = None

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        self.metadata = metadata_of(self.headers)
        self.timeout = float(request_cfg.get("timeout", 10.0) or 10.0)
        self.counter = token_counter(request_cfg.get("tokenizer"))
        self._rng = random.Random(f"{request_cfg.get('seed', 0)}:{seed}")

    def check_message(self, msg: Any) -> Any:
        """Raise BadPayload if ``msg`` (a ``response_type``) is not a valid answer; Tokens or None."""
        raise NotImplementedError  # pragma: no cover - interface

    def check_response(self, body: bytes) -> Any:
        """A serialized answer (the preflight's, tests'): parsed, then ``check_message``."""
        try:
            msg = self.response_type.FromString(body)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, whatever its module
            raise BadPayload(f"answer is not a {self.response_type.__name__}: {e}") from None
        return self.check_message(msg)

    # -- the tensors of a request ----------------------------------------------------------
    def prompt_text(self) -> str:
        """``request.prompt``, or ``prompt_tokens`` words drawn for this user."""
        if self.cfg.get("prompt"):
            return str(self.cfg["prompt"])
        return " ".join(self._rng.choice(WORDS) for _ in range(int(self.cfg.get("prompt_tokens", 32) or 32)))

    def input_specs(self) -> list[dict]:
        """[{name, shape, datatype, data?}] of every input, the batch applied to the shape."""
        batch = int(self.cfg.get("batch", 1) or 1)
        given = self.cfg.get("inputs") or [{"name": self.cfg.get("input_name") or "input",
                                            "shape": list(self.cfg.get("shape", [1, 64])),
                                            "datatype": self.cfg.get("datatype", "FP32")}]
        return [{**s, "shape": batched(list(s["shape"]), batch), "datatype": str(s.get("datatype", "FP32")).upper()}
                for s in given]

    def tensors(self, fixed: bool) -> tuple[list[dict], list[list[Any]], int | None]:
        """One request's inputs (name, datatype, shape), their values (flat, row-major), and the
        prompt's tokens when an input carries ``{{prompt}}``."""
        prompt = self.prompt_text()
        fills = {"{{prompt}}": prompt, "{{max_tokens}}": str(int(self.cfg.get("max_tokens", 64) or 64)),
                 "{{user}}": str(self.seed)}
        specs, flats, tokens_in = [], [], None
        batch = int(self.cfg.get("batch", 1) or 1)
        for spec in self.input_specs():
            n = math.prod(spec["shape"])
            if spec.get("data") is not None:
                flat = list(spec["data"])
                if len(flat) * batch != n:
                    raise ProtocolError(f"request.inputs ({spec['name']}): data has {len(flat)} values, its shape "
                                        f"{spec['shape']} holds {n}")
                if any(isinstance(v, str) and "{{prompt}}" in v for v in flat):
                    tokens_in = self.counter.count(prompt)
                flat = [_fill(v, fills) for v in flat] * batch
            else:
                flat = values(self._rng, spec["datatype"], n, fixed)
            specs.append({"name": spec["name"], "datatype": spec["datatype"], "shape": spec["shape"]})
            flats.append(flat)
        return specs, flats, tokens_in


def _fill(value: Any, fills: dict[str, str]) -> Any:
    if not isinstance(value, str):
        return value
    for key, text in fills.items():
        value = value.replace(key, text)
    return value
