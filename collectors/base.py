"""The one small interface every collector shares, and the helpers its parsers use.

A collector is one module holding one :class:`Collector` subclass. It says how to check that its
tool is installed (``check_argv`` / ``version_from``), what the agent runs on a given host
(``run_spec``: a ``command``, or for ``kind == "sampler"`` a sampler of agents/remote/ named by
``sampler`` with ``sampler_params``), its ``raw_file``, and how to turn the raw text into its
canonical ``tables`` (``parse``). Samplers run inside the remote agent and write JSON lines.

Parsers never raise on any text: unknown or malformed lines are skipped and counted in
``Parsed.skipped``; a parser that raises anyway gives empty tables and ``Parsed.error``. Every
table has a float ``t`` column first (Unix epoch seconds, the clock of the host that recorded it).

Canonical tables (column names exactly; the analysis and the report read these):

* ``vmstat``: t, r, b, swpd, free, buff, cache, si, so, bi, bo, in, cs, us, sy, id, wa, st (+ gu)
* ``process``: t, pid, cpu_pct, usr_pct, sys_pct, wait_pct, rss_mb, vsz_mb, threads, cswch_s,
  nvcswch_s, migrations_s, minflt_s, majflt_s, io_read_kb_s, io_write_kb_s, io_delay_pct (the
  process's own disk IO: pidstat -d; NaN where not recorded), migrations_counted (how
  migrations_s was counted: MIGRATIONS_KERNEL or MIGRATIONS_SAMPLED, below)
* ``threads``: t, tid, name, cpu_pct, usr_pct, sys_pct, core, cswch_s, nvcswch_s
* ``gpu``: t, gpu, sm_pct, mem_pct, fb_used_mb, power_w, sm_clock_mhz, mem_clock_mhz, temp_c
* ``gpu_procs``: t, gpu, pid, used_mb, sm_pct
* ``fds``: t, pid, fds (open file descriptors of the monitored service, summed over its processes)
* ``tree``: t, pid, ppid, name, role, cpu_pct, rss_mb, threads, cswch_s, nvcswch_s, wait_pct,
  cmdline: each process of the monitored service (the process found and its descendants, or its
  cgroup's processes: agents/remote/tree.py) per sample, its own figures; ``role`` (listener,
  worker, engine) where it can be told; ``cmdline`` on the first row of each pid only.  The
  ``process`` table holds the service's sums (``pid``: the process found).

Wall-clock timestamps (vmstat -t, dmon -o DT, query-gpu, pidstat without -H) carry no zone. The
commands built here pin the tool's zone with ``TZ=UTC0`` (see ``Collector.output_tz``); a parser
given ``tz=None`` uses the zone the output itself names (vmstat's header says ``UTC``), else the
local zone of the machine that parses. :func:`collectors.parse_raw` passes ``output_tz`` for you.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping

import pandas as pd

logger = logging.getLogger(__name__)

#: The zone commands built here pin their tool's clock to (POSIX form: works without tzdata).
PINNED_TZ_ENV = "UTC0"
#: Environment every command gets: C locale (dots, 24-hour clock, English headers), UTC clock.
BASE_ENV: dict[str, str] = {"LC_ALL": "C", "TZ": PINNED_TZ_ENV}

NAN = float("nan")

PROCESS_COLUMNS = ["t", "pid", "cpu_pct", "usr_pct", "sys_pct", "wait_pct", "rss_mb", "vsz_mb",
                   "threads", "cswch_s", "nvcswch_s", "migrations_s", "minflt_s", "majflt_s",
                   "io_read_kb_s", "io_write_kb_s", "io_delay_pct", "migrations_counted"]
#: ``migrations_counted`` of a process row: how its ``migrations_s`` was counted -- by the kernel's
#: own counter (se.nr_migrations of /proc/PID/task/TID/sched, the /proc sampler), or sampled: the
#: threads whose CPU changed between two samples (pidstat; the /proc sampler where no ``sched``
#: file is readable), at most one per thread per sample, a lower bound.  NaN: no migration figure.
MIGRATIONS_KERNEL = 1.0
MIGRATIONS_SAMPLED = 0.0
THREAD_COLUMNS = ["t", "tid", "name", "cpu_pct", "usr_pct", "sys_pct", "core", "cswch_s",
                  "nvcswch_s"]
GPU_COLUMNS = ["t", "gpu", "sm_pct", "mem_pct", "fb_used_mb", "power_w", "sm_clock_mhz",
               "mem_clock_mhz", "temp_c"]
GPU_PROC_COLUMNS = ["t", "gpu", "pid", "used_mb", "sm_pct"]
FDS_COLUMNS = ["t", "pid", "fds"]
TREE_COLUMNS = ["t", "pid", "ppid", "name", "role", "cpu_pct", "rss_mb", "threads", "cswch_s", "nvcswch_s",
                "wait_pct", "cmdline"]
VMSTAT_COLUMNS = ["t", "r", "b", "swpd", "free", "buff", "cache", "si", "so", "bi", "bo", "in",
                  "cs", "us", "sy", "id", "wa", "st"]
#: The columns of each canonical table (an empty table still has them); others: just "t".
TABLE_COLUMNS = {"process": PROCESS_COLUMNS, "threads": THREAD_COLUMNS, "gpu": GPU_COLUMNS,
                 "gpu_procs": GPU_PROC_COLUMNS, "vmstat": VMSTAT_COLUMNS, "dmon": ["t", "gpu"],
                 "fds": FDS_COLUMNS, "tree": TREE_COLUMNS}

Kind = Literal["command", "sampler"]


@dataclass(frozen=True)
class Parsed:
    """What a parser returns: tables by canonical name, lines read, lines skipped, and the error
    of a parser that raised (its tables are then empty: say so, never pass it off as no data)."""

    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    lines: int = 0
    skipped: int = 0
    error: str | None = None


class Unavailable(Exception):
    """Why a collector cannot run on a host (one line, e.g. "not installed", "no GPU found")."""


@dataclass(frozen=True)
class HostContext:
    """What a collector may look at to decide how (and whether) it runs on one host."""

    facts: Mapping[str, Any]  # ``remote.pyz preflight`` output
    pid: int | None  # the monitored process (None: host-wide collectors only)
    interval: float  # seconds between samples
    metrics_url: str | None = None  # a Prometheus /metrics the host's agent may scrape
    metrics_tls: Mapping[str, Any] | None = None  # how it is reached: {verify, cadata, headers} (kneeswarm.agents.settings)
    #: which processes are the service (agents/remote/tree.py SCOPES): the process found and its
    #: descendants ("tree"), its cgroup's processes ("cgroup"), or it alone ("process")
    scope: str = "tree"
    port: int | None = None  # the service's TCP port where known (a listener is told by it)

    @property
    def has_gpu(self) -> bool:
        return bool(self.facts.get("gpus")) or bool((self.facts.get("nvml") or {}).get("available"))


@dataclass(frozen=True)
class RunSpec:
    """What the agent runs for one collector: a command (argv + env) or a named sampler of
    ``agents/remote/`` (``SAMPLERS``) with its keyword parameters; plain JSON either way."""

    name: str
    raw_file: str
    interval: float
    argv: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    sampler: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    version: str | None = None

    def to_agent(self) -> dict[str, Any]:
        """The entry of agent.json["collectors"] that ``remote.pyz`` reads."""
        out: dict[str, Any] = {"name": self.name, "raw_file": self.raw_file, "interval": self.interval}
        if self.argv is not None:
            out.update(argv=list(self.argv), env=dict(self.env))
        else:
            out.update(sampler=self.sampler, params=dict(self.params))
        return out


class Collector:
    """Base of every collector: override the class attributes and the methods that apply.

    The same verbs for every collector: ``check_argv``/``version_from`` (is it installed),
    ``run_spec`` (what the agent runs here: ``command`` or ``sampler_params``), ``raw_file``,
    ``parse`` and ``tables``. Selection and the remote agent read these and name no collector.
    """

    name: str = ""
    raw_file: str = ""
    kind: Kind = "command"
    #: Tables ``parse`` returns (always present, possibly empty).
    tables: tuple[str, ...] = ()
    #: Zone of the wall-clock timestamps in output produced by ``command()`` (None: epoch only).
    output_tz: tzinfo | None = timezone.utc
    #: Runs on every host unless its ``collectors`` list says otherwise (False: only when listed).
    default: bool = True
    #: Reads a GPU: skipped quietly on a host where preflight found none.
    needs_gpu: bool = False
    #: For samplers: the name of the sampler ``agents/remote/`` implements (default: ``name``).
    sampler: str | None = None
    #: A stand-in: by default it runs only where this other collector cannot (listing both runs both).
    instead_of: str | None = None

    def run_spec(self, ctx: HostContext) -> RunSpec:
        """What the agent runs for this collector on the host ``ctx`` describes; Unavailable if
        it cannot run there."""
        if self.needs_gpu and not ctx.has_gpu:
            raise Unavailable("no GPU found")
        if self.kind == "sampler":
            params = self.sampler_params(ctx)
            return RunSpec(self.name, self.raw_file, ctx.interval, sampler=self.sampler or self.name,
                           params=params, version=self.sampler_version(ctx))
        tool = (ctx.facts.get("tools") or {}).get(self.name) or {}
        if not tool.get("found"):
            raise Unavailable(tool.get("error") or "not installed")
        if tool.get("rc") != 0:
            raise Unavailable(tool.get("error") or f"{' '.join(self.check_argv() or [])} exited {tool.get('rc')}")
        version = self.version_from(tool.get("output") or "")
        try:
            cmd = self.host_command(ctx, version)
        except Exception as e:  # e.g. pidstat without a pid to monitor
            raise Unavailable(str(e)) from None
        if cmd is None:
            raise Unavailable("no command for this host")
        argv, env = cmd
        return RunSpec(self.name, self.raw_file, ctx.interval, argv=list(argv), env=dict(env or {}),
                       version=version)

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        """Keyword parameters of the remote sampler (samplers only); Unavailable if it cannot run."""
        return {}

    def host_command(self, ctx: HostContext, version: str | None) -> tuple[list[str], dict[str, str]] | None:
        """What runs on the host ``ctx`` describes: ``command`` by default; a collector that
        follows the service's processes (pidstat) reads the scope here."""
        return self.command(ctx.pid, ctx.interval, version)

    @staticmethod
    def process_params(ctx: HostContext) -> dict[str, Any]:
        """{pid} for a sampler that reads the monitored process in /proc; Unavailable without one."""
        if ctx.pid is None:
            raise Unavailable("no monitored process (give pid, process or port)")
        if not ctx.facts.get("procfs"):
            raise Unavailable("/proc is not available")
        return {"pid": ctx.pid}

    def sampler_version(self, ctx: HostContext) -> str | None:
        """The version of what the sampler reads, from the preflight facts (None: unknown)."""
        return None

    def check_argv(self) -> list[str] | None:
        """argv that exits 0 and prints the tool's version when it is installed (None: sampler)."""
        return None

    def version_from(self, text: str) -> str | None:
        """The version in the output of ``check_argv`` (None when not found)."""
        return None

    def command(self, pid: int | None, interval: float,
                version: str | None = None) -> tuple[list[str], dict[str, str]] | None:
        """argv and extra environment that run the tool (None for samplers).

        ``version`` (from ``version_from``) lets a collector adapt to an older tool.
        """
        return None

    def parse(self, text: str, *, tz: tzinfo | None = None, t0: float | None = None,
              interval: float = 1.0) -> Parsed:
        """Raw text -> canonical tables. Never raises.

        tz: zone of wall-clock timestamps in ``text`` (None: named by the output, else local).
        t0, interval: epoch of the first sample and seconds between samples, for output that
        carries no timestamps at all (dmon without ``-o DT``); without t0 such rows get t = NaN.
        """
        try:
            return self.parse_text(text, tz, t0, interval)
        except Exception as e:  # a parser never raises: last-resort guard (the fuzz tests watch for it)
            logger.exception("%s parser failed", self.name)
            n = len(text.splitlines())
            return Parsed({t: frame([], TABLE_COLUMNS.get(t, ["t"])) for t in self.tables}, n, n,
                          error=f"{type(e).__name__}: {e}"[:300])

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        """The collector's parser proper; ``parse`` guards it."""
        raise NotImplementedError

    def parse_file(self, path: Path, *, tz: tzinfo | None = None, t0: float | None = None,
                   interval: float = 1.0) -> Parsed:
        """``parse`` of a raw file's text (UTF-8, bad bytes replaced); the same tables. Never raises
        (an unreadable file: OSError, as reading it would)."""
        try:
            return self.parse_file_unguarded(path, tz, t0, interval)
        except OSError:
            raise
        except Exception as e:  # the same last-resort guard as ``parse``
            logger.exception("%s parser failed", self.name)
            n = len(_read_text(path).splitlines())
            return Parsed({t: frame([], TABLE_COLUMNS.get(t, ["t"])) for t in self.tables}, n, n,
                          error=f"{type(e).__name__}: {e}"[:300])

    def parse_file_unguarded(self, path: Path, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        """The whole text at once; a collector whose files grow large reads them a piece at a time."""
        return self.parse_text(_read_text(path), tz, t0, interval)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.kind}) -> {self.raw_file}>"


# ---- helpers shared by the parsers ---------------------------------------------------------

def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "replace")


def whole_line_pieces(path: Path, piece: int) -> Iterator[str]:
    """A raw file's text (UTF-8, bad bytes replaced) about ``piece`` characters at a time, each
    piece ending just after a newline (no line, nor a CR LF pair, is cut; the last piece holds
    whatever follows the last newline): for the stream parsers, which never hold the whole text."""
    rest = ""
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        while chunk := f.read(piece):
            text = rest + chunk
            cut = text.rfind("\n") + 1
            if cut:
                yield text[:cut]
            rest = text[cut:]
    if rest:
        yield rest


def to_float(s: object) -> float:
    """A number from a token; '-', 'N/A', garbage -> NaN. Never raises."""
    if not isinstance(s, (int, float, str)):
        return NAN
    try:
        return float(s)
    except (ValueError, OverflowError):
        return NAN


def json_records(text: str) -> tuple[list[dict], int, int]:
    """JSON-lines text -> (the lines that are JSON objects, lines read, lines skipped).

    Blank lines are read but neither kept nor skipped. Never raises.
    """
    records: list[dict] = []
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
        if isinstance(rec, dict):
            records.append(rec)
        else:
            skipped += 1
    return records, lines, skipped


def finite(x: float) -> bool:
    return not math.isnan(x) and not math.isinf(x)


def local_epoch(dt: datetime, tz: tzinfo | None) -> float:
    """Naive wall-clock ``dt`` in zone ``tz`` (None: local zone of this machine) -> epoch seconds."""
    if tz is None:
        return dt.timestamp()  # naive datetimes are taken as local time
    return dt.replace(tzinfo=tz).timestamp()


def frame(rows: Iterable[dict] | list[list] | dict[str, list], columns: list[str],
          ints: tuple[str, ...] = ("pid", "tid", "gpu")) -> pd.DataFrame:
    """DataFrame with exactly ``columns`` (in order) from dict rows, list rows or a dict of column
    lists (the cheapest for many rows); the ``ints`` columns become int64 when they hold no NaN."""
    if isinstance(rows, dict):
        df = pd.DataFrame(rows, columns=columns)
    else:
        listed: list[Any] = list(rows)
        if listed and isinstance(listed[0], dict):
            df = pd.DataFrame.from_records(listed, columns=columns)
        else:
            df = pd.DataFrame(listed, columns=columns)
    if df.columns.duplicated().any():  # a garbled header can name a column twice
        df = df.loc[:, ~df.columns.duplicated()]
    if "t" in df.columns:
        df["t"] = pd.to_numeric(df["t"], errors="coerce").astype(float)
    for c in ints:
        if c in df.columns:
            col = pd.to_numeric(df[c], errors="coerce")
            if len(col) == 0 or (col.notna().all() and (col.abs() < 2 ** 62).all()
                                 and (col == col.round()).all()):
                df[c] = col.astype("int64")
    return df


def split_hms(tok: str, ampm: str | None = None) -> tuple[int, int, float] | None:
    """"HH:MM:SS[.fff]" (with an AM/PM marker when given) -> (h, m, s) on a 24-hour clock, or None."""
    parts = tok.split(":")
    if len(parts) != 3:
        return None
    try:
        h, m, s = int(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        return None
    if ampm is not None:
        h = h % 12 + (12 if ampm == "PM" else 0)
    if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 61):
        return None
    return h, m, s


def zone_from_name(name: str | None) -> tzinfo | None:
    """A tzinfo for a zone abbreviation printed by a tool, only when unambiguous (UTC/GMT)."""
    if name and name.upper() in ("UTC", "GMT", "Z", "UTC0"):
        return timezone.utc
    return None


class WallClock:
    """Fast wall-clock (date string + "HH:MM:SS[.fff]") -> epoch, in zone ``tz`` (None: local).

    strptime is slow on hours of 1 Hz data: the epoch of each (date, hour) is computed once and
    minutes and seconds are added to it (zone changes happen on hour boundaries).
    """

    def __init__(self, tz: tzinfo | None, date_format: str) -> None:
        self.tz = tz
        self.date_format = date_format
        self._cache: dict[tuple[str, int], float | None] = {}

    def epoch(self, day: str, hms: str) -> float | None:
        parsed = split_hms(hms)
        if parsed is None:
            return None
        h, m, s = parsed
        key = (day, h)
        base = self._cache.get(key, NAN)
        if base is not None and base != base:
            try:
                dt = datetime.strptime(day, self.date_format).replace(hour=h)
                base = local_epoch(dt, self.tz)
            except (ValueError, OverflowError, OSError):
                base = None
            self._cache[key] = base
        return None if base is None else base + m * 60 + s
