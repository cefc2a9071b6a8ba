"""The run directory: the one contract between every part of kneeswarm (floor 1).

    runs/<UTC timestamp>-<name>/
      plan.toml  meta.json  steps.csv
      requests/part-*.parquet   one row per request (REQUEST_SCHEMA)
      generator/*.csv           load-generator self-metrics per worker
      hosts/<host>/raw/*        raw collector output; hosts/<host>/*.csv parsed samples
      report/                   index.html, summary.json, summary.md, junit.xml

Its file names are spelled here once, everything else imports them; meta.json's ``ended`` values
(:class:`Ended`) and the exit codes are kneeswarm.contracts.outcome's (light: the command line imports it).

Whole files (meta.json, steps.csv, request parts, parsed CSVs, the report) are written
atomically (temporary name, then rename); generator CSVs and fetched raw files grow by appends.
A run that dies half-way leaves files analysis can read, and analysis can be re-run on it later.

What went wrong is recorded, never only logged: meta.json["warnings"] (one line each, see
:class:`WarningLog`) and meta.json["lost"] ({what: count}, e.g. request rows that could not be
written); the report shows both at the top, and a run with losses is not reported as clean.
Readers never hide bad data either: :meth:`RunDir.read_request_rows` lists the parts it could
not read (with what their footers still say), and an unreadable meta.json is never
overwritten (update_meta keeps it aside as meta.json.corrupt and says so in "warnings").
meta.json is read through :meth:`RunDir.read_meta` alone, as a :class:`Meta` (so mypy checks the
keys its readers use): a value of another type than declared is left out and said in "warnings".
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, TypedDict, Unpack

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
        # streaming answers only (null otherwise; parts written before these columns read as null):
        ("itl_ms", pa.list_(pa.float32())),  # every inter-token gap, in arrival order (float32: ~µs precision)
        ("tokens_counted", pa.bool_()),  # true: tokens_out is the client's count, tokenizer else chunks (no usage)
        ("usage_out", pa.int64()),  # the server's usage.completion_tokens, when it sent one
        ("chunks_out", pa.int64()),  # text chunks the client counted itself (a chunk may carry several tokens)
        # independent output counts the server's usage is checked against (not chunks; null where not known):
        ("tokens_tokenizer", pa.int64()),  # the plan's tokenizer over the streamed text, counted by the client
        ("tokens_pinned", pa.int64()),  # the output length the request pinned (ignore_eos, or min_tokens = max_tokens)
        # LLM workloads (prefixes, conversations; null otherwise):
        ("prefix", pa.int32()),  # which shared prefix the prompt starts with ([request.prefix]), 0-based
        ("turn", pa.int32()),  # the request's turn in its conversation, from 1 ([request.conversation])
        # times the request was sent again because the server closed its kept-alive connection cleanly
        # before answering (locustfiles/users.py STALE_CONNECTION_RETRIES); null: sent once
        ("resent", pa.int32()),
        # a traffic mix ([[request.classes]]): the class the request drew; null without a mix (and in
        # parts written before the column existed)
        ("class", pa.string()),
    ]
)
REQUEST_COLUMNS = tuple(REQUEST_SCHEMA.names)

ERROR_CATEGORIES = (
    "http_4xx",
    "http_429",  # pushback: the server's bounded queue said no (a saturation signal, not a bug)
    "http_5xx",
    "timeout",
    "conn_refused",
    "conn_reset",
    "bad_payload",
    "stream_truncated",
    "dropped",  # open loop: an arrival beyond the in-flight cap, never sent
    "other",
    "bad_latency",  # given by analysis to a row marked ok whose latency is not a finite number >= 0
)

# -- file names: the one place they are spelled (readers and writers import them) ---------------
PLAN_FILE = "plan.toml"
META_FILE = "meta.json"
STEPS_FILE = "steps.csv"
SUMMARY_JSON = "summary.json"  # report/
SUMMARY_MD = "summary.md"  # report/
REPORT_HTML = "index.html"  # report/
JUNIT_FILE = "junit.xml"  # report/ (and the comparison's folder)
SWEEP_JSON = "sweep.json"  # <out>/<stamp>-<name>-shapes/: a [load] shapes sweep (analysis/runs/shapes.py), with its index.html
# <out>/<stamp>-<name>-repeat/: `run --repeat N` (analysis/runs/repeat.py): the merged result of
# the N run directories beside it, with its index.html
REPEAT_JSON, REPEAT_MD = "repeat.json", "repeat.md"
REPEAT_SUFFIX = "-repeat"  # the merged result's folder: <stamp>-<name> and this
COMPARE_DIR = "compare"  # report/compare/: `kneeswarm compare`'s default output folder
COMPARE_JSON, COMPARE_MD, COMPARE_HTML = "compare.json", "compare.md", "compare.html"
RECORDER_FILE = "recorder.json"  # generator/recorder.json: what the master's recording could not write
MASTER_FILE = "master.json"  # generator/master.json: the master's workers and test, from Locust's events
PROMETHEUS_RAW = "prometheus.jsonl"  # hosts/<host>/raw/: one JSON line per scrape of a /metrics


STEP_COLUMNS = ("index", "users", "t_ramp", "t_steady", "t_end")
STEP_TIME_COLUMNS = STEP_COLUMNS[2:]
# hold = "auto" (empty otherwise): t_cut, where the step's steady data begin (its warm-up cut, epoch s);
# hold_reason, why it ended at max_hold without being steady and known, or (a note, not a flaw: the
# step stays valid) that it began with one of HOLD_NOTES: SCALING_CERTAIN, a search's growth probe that
# ended once its scaling verdict was certain, before its P99 was known
# (kneeswarm.launch.search.SearchDriver.may_end); QPS_KNOWN_AT_MAX_HOLD, a step that reached max_hold
# steady and with its QPS known, its P99 from fewer rows than its interval needs
# (kneeswarm.locustfiles.steady.AutoHold.decide: its QPS is a measurement, its P99's uncertainty is in
# the step's interval)
STEP_HOLD_COLUMNS = ("t_cut", "hold_reason")
SCALING_CERTAIN = "ended once its scaling was certain"
QPS_KNOWN_AT_MAX_HOLD = "steady with its QPS known at max_hold"
HOLD_NOTES = (SCALING_CERTAIN, QPS_KNOWN_AT_MAX_HOLD)
GENERATOR_COLUMNS = ("t", "cpu_pct", "rss_mb", "users", "lag_ms")
SEARCH_FILE = "search.json"  # generator/search.json: mode = "search": each probe as decided, with why (for the report)
CLOCKS_FILE = "clocks.json"  # generator/clocks.json: each worker's clock offset, measured by the master
TARGET_HOST = "target"  # hosts/<this>/ holds the target's /metrics scraped from the load side
CORRUPT_META_SUFFIX = ".corrupt"  # an unreadable meta.json is kept aside as meta.json.corrupt[.N]
MAX_WARNINGS = 200  # a WarningLog keeps the first ones; a count says how many more there were


class Meta(TypedDict, total=False):
    """meta.json: every key any part writes (``RunDir.update_meta`` takes only these; mypy checks
    the writers).  A key is only ever added: a run directory written before it lacks it, and
    readers take it as absent.  Written at the start (run_id ... versions), after preflight
    (hosts_preflight), and at the end (the rest)."""

    run_id: str  # the run directory's name
    launcher: str  # "kneeswarm run" or "locust" (a test Locust itself started)
    started: float  # epoch s, the master's clock
    started_utc: str  # ISO 8601 (kneeswarm run)
    finished: float
    complete: bool  # every step ran, nothing lost, the load ended cleanly
    ended: str  # kneeswarm.contracts.outcome.Ended's values
    target: str
    protocol: str
    load_host: str  # the load machine's hostname
    pid: int  # the Locust master's (launcher "locust")
    workers: int  # local worker processes
    versions: dict[str, str]  # python, platform, kneeswarm, locust, ...
    hosts_preflight: dict[str, Any]  # per monitored host: what the preflight found (agents)
    hosts: dict[str, Any]  # per monitored host: agent, collectors, clock, parse counts, warnings (agents)
    target_metrics: dict[str, Any] | None  # the target's /metrics scrapes (kneeswarm.launch.lifecycle)
    worker_clocks: dict[str, Any]  # each worker's clock offset (kneeswarm.locustfiles.clocks)
    workers_lost: list[dict[str, Any]]  # workers that went missing: {worker, t, step}
    lost: dict[str, int]  # what could not be kept: {what: count}
    warnings: list[str]  # one line each (WarningLog)


def _json_types(hint: Any) -> tuple[type, ...]:
    """The JSON value types a :class:`Meta` annotation allows: its outer type only (a dict's
    values, a list's items are not looked into); a float may be written as an integer."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return tuple(t for arg in typing.get_args(hint) for t in _json_types(arg))
    base = typing.get_origin(hint) or hint
    return (int, float) if base is float else (base,)


META_TYPES = {key: _json_types(hint) for key, hint in typing.get_type_hints(Meta).items()}


def meta_from_json(raw: dict[str, Any]) -> tuple[Meta, list[str]]:
    """meta.json's object as :class:`Meta`, and a line for each declared key left out because its
    value is not of the declared type (a hand-edited or foreign file; JSON's true is no number).
    Keys no version declared are left out too: no reader knows them (update_meta keeps them)."""
    meta: dict[str, Any] = {}
    wrong = []
    for key, value in raw.items():
        allowed = META_TYPES.get(key)
        if allowed is None:
            continue
        if isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed):
            meta[key] = value
        else:
            wrong.append(f"meta.json: {key!r} is a JSON {_json_name(value)}, not "
                         f"{' or '.join(dict.fromkeys(map(_json_name, allowed)))}; "
                         "left out")
    return typing.cast(Meta, meta), wrong


def _json_name(value: Any) -> str:
    """JSON's name for a Python value or type: "object", "array", "string", "number", ..."""
    t = value if isinstance(value, type) else type(value)
    return {dict: "object", list: "array", str: "string", int: "number", float: "number",
            bool: "true/false", type(None): "null"}.get(t, t.__name__)


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


@dataclass
class UnreadablePart:
    """A request part that could not be read: what is known of the rows it held."""

    path: Path
    error: str
    rows: int | None = None  # from the part's footer, when that could be read
    t_range: tuple[float, float] | None = None  # min/max t_start from the footer's statistics
    step_range: tuple[int, int] | None = None  # min/max step from the footer's statistics

    def line(self) -> str:
        rows = f"{self.rows:,} rows" if self.rows is not None else "an unknown number of rows"
        if self.step_range is not None:
            where = f"steps {self.step_range[0]}..{self.step_range[1]}"
        elif self.t_range is not None:
            where = f"t_start {self.t_range[0]:.3f}..{self.t_range[1]:.3f}"
        else:
            where = "time range unknown"
        return f"requests/{self.path.name}: unreadable ({self.error}); {rows} lost ({where})"


@dataclass
class RequestRows:
    """All readable request rows, and the parts that could not be read."""

    frame: pd.DataFrame
    unreadable: list[UnreadablePart] = field(default_factory=list)


def footer_range(meta: pq.FileMetaData, column: str) -> tuple[float, float] | None:
    """(min, max) of a column over all row groups from the footer's statistics, else None."""
    if column not in meta.schema.names:
        return None
    j = meta.schema.names.index(column)
    lo, hi = [], []
    for i in range(meta.num_row_groups):
        st = meta.row_group(i).column(j).statistics
        if st is None or not st.has_min_max:
            return None
        lo.append(st.min)
        hi.append(st.max)
    return (min(lo), max(hi)) if lo else None


def unreadable_part(path: Path, error: Exception) -> UnreadablePart:
    """What the footer of an unreadable part still says (nothing when the footer is torn too)."""
    part = UnreadablePart(path, str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception:  # a torn footer: the part's rows and times are unknown
        return part
    part.rows = int(meta.num_rows)
    t = footer_range(meta, "t_start")
    step = footer_range(meta, "step")
    part.t_range = (float(t[0]), float(t[1])) if t else None
    part.step_range = (int(step[0]), int(step[1])) if step else None
    return part


class RunDirError(ValueError):
    """A path that is not a usable run directory; str() is the one-line message."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    """Write a text file (UTF-8) atomically."""
    _atomic_write_bytes(path, text.encode("utf-8"))


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


def read_csv_latest(path: Path, tail: int = 65536) -> pd.DataFrame | None:
    """The rows of a CSV with a ``t`` column (rows in time order) at its latest ``t``, read from the
    file's end: the tail read grows until it begins before that sample's first row, so a sample of
    any number of rows comes whole.  A last line still being appended is left out.  None when the
    file is missing, empty or unreadable, or has no ``t``."""
    try:
        with path.open("rb") as f:
            header = f.readline()
            size = f.seek(0, os.SEEK_END)
            while True:
                start = max(len(header), size - tail)
                f.seek(start)
                body = f.read(size - start)
                body = body[:body.rfind(b"\n") + 1]
                if start > len(header):
                    body = body[body.find(b"\n") + 1:]  # the first line read may be cut
                df = pd.read_csv(io.BytesIO(header + body))
                if df.empty or "t" not in df.columns:
                    return None
                last = df["t"].max()
                if start == len(header) or (df["t"] < last).any():
                    return df[df["t"] == last].reset_index(drop=True)
                tail *= 4
    except (OSError, ValueError):  # pandas' parser errors are ValueErrors
        return None


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
        if not (p / META_FILE).exists() and not (p / "requests").is_dir():
            raise RunDirError(f"{path}: not a kneeswarm run directory (no meta.json, no requests/)")
        return cls(p)

    # -- paths ---------------------------------------------------------------------------
    plan_path = property(lambda self: self.path / PLAN_FILE)
    meta_path = property(lambda self: self.path / META_FILE)
    steps_path = property(lambda self: self.path / STEPS_FILE)
    requests_dir = property(lambda self: self.path / "requests")
    generator_dir = property(lambda self: self.path / "generator")
    hosts_dir = property(lambda self: self.path / "hosts")
    report_dir = property(lambda self: self.path / "report")
    summary_path = property(lambda self: self.report_dir / SUMMARY_JSON)
    summary_md_path = property(lambda self: self.report_dir / SUMMARY_MD)
    report_path = property(lambda self: self.report_dir / REPORT_HTML)
    junit_path = property(lambda self: self.report_dir / JUNIT_FILE)

    def host_dir(self, host: str) -> Path:
        return self.hosts_dir / safe_name(host)

    def raw_dir(self, host: str) -> Path:
        return self.host_dir(host) / "raw"

    def host_table_path(self, host: str, table: str, collector: str | None = None) -> Path:
        """hosts/<host>/<table>.csv, or <table>.<collector>.csv for a table that another,
        preferred collector also gave (see :func:`split_table_name`)."""
        return self.host_dir(host) / (f"{table}.csv" if collector is None else f"{table}.{collector}.csv")

    # -- meta.json -----------------------------------------------------------------------
    def _load_meta(self) -> tuple[dict[str, Any], str | None]:
        """(meta.json's dict, None), ({}, None) when missing, or ({}, why) when unreadable."""
        try:
            meta = json.loads(self.meta_path.read_bytes())
        except FileNotFoundError:
            return {}, None
        except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return {}, f"{type(e).__name__}: {e}"
        if not isinstance(meta, dict):
            return {}, f"a JSON {type(meta).__name__}, not an object"
        return meta, None

    def read_meta(self) -> Meta:
        """meta.json as :class:`Meta` ({} when missing): the one reader of meta.json.  An unreadable
        one reads as {"complete": False, "warnings": [why]}, and the file is left as it is; a key
        whose value is not of its declared type is left out and said in "warnings" (see
        :func:`meta_from_json`)."""
        raw, problem = self._load_meta()
        if problem is not None:
            logger.warning("%s: unreadable (%s)", self.meta_path, problem)
            return {"complete": False, "warnings": [f"meta.json: unreadable ({problem})"]}
        meta, wrong = meta_from_json(raw)
        if wrong:
            logger.warning("%s: %s", self.path, "; ".join(wrong))
            meta["warnings"] = meta.get("warnings", []) + wrong
        return meta

    def corrupt_meta_copies(self) -> list[Path]:
        """The unreadable meta.json files that update_meta kept aside."""
        return sorted(self.path.glob(f"{self.meta_path.name}{CORRUPT_META_SUFFIX}*"))

    def _keep_corrupt_meta(self, problem: str) -> str:
        """Move an unreadable meta.json aside (never overwriting an earlier copy); the warning line."""
        aside = self.meta_path.with_name(self.meta_path.name + CORRUPT_META_SUFFIX)
        n = 1
        while aside.exists():
            n += 1
            aside = self.meta_path.with_name(f"{self.meta_path.name}{CORRUPT_META_SUFFIX}.{n}")
        os.replace(self.meta_path, aside)
        logger.warning("%s: unreadable (%s); kept as %s", self.meta_path, problem, aside.name)
        return (f"meta.json was unreadable ({problem}); kept as {aside.name}; "
                "what it held before is missing from this meta.json")

    def update_meta(self, **changes: Unpack[Meta]) -> dict[str, Any]:
        """Merge top-level keys into meta.json (atomic rewrite).

        An unreadable meta.json is never overwritten: it is kept aside (meta.json.corrupt) and
        the new meta.json says so in "warnings" and is marked incomplete.
        """
        meta, problem = self._load_meta()
        if problem is not None:
            meta = {"complete": False, "warnings": [self._keep_corrupt_meta(problem)]}
            if isinstance(changes.get("warnings"), list):
                changes["warnings"] = meta["warnings"] + changes["warnings"]
            changes.pop("complete", None)
        meta.update(changes)
        write_json(self.meta_path, meta)
        return meta

    # -- steps.csv -----------------------------------------------------------------------
    def write_steps(self, rows: Iterable[Iterable[Any]]) -> None:
        write_csv(self.steps_path, STEP_COLUMNS + STEP_HOLD_COLUMNS, rows)

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
        try:
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk: no half-written file left behind (the rows are held)
            raise
        return path

    def read_request_rows(self) -> RequestRows:
        """All readable request rows in t_start order, and the parts that could not be read
        (with what their footers still say: rows, t_start and step ranges)."""
        tables, unreadable = [], []
        for part in self.request_parts():
            try:
                tables.append(pq.read_table(part, schema=REQUEST_SCHEMA))
            except Exception as e:  # a torn file from a crash must not stop the analysis
                bad = unreadable_part(part, e)
                logger.warning("%s", bad.line())
                unreadable.append(bad)
        if not tables:
            return RequestRows(REQUEST_SCHEMA.empty_table().to_pandas(), unreadable)
        df = pa.concat_tables(tables).to_pandas()
        return RequestRows(df.sort_values("t_start", kind="stable").reset_index(drop=True), unreadable)

    def read_requests(self) -> pd.DataFrame:
        """All readable request rows, in t_start order (see :meth:`read_request_rows` for the
        parts that could not be read)."""
        return self.read_request_rows().frame

    # -- generator/ and hosts/ -----------------------------------------------------------
    def read_generator(self) -> dict[str, pd.DataFrame]:
        return {p.stem: pd.read_csv(p) for p in sorted(self.generator_dir.glob("*.csv")) if p.stat().st_size}

    def hosts(self) -> list[str]:
        return sorted(p.name for p in self.hosts_dir.iterdir() if p.is_dir()) if self.hosts_dir.is_dir() else []

    def host_tables(self, host: str) -> dict[str, list[str | None]]:
        """{table: [collector or None, ...]} of the non-empty parsed CSVs of a host (see
        :func:`split_table_name`); None (the preferred <table>.csv) first, then by collector name."""
        out: dict[str, list[str | None]] = {}
        for path in sorted(self.host_dir(host).glob("*.csv")):
            if path.stat().st_size:
                table, collector = split_table_name(path.stem)
                out.setdefault(table, []).append(collector)
        return {t: sorted(cs, key=lambda c: (c is not None, c or "")) for t, cs in out.items()}

    def read_host_csv(self, host: str, name: str) -> pd.DataFrame | None:
        path = self.host_dir(host) / f"{name}.csv"
        if not path.exists() or path.stat().st_size == 0:
            return None
        return pd.read_csv(path)

    def read_host_csv_latest(self, host: str, name: str) -> pd.DataFrame | None:
        """The rows of hosts/<host>/<name>.csv at its latest ``t``, read from the file's end (the
        live view's: a 2-hour threads.csv is 100 MB); None when there are none."""
        return read_csv_latest(self.host_dir(host) / f"{name}.csv")
