"""Prometheus text exposition: flat series dicts, and scrape series as a table.

An inference server's ``/metrics`` (vLLM, Triton, TGI ...) is scraped by the remote agent (stdlib
``urllib``), which writes ONE JSON OBJECT PER LINE, PER SCRAPE to ``prometheus.jsonl``::

    {"t": 1796002084.5, "url": "http://127.0.0.1:8000/metrics", "text": "<exposition text>"}
    {"t": 1796002085.5, "url": "http://127.0.0.1:8000/metrics", "error": "timed out"}

``t`` is the epoch when the scrape was sent; a failed scrape has ``error`` instead of ``text`` and
is counted as skipped.

Series keys: the sample name, plus its labels sorted by name in exposition syntax, e.g.
``vllm:num_requests_running{model_name="m"}`` or ``process_cpu_seconds_total``. Parsing uses
``prometheus_client.parser``; a scrape it rejects is re-read line by line and the bad lines are
dropped.

Table ``prometheus``: t + one column per series key seen in any scrape (NaN where absent).
"""
from __future__ import annotations

import json
import logging
from datetime import tzinfo
from typing import Iterable

import pandas as pd

from collectors.base import Collector, Parsed, finite, to_float

logger = logging.getLogger(__name__)

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover - prometheus-client is a dependency
    text_string_to_metric_families = None  # type: ignore[assignment]


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def series_key(name: str, labels: dict[str, str]) -> str:
    """``name{a="1",b="2"}`` (labels sorted), or ``name`` without labels."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(str(labels[k]))}"' for k in sorted(labels))
    return f"{name}{{{inner}}}"


def _families(text: str, out: dict[str, float]) -> None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[series_key(s.name, s.labels)] = to_float(s.value)


def parse_exposition_counted(text: str) -> tuple[dict[str, float], int]:
    """Exposition text -> (flat {series key: value}, bad lines dropped). Never raises."""
    out: dict[str, float] = {}
    if text_string_to_metric_families is None:
        return out, 0
    try:
        _families(text, out)
        return out, 0
    except Exception:  # the whole-text parse failed: salvage what can be read, line by line
        pass
    out.clear()
    bad = 0
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            _families(s + "\n", out)
        except Exception:
            bad += 1
    return out, bad


def parse_exposition(text: str) -> dict[str, float]:
    """Exposition text -> flat {series key: value}. Never raises."""
    return parse_exposition_counted(text)[0]


def scrapes_to_frame(scrapes: Iterable[tuple[float, str | dict[str, float]]]) -> pd.DataFrame:
    """(t, exposition text or flat dict) pairs -> DataFrame: t + one column per series."""
    rows = []
    for t, body in scrapes:
        flat = parse_exposition(body) if isinstance(body, str) else dict(body)
        rows.append({"t": float(t), **flat})
    if not rows:
        return pd.DataFrame({"t": pd.Series([], dtype=float)})
    df = pd.DataFrame.from_records(rows)
    return df[["t"] + [c for c in df.columns if c != "t"]]


def parse_prometheus_jsonl(text: str) -> Parsed:
    """prometheus.jsonl text -> ``prometheus`` table. Never raises."""
    rows: list[dict[str, float]] = []
    lines = skipped = 0
    for line in text.splitlines():
        lines += 1
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            skipped += 1
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
            skipped += 1
            continue
        t = to_float(rec.get("t"))
        if not finite(t):
            skipped += 1
            continue
        flat, bad = parse_exposition_counted(rec["text"])
        skipped += bad
        rows.append({"t": t, **flat})
    df = scrapes_to_frame((r.pop("t"), r) for r in rows)
    return Parsed({"prometheus": df}, lines, skipped)


class PrometheusCollector(Collector):
    name = "prometheus"
    raw_file = "prometheus.jsonl"
    kind = "sampler"
    tables = ("prometheus",)
    output_tz = None

    def parse(self, text: str, *, tz: tzinfo | None = None, t0: float | None = None,
              interval: float = 1.0) -> Parsed:
        try:
            return parse_prometheus_jsonl(text)
        except Exception:  # a parser never raises: last-resort guard
            logger.exception("prometheus parser failed")
            n = len(text.splitlines())
            return Parsed({"prometheus": pd.DataFrame({"t": pd.Series([], dtype=float)})}, n, n)


COLLECTOR = PrometheusCollector()
