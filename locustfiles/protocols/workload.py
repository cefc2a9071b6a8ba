"""Realistic inputs: prompts from a JSONL dataset, or synthetic lengths drawn from a distribution.

Dataset (``[request] dataset = "prompts.jsonl"``, a path relative to the working directory):
one JSON object per line, with ``prompt`` (a string) or ``messages`` (a chat list of
``{"role", "content"}``), and optionally ``max_tokens`` (an integer).  Blank lines are skipped;
anything else is a one-line ``WorkloadError`` naming the file and line.

Lengths (``[request.lengths]``): ``input`` and ``output`` tables, each
``{dist = "fixed" | "uniform" | "normal" | "lognormal", mean, stdev, min, max}`` in tokens;
draws are rounded to integers and clipped to [min, max] (min defaults to 1, max to 100 000).
``lognormal`` takes the mean and stdev of the lengths themselves (not of their logarithm).
Token counts here are word counts: without a tokenizer, one synthetic word stands for one token
(the demo target counts the same way; a real server's ``usage`` says how far that is off).
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locustfiles.protocols.base import ProtocolError

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
MAX_LENGTH = 100_000
_datasets: dict[str, list[dict]] = {}  # loaded once per process, shared by its users


class WorkloadError(ProtocolError):
    """A dataset or length table that cannot be used; str() is one line."""


@dataclass(frozen=True)
class LengthDist:
    dist: str = "fixed"
    mean: float = 32.0
    stdev: float = 0.0
    min: int = 1
    max: int = MAX_LENGTH

    @classmethod
    def from_table(cls, table: Any, where: str) -> LengthDist:
        if not isinstance(table, dict):
            raise WorkloadError(f"{where} must be a table like {{dist = \"normal\", mean = 128, stdev = 32}}")
        unknown = set(table) - {"dist", "mean", "stdev", "min", "max"}
        if unknown:
            raise WorkloadError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: dist, max, mean, min, stdev)")
        d = cls(**table)
        if d.dist not in DISTRIBUTIONS:
            raise WorkloadError(f"{where}.dist must be one of {', '.join(DISTRIBUTIONS)}, got {d.dist!r}")
        numbers = (d.mean, d.stdev, d.min, d.max)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in numbers):
            raise WorkloadError(f"{where}: mean, stdev, min and max must be finite numbers")
        if d.mean <= 0 or d.stdev < 0 or not 1 <= d.min <= d.max:
            raise WorkloadError(f"{where}: needs mean > 0, stdev >= 0 and 1 <= min <= max")
        return d

    def sample(self, rng: random.Random) -> int:
        """One length in [min, max]."""
        if self.dist == "fixed" or self.stdev == 0:
            x = self.mean
        elif self.dist == "uniform":  # mean +- stdev * sqrt(3) has that mean and stdev
            half = self.stdev * math.sqrt(3.0)
            x = rng.uniform(self.mean - half, self.mean + half)
        elif self.dist == "normal":
            x = rng.gauss(self.mean, self.stdev)
        else:
            x = self._lognormal(rng)
        if not math.isfinite(x):  # extreme tables (stdev >> mean) can overflow: the nearest bound
            x = self.max if x > 0 else self.min
        return int(min(max(round(x), self.min), self.max))


    def _lognormal(self, rng: random.Random) -> float:
        """A lognormal draw whose own mean and stdev are the table's (the mean where that overflows)."""
        try:
            sigma2 = math.log1p((self.stdev / self.mean) ** 2)
            return rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        except (OverflowError, ValueError):  # stdev/mean beyond float range: no shape left to draw
            return self.mean


def load_dataset(path: str) -> list[dict]:
    """The records of a JSONL prompt file (cached per process), or WorkloadError."""
    if path in _datasets:
        return _datasets[path]
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"request.dataset {path}: cannot read ({type(e).__name__}: {e})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            records.append(_record(line, f"request.dataset {path}:{number}"))
    if not records:
        raise WorkloadError(f"request.dataset {path}: no records")
    _datasets[path] = records
    return records


def _record(line: str, where: str) -> dict:
    try:
        doc = json.loads(line)
    except ValueError as e:
        raise WorkloadError(f"{where}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: each line must be a JSON object")
    prompt, messages = doc.get("prompt"), doc.get("messages")
    if isinstance(prompt, str):
        out: dict = {"prompt": prompt}
    elif isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        out = {"messages": [{"role": str(m.get("role", "user")), "content": m["content"]} for m in messages]}
    else:
        raise WorkloadError(f"{where}: needs \"prompt\" (a string) or \"messages\" (a list of {{role, content}})")
    max_tokens = doc.get("max_tokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise WorkloadError(f"{where}: max_tokens must be a positive integer")
        out["max_tokens"] = max_tokens
    return out


def words(record: dict) -> int:
    """Prompt length of a record, in words (the token approximation)."""
    if "prompt" in record:
        return len(record["prompt"].split())
    return sum(len(m["content"].split()) for m in record["messages"])
