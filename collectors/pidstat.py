"""pidstat (sysstat): per-process and per-thread CPU, memory and context switches.

Command: ``pidstat -H -h -u -r -w -t -p PID 1`` with ``LC_ALL=C S_TIME_FORMAT=ISO``. ``-H`` (sysstat
>= 11.6) prints the Time column as epoch seconds; without it the column is HH:MM:SS and the date
comes from the banner line (``Linux ... 2026-11-30 ...``), rolling over at midnight.

Parsing is by header name: a header is any line holding ``Command`` and one of PID/TGID/TID; it may
repeat (``-h`` prints one before every interval) and several headers may cover the same interval
(``-u``, ``-r``, ``-w`` without ``-h`` print one section each): fields of the same (time, TGID, TID)
are merged. With ``-t`` the process row has TID ``-`` and each thread row has TGID ``-`` and command
``|__name`` and follows its process row (sysstat 10 printed ``0`` instead of ``-``). ``Average:``
lines are ignored.

Tables:

* ``process``: one row per interval per process, from the process (TGID) row, except:
  ``threads`` = number of thread rows in that interval (NaN without ``-t``); ``cswch_s`` and
  ``nvcswch_s`` = sum over the thread rows when there are any (the kernel's per-process counters in
  /proc/PID/status are those of the main thread only); ``wait_pct`` likewise = sum over the thread
  rows (the process row's %wait is the main thread's run delay, /proc/PID/schedstat); ``migrations_s`` = number of threads whose
  CPU column (the core it last ran on) changed since the previous interval, divided by the time
  between the two intervals: the cache-affinity signal (NaN on the first interval and without -t).
* ``threads``: one row per thread per interval.
"""
from __future__ import annotations

import logging
from datetime import date, datetime, timedelta, tzinfo

import pandas as pd

from collectors.base import (BASE_ENV, NAN, PROCESS_COLUMNS, THREAD_COLUMNS, Collector, Parsed,
                             frame, local_epoch, split_hms, to_float)

logger = logging.getLogger(__name__)

#: sysstat version from which pidstat knows -H (epoch timestamps).
EPOCH_OPTION_SINCE = (11, 6)
#: Prefix pidstat -t puts before a thread's command name.
THREAD_PREFIX = "|__"
#: What stands for "no id" in the TGID/TID columns: "-" (sysstat >= 11) or "0" (sysstat 10).
NO_ID = ("-", "0")
#: Header names -> short field keys (older sysstat printed %user).
FIELDS = {"%usr": "usr", "%user": "usr", "%system": "sys", "%wait": "wait", "%CPU": "cpu",
          "CPU": "core", "minflt/s": "minflt", "majflt/s": "majflt", "VSZ": "vsz", "RSS": "rss",
          "cswch/s": "cswch", "nvcswch/s": "nvcswch"}
BANNER_DATE_FORMATS = ("%Y-%m-%d", "%m/%d/%y", "%m/%d/%Y", "%d/%m/%y", "%d/%m/%Y")
HALF_DAY_S = 43200


def _version_tuple(version: str | None) -> tuple[int, ...]:
    out = []
    for part in (version or "").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _banner_date(tokens: list[str]) -> date | None:
    for tok in tokens:
        if "-" in tok or "/" in tok:
            for fmt in BANNER_DATE_FORMATS:
                try:
                    return datetime.strptime(tok, fmt).date()
                except ValueError:
                    continue
    return None


def _seconds_of_day(tok: str, ampm: str | None) -> float | None:
    parsed = split_hms(tok, ampm)
    return None if parsed is None else parsed[0] * 3600 + parsed[1] * 60 + parsed[2]


class _Clock:
    """Turns pidstat Time tokens (epoch or HH:MM:SS) into epoch seconds."""

    def __init__(self, tz: tzinfo | None) -> None:
        self.tz = tz
        self.day: date | None = None
        self.last_sod: float | None = None

    def epoch(self, tok: str, ampm: str | None) -> float | None:
        if tok.isdigit():
            try:
                return float(tok)
            except ValueError:  # str.isdigit() also accepts digits float() rejects ("²")
                return None
        sod = _seconds_of_day(tok, ampm)
        if sod is None or self.day is None:
            return None
        if self.last_sod is not None and sod < self.last_sod - HALF_DAY_S:
            self.day += timedelta(days=1)
        self.last_sod = sod
        try:
            base = datetime(self.day.year, self.day.month, self.day.day)
            return local_epoch(base + timedelta(seconds=sod), self.tz)
        except (OverflowError, ValueError, OSError):
            return None


def parse_pidstat(text: str, tz: tzinfo | None = None) -> Parsed:
    """pidstat text -> ``process`` and ``threads`` tables. Never raises."""
    clock = _Clock(tz)
    columns: list[str] | None = None
    records: dict[tuple[float, int, int | None], dict[str, object]] = {}
    lines = skipped = 0
    last_tgid: int | None = None
    for line in text.splitlines():
        lines += 1
        tokens = line.split()
        if not tokens:
            continue
        first = tokens[0]
        if first == "Linux" or first == "Average:":
            if first == "Linux" and clock.day is None:
                clock.day = _banner_date(tokens)
            continue
        if "Command" in tokens and ("PID" in tokens or "TGID" in tokens or "TID" in tokens):
            columns = _header_columns(tokens)
            continue
        if first.startswith("#") or columns is None:
            skipped += 1
            continue
        ampm = None
        if len(tokens) > 1 and tokens[1] in ("AM", "PM"):
            ampm = tokens.pop(1)
        ncol = len(columns)
        if len(tokens) < ncol:
            skipped += 1
            continue
        row = dict(zip(columns[:-1], tokens[:ncol - 1]))
        t = clock.epoch(tokens[0], ampm)
        if t is None:
            skipped += 1
            continue
        command = " ".join(tokens[ncol - 1:])
        key = _row_key(row, last_tgid)
        if key is None:
            skipped += 1
            continue
        pid, tid = key
        if tid is None:
            last_tgid = pid
        rec = records.setdefault((t, pid, tid), {})
        rec["name"] = command[len(THREAD_PREFIX):] if command.startswith(THREAD_PREFIX) else command
        for col, val in row.items():
            k = FIELDS.get(col)
            if k is not None:
                rec[k] = to_float(val)
    process, threads = _tables(records)
    return Parsed({"process": process, "threads": threads}, lines, skipped)


def _header_columns(tokens: list[str]) -> list[str]:
    if tokens[0] == "#":
        tokens = tokens[1:]
    elif tokens[0].startswith("#"):
        tokens = [tokens[0][1:] or "Time"] + tokens[1:]
    else:  # sectioned output: the header starts with the interval's time
        tokens = ["Time"] + tokens[2 if len(tokens) > 1 and tokens[1] in ("AM", "PM") else 1:]
    return tokens


def _row_key(row: dict[str, str], last_tgid: int | None) -> tuple[int, int | None] | None:
    """(pid, tid) of a data row: tid None for a process row."""
    tgid = row.get("TGID", row.get("PID"))
    tid = row.get("TID")
    try:
        if tid is None or tid in NO_ID:
            return (int(tgid), None) if tgid is not None and tgid not in NO_ID else None
        if tgid is None or tgid in NO_ID:
            return (last_tgid, int(tid)) if last_tgid is not None else None
        return int(tgid), int(tid)
    except ValueError:
        return None


def _tables(records: dict[tuple[float, int, int | None], dict[str, object]]
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    g = lambda rec, k: rec.get(k, NAN)  # noqa: E731
    thread_rows: list[list] = []
    by_interval: dict[tuple[float, int], list[tuple[int, dict]]] = {}
    for (t, pid, tid), rec in records.items():
        if tid is None:
            continue
        by_interval.setdefault((t, pid), []).append((tid, rec))
        thread_rows.append([t, tid, rec.get("name", ""), g(rec, "cpu"), g(rec, "usr"),
                            g(rec, "sys"), g(rec, "core"), g(rec, "cswch"), g(rec, "nvcswch")])
    process_rows: list[list] = []
    prev: dict[int, tuple[float, dict[int, float]]] = {}
    for (t, pid, tid), rec in records.items():
        if tid is not None:
            continue
        ths = by_interval.get((t, pid))
        n_threads = cswch = nvcswch = migr = NAN
        wait = g(rec, "wait")
        if ths:
            n_threads = float(len(ths))
            cswch = sum(g(r, "cswch") for _, r in ths)
            nvcswch = sum(g(r, "nvcswch") for _, r in ths)
            wait = sum(g(r, "wait") for _, r in ths)  # NaN without %wait (sysstat < 11.5.5)
            cores = {tid_: g(r, "core") for tid_, r in ths}
            if pid in prev:
                t_prev, cores_prev = prev[pid]
                dt = t - t_prev
                if dt > 0:
                    moved = sum(1 for k, c in cores.items()
                                if k in cores_prev and c == c and c != cores_prev[k])
                    migr = moved / dt
            prev[pid] = (t, cores)
        else:
            cswch, nvcswch = g(rec, "cswch"), g(rec, "nvcswch")
        process_rows.append([t, pid, g(rec, "cpu"), g(rec, "usr"), g(rec, "sys"), wait,
                             g(rec, "rss") / 1024.0, g(rec, "vsz") / 1024.0, n_threads, cswch,
                             nvcswch, migr, g(rec, "minflt"), g(rec, "majflt")])
    return frame(process_rows, PROCESS_COLUMNS), frame(thread_rows, THREAD_COLUMNS)


class PidstatCollector(Collector):
    name = "pidstat"
    raw_file = "pidstat.txt"
    kind = "command"
    tables = ("process", "threads")

    def check_argv(self) -> list[str] | None:
        return ["pidstat", "-V"]

    def version_from(self, text: str) -> str | None:
        for line in text.splitlines():
            tokens = line.split()
            if "version" in tokens and tokens.index("version") + 1 < len(tokens):
                return tokens[tokens.index("version") + 1]
        return None

    def command(self, pid: int | None, interval: float,
                version: str | None = None) -> tuple[list[str], dict[str, str]] | None:
        if pid is None:
            raise ValueError("pidstat collector: a pid to monitor is required")
        argv = ["pidstat"]
        vt = _version_tuple(version)
        if not vt or vt >= EPOCH_OPTION_SINCE:
            argv.append("-H")
        argv += ["-h", "-u", "-r", "-w", "-t", "-p", str(int(pid)), str(max(1, round(interval)))]
        return argv, {**BASE_ENV, "S_TIME_FORMAT": "ISO"}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_pidstat(text, tz)


COLLECTOR = PidstatCollector()
