"""The run directory: the one contract between every part of kneeswarm (floor 1).

    runs/<UTC timestamp>-<name>/
      plan.toml  meta.json  steps.csv
      requests/part-*.parquet   one row per request (REQUEST_SCHEMA)
      generator/*.csv           load-generator self-metrics per worker
      hosts/<host>/raw/*        raw collector output; hosts/<host>/*.csv parsed samples
      report/                   index.html, summary.json, summary.md

Whole files (meta.json, steps.csv, request parts, parsed CSVs, the report) are written
atomically (temporary name, then rename); generator CSVs and fetched raw files grow by appends.
A run that dies half-way leaves files analysis can read, and analysis can be re-run on it later.

What went wrong is recorded, never only logged: meta.json["warnings"] (one line each, see
:class:`WarningLog`) and meta.json["lost"] ({what: count}, e.g. request rows that could not be
written); the report shows both at the top, and a run with losses is not reported as clean.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

REQUEST_SCHEMA = pa.schema(
    [
        ("t_start", pa.float64()),  # epoch seconds, master's clock
        ("latency_ms", pa.float64()),
        ("ttft_ms", pa.float64()),  # null unless streaming
        ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()),
        ("bytes", pa.int64()),
        ("ok", pa.bool_()),
        ("status", pa.int32()),  # HTTP status, 0 when no response
        ("error", pa.string()),  # category (ERROR_CATEGORIES) or null
        ("step", pa.int32()),  # index into steps.csv, -1 before the first step
        ("users", pa.int32()),  # target users of that step
        ("worker", pa.string()),
        ("name", pa.string()),
    ]
)
REQUEST_COLUMNS = tuple(REQUEST_SCHEMA.names)

ERROR_CATEGORIES = (
    "http_4xx",
    "http_5xx",
    "timeout",
    "conn_refused",
    "conn_reset",
    "bad_payload",
    "stream_truncated",
    "other",
)

STEP_COLUMNS = ("index", "users", "t_ramp", "t_steady", "t_end")
GENERATOR_COLUMNS = ("t", "cpu_pct", "rss_mb", "users", "lag_ms")
CLOCKS_FILE = "clocks.json"  # generator/clocks.json: each worker's clock offset, measured by the master
TARGET_HOST = "target"  # hosts/<this>/ holds the target's /metrics scraped from the load side
MAX_WARNINGS = 200  # a WarningLog keeps the first ones; a count says how many more there were


class WarningLog:
    """Problems that did not end a run, for meta.json["warnings"]: deduplicated, bounded, counted.

    Every part that records a warning (the conductor, each host agent) keeps one of these, so
    the limit and the "... and N more" line live in one place.
    """

    def __init__(self, limit: int = MAX_WARNINGS):
        self.limit = limit
        self.items: list[str] = []
        self.dropped = 0

    def add(self, text: str) -> None:
        if text in self.items:
            return
        if len(self.items) < self.limit:
            self.items.append(text)
        else:
            self.dropped += 1

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def to_list(self) -> list[str]:
        """The warnings, plus one line counting those beyond the limit."""
        return self.items + ([f"... and {self.dropped} more warnings"] if self.dropped else [])


class RunDirError(ValueError):
    """A path that is not a usable run directory; str() is the one-line message."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    """Write a JSON file atomically."""
    _atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())


def write_csv(path: Path, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    """Write a whole CSV file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)
    os.replace(tmp, path)


def split_table_name(stem: str) -> tuple[str, str | None]:
    """The stem of a parsed host CSV -> (table, collector or None): "process.procfs" ->
    ("process", "procfs"); "vmstat" -> ("vmstat", None)."""
    table, _, collector = stem.partition(".")
    return table, collector or None


def safe_name(text: str) -> str:
    """A name fit for a file or folder: letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "x"


class RunDir:
    """Paths and readers/writers of one run directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- creation ------------------------------------------------------------------------
    @classmethod
    def create(cls, out_root: str | Path, name: str, now: dt.datetime | None = None) -> RunDir:
        now = now or dt.datetime.now(dt.timezone.utc)
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        base = Path(out_root) / f"{stamp}-{safe_name(name)}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}.{n}")
        path.mkdir(parents=True)
        for sub in ("requests", "generator", "hosts", "report"):
            (path / sub).mkdir()
        return cls(path)

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        p = Path(path)
        if not p.is_dir():
            raise RunDirError(f"{path}: not a directory")
        if not (p / "meta.json").exists() and not (p / "requests").is_dir():
            raise RunDirError(f"{path}: not a kneeswarm run directory (no meta.json, no requests/)")
        return cls(p)

    # -- paths ---------------------------------------------------------------------------
    plan_path = property(lambda self: self.path / "plan.toml")
    meta_path = property(lambda self: self.path / "meta.json")
    steps_path = property(lambda self: self.path / "steps.csv")
    requests_dir = property(lambda self: self.path / "requests")
    generator_dir = property(lambda self: self.path / "generator")
    hosts_dir = property(lambda self: self.path / "hosts")
    report_dir = property(lambda self: self.path / "report")

    def host_dir(self, host: str) -> Path:
        return self.hosts_dir / safe_name(host)

    def raw_dir(self, host: str) -> Path:
        return self.host_dir(host) / "raw"

    def host_table_path(self, host: str, table: str, collector: str | None = None) -> Path:
        """hosts/<host>/<table>.csv, or <table>.<collector>.csv for a table that another,
        preferred collector also gave (see :func:`split_table_name`)."""
        return self.host_dir(host) / (f"{table}.csv" if collector is None else f"{table}.{collector}.csv")

    # -- meta.json -----------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any]:
        try:
            return json.loads(self.meta_path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as e:
            logger.warning("%s: unreadable (%s); treating as empty", self.meta_path, e)
            return {}

    def update_meta(self, **changes: Any) -> dict[str, Any]:
        """Merge top-level keys into meta.json (atomic rewrite)."""
        meta = self.read_meta()
        meta.update(changes)
        write_json(self.meta_path, meta)
        return meta

    # -- steps.csv -----------------------------------------------------------------------
    def write_steps(self, rows: Iterable[Iterable[Any]]) -> None:
        write_csv(self.steps_path, STEP_COLUMNS, rows)

    def read_steps(self) -> pd.DataFrame:
        if not self.steps_path.exists():
            return pd.DataFrame(columns=list(STEP_COLUMNS))
        return pd.read_csv(self.steps_path)

    # -- requests/part-*.parquet ---------------------------------------------------------
    def request_parts(self) -> list[Path]:
        return sorted(self.requests_dir.glob("part-*.parquet"))

    def write_request_part(self, columns: dict[str, Any], seq: int) -> Path:
        """Write one part file from columns (lists or numpy arrays; missing ones become nulls)."""
        n = len(next(iter(columns.values()))) if columns else 0
        arrays = [
            pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, type=f.type)
            for f in REQUEST_SCHEMA
        ]
        table = pa.Table.from_arrays(arrays, schema=REQUEST_SCHEMA)
        path = self.requests_dir / f"part-{seq:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
        return path

    def read_requests(self) -> pd.DataFrame:
        """All request rows, in t_start order; an unreadable part is skipped with a warning."""
        tables = []
        for part in self.request_parts():
            try:
                tables.append(pq.read_table(part, schema=REQUEST_SCHEMA))
            except Exception as e:  # a torn file from a crash must not stop the analysis
                logger.warning("%s: unreadable, skipped (%s)", part, e)
        if not tables:
            return REQUEST_SCHEMA.empty_table().to_pandas()
        df = pa.concat_tables(tables).to_pandas()
        return df.sort_values("t_start", kind="stable").reset_index(drop=True)

    # -- generator/ and hosts/ -----------------------------------------------------------
    def read_generator(self) -> dict[str, pd.DataFrame]:
        return {p.stem: pd.read_csv(p) for p in sorted(self.generator_dir.glob("*.csv")) if p.stat().st_size}

    def hosts(self) -> list[str]:
        return sorted(p.name for p in self.hosts_dir.iterdir() if p.is_dir()) if self.hosts_dir.is_dir() else []

    def read_host_csv(self, host: str, name: str) -> pd.DataFrame | None:
        path = self.host_dir(host) / f"{name}.csv"
        if not path.exists() or path.stat().st_size == 0:
            return None
        return pd.read_csv(path)
