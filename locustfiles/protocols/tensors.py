"""Synthetic tensor inputs shared by the tensor protocols (kserve, torchserve, tfserving, http).

Values are seeded per user (``random``) or constant (``fixed``); integer datatypes get small
integers, BYTES short strings, BOOL booleans, floats values in [-1, 1] rounded to 4 digits
(shorter JSON, same cost to the server).
"""

from __future__ import annotations

import json
import logging
import math
import random
from typing import Any

from kneeswarm.locustfiles.protocols.base import BODY_VARIANTS, PreparedRequest

logger = logging.getLogger(__name__)

INT_TYPES = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})


def values(rng: random.Random, datatype: str, n: int, fixed: bool) -> list[Any]:
    """``n`` flat values of ``datatype``."""
    dt = datatype.upper()
    if dt in INT_TYPES:
        return [1] * n if fixed else [rng.randint(0, 100) for _ in range(n)]
    if dt == "BOOL":
        return [True] * n if fixed else [rng.random() < 0.5 for _ in range(n)]
    if dt == "BYTES":
        return ["x"] * n if fixed else [f"s{rng.randint(0, 9999)}" for _ in range(n)]
    return [0.5] * n if fixed else [round(rng.uniform(-1, 1), 4) for _ in range(n)]


def nested(flat: list[Any], shape: list[int]) -> Any:
    """``flat`` (row-major) as nested lists of ``shape``."""
    if len(shape) <= 1:
        return flat
    step = math.prod(shape[1:])
    return [nested(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def batched(shape: list[int], batch: int) -> list[int]:
    """``shape`` with its first dimension replaced by ``batch`` (when batch > 1)."""
    return [batch, *shape[1:]] if batch > 1 else list(shape)


def json_tensor_requests(path: str, headers: dict[str, str], key: str, shape: list[int], request_cfg: dict,
                         seed: int, items: int) -> list[PreparedRequest]:
    """POST bodies ``{key: <tensor of shape>}`` (TorchServe's "data", TF Serving's "instances"):
    one when the plan's data is ``fixed``, else BODY_VARIANTS seeded per user."""
    dtype = str(request_cfg.get("datatype", "FP32"))
    rng = random.Random(f"{request_cfg.get('seed', 0)}:{seed}")
    fixed = request_cfg.get("data", "random") == "fixed"
    return [
        PreparedRequest("POST", path, json.dumps(
            {key: nested(values(rng, dtype, math.prod(shape), fixed), shape)}, separators=(",", ":")
        ).encode(), headers, items=items)
        for _ in range(1 if fixed else BODY_VARIANTS)
    ]
