"""Prometheus text exposition: flat series dicts, scrape series as a table, and the scraper.

An inference server's ``/metrics`` (vLLM, Triton, TGI ...) is scraped from the load side by
:class:`PrometheusScraper` (a thread in the conductor, 1 Hz; its ``t`` is the load machine's clock,
i.e. the master's), or by the remote agent when a host lists ``prometheus`` in its collectors.  Both
scrape with the one stdlib scraper, agents/remote/prometheus.py's ``scrape`` (bounded timeouts and
size, the same error wording), and write ONE JSON OBJECT PER LINE, PER SCRAPE to
``prometheus.jsonl``::

    {"t": 1796002084.5, "url": "http://127.0.0.1:8000/metrics", "text": "<exposition text>"}
    {"t": 1796002085.5, "url": "http://127.0.0.1:8000/metrics", "error": "timed out after 0.8s"}

``t`` is the epoch when the scrape was sent; a failed scrape has ``error`` instead of ``text`` and
is counted as skipped. ``skipped`` counts raw lines (JSON lines): a scrape whose exposition had
unreadable lines keeps what could be read and counts once, so it never exceeds ``lines``.

Series keys: the sample name, plus its labels sorted by name in exposition syntax, e.g.
``vllm:num_requests_running{model_name="m"}`` or ``process_cpu_seconds_total``. Parsing uses
``prometheus_client.parser``; a scrape it rejects is re-read line by line and the bad lines are
dropped.

Table ``prometheus``: t + one column per series key seen in any scrape (NaN where absent).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from datetime import tzinfo
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from kneeswarm.agents.remote.prometheus import scrape, scrape_timeout, tls_context
from kneeswarm.collectors.base import (Collector, HostContext, Parsed, Unavailable, finite, json_records, to_float)
from kneeswarm.contracts.rundir import PROMETHEUS_RAW

logger = logging.getLogger(__name__)

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # pragma: no cover - prometheus-client is a dependency
    text_string_to_metric_families = None  # type: ignore[assignment]

SCRAPE_INTERVAL = 1.0  # seconds between scrapes (the scraper keeps a fixed 1 Hz grid)
SCRAPE_JOIN_TIMEOUT = 5.0  # seconds ``stop`` waits for the scraper thread


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
    records, lines, skipped = json_records(text)
    for rec in records:
        if not isinstance(rec.get("text"), str):
            skipped += 1
            continue
        t = to_float(rec.get("t"))
        if not finite(t):
            skipped += 1
            continue
        flat, bad = parse_exposition_counted(rec["text"])
        skipped += 1 if bad else 0  # a scrape with unreadable exposition lines: one raw line, partly read
        rows.append({"t": t, **flat})
    df = scrapes_to_frame((r.pop("t"), r) for r in rows)
    return Parsed({"prometheus": df}, lines, skipped)


class PrometheusCollector(Collector):
    name = "prometheus"
    raw_file = PROMETHEUS_RAW
    kind = "sampler"
    tables = ("prometheus",)
    output_tz = None
    #: The target's metrics_url is scraped from the load side by the conductor; a host runs this
    #: sampler only when its ``collectors`` name it (e.g. a /metrics bound to the server's
    #: loopback), writing hosts/<host>/raw/prometheus.jsonl on that host's clock.
    default = False

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        if not ctx.metrics_url:
            raise Unavailable("no metrics_url")
        return {"url": ctx.metrics_url, **({"tls": dict(ctx.metrics_tls)} if ctx.metrics_tls else {})}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_prometheus_jsonl(text)


COLLECTOR = PrometheusCollector()


class PrometheusScraper(threading.Thread):
    """Scrapes ``url`` every ``interval`` seconds into ``path`` (JSON lines, format above).

        scraper = PrometheusScraper(url, run.raw_dir("target") / PROMETHEUS_RAW)
        scraper.start(); ...; scraper.stop()
        scraper.stats()    # {"url", "scrapes", "ok", "failed", "last_error", ...}

    A failed scrape (refused, timed out, HTTP error, too big) is written as an ``error`` line and
    counted; it never stops the scraper. Each line is flushed as it is written, so the file can be
    read during the run. Scrapes keep a fixed grid (t0 + k * interval); a slow one skips ticks
    rather than bunching up.
    """

    def __init__(self, url: str, path: str | Path, interval: float = SCRAPE_INTERVAL,
                 timeout: float | None = None, headers: dict[str, str] | None = None,
                 tls: dict[str, Any] | None = None):
        super().__init__(name="prometheus-scraper", daemon=True)
        self.url = url
        self.path = Path(path)
        self.interval = float(interval)
        self.timeout = float(timeout) if timeout is not None else scrape_timeout(self.interval)
        #: sent on each scrape (the plan's [endpoint] headers where metrics_url is the target's origin)
        self.headers = dict(headers or {})
        #: ``verify``, ``cafile``, ``cert``, ``key``, ``server_name`` (agents/remote/prometheus.py)
        tls = dict(tls or {})
        self.server_name: str | None = tls.get("server_name")
        self.context = tls_context(url, tls)
        self._stopping = threading.Event()
        self.scrapes = self.ok = self.failed = 0
        self.bytes = 0
        self.last_error: str | None = None
        self.errors: dict[str, int] = {}
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    def scrape_once(self) -> dict[str, Any]:
        """One scrape -> the JSON line's record (``text`` or ``error``). Never raises."""
        return scrape(self.url, self.headers, self.context, self.server_name, timeout=self.timeout)

    def _record(self, rec: dict[str, Any], out: Any) -> None:
        self.scrapes += 1
        if "error" in rec:
            self.failed += 1
            self.last_error = rec["error"]
            self.errors[rec["error"]] = self.errors.get(rec["error"], 0) + 1
            if self.failed == 1 or self.failed % 60 == 0:
                logger.warning("metrics %s: scrape failed (%s); %d failed so far", self.url, rec["error"], self.failed)
        else:
            self.ok += 1
            self.bytes += len(rec["text"])
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        t0 = time.monotonic()
        k = 0
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                while not self._stopping.is_set():
                    self._record(self.scrape_once(), out)
                    k = max(k + 1, int((time.monotonic() - t0) / self.interval) + 1)  # skip missed ticks
                    self._stopping.wait(max(0.0, t0 + k * self.interval - time.monotonic()))
        except OSError as e:  # the run directory itself failed: say so, the run goes on
            self.last_error = f"cannot write {self.path}: {e.strerror or e}"
            logger.error("metrics %s: %s", self.url, self.last_error)
        finally:
            self.stopped_at = time.time()

    def stop(self, timeout: float = SCRAPE_JOIN_TIMEOUT) -> dict[str, Any]:
        """Stop scraping (waits for the scrape in flight, bounded) and return ``stats()``."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "raw_file": self.path.name, "interval": self.interval, "timeout": self.timeout,
                "scrapes": self.scrapes, "ok": self.ok, "failed": self.failed, "bytes": self.bytes,
                "errors": dict(self.errors), "last_error": self.last_error,
                "started": self.started_at, "stopped": self.stopped_at}


def write_prometheus_csv(raw: str | Path, csv_path: str | Path) -> dict[str, int]:
    """Parse a prometheus.jsonl into its ``prometheus`` table as CSV (t + one column per series).

    Times are written as recorded (the load-side scraper records on the master's clock).
    Returns {"lines", "skipped", "rows", "series"}. A missing raw file gives an empty table.
    """
    raw, csv_path = Path(raw), Path(csv_path)
    text = raw.read_bytes().decode("utf-8", "replace") if raw.exists() else ""
    parsed = COLLECTOR.parse(text)
    df = parsed.frames["prometheus"]
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = csv_path.with_name(f".{csv_path.name}.tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(csv_path)
    return {"lines": parsed.lines, "skipped": parsed.skipped, "rows": len(df), "series": len(df.columns) - 1}
