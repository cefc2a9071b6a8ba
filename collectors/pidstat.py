"""pidstat (sysstat): per-process and per-thread CPU, memory and context switches.

Command: ``pidstat -H -h -u -r -w -d -t -p PID 1`` with ``LC_ALL=C S_TIME_FORMAT=ISO``. ``-H`` (sysstat
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
  between the two intervals: the cache-affinity signal (NaN on the first interval and without -t),
  a lower bound of the kernel's count (``migrations_counted`` = MIGRATIONS_SAMPLED).
  Disk IO (``-d``): ``io_read_kb_s`` and ``io_write_kb_s`` from the process row (kB_rd/s, kB_wr/s:
  /proc/PID/io, which counts the whole thread group); ``io_delay_pct`` = the iodelay column (clock
  ticks of block-IO delay in the interval, /proc/PID/stat field 42, USER_HZ = 100) summed over the
  thread rows (the process row's is the main thread's only, like %wait), as percent of one CPU's
  time: the threads' time blocked on synchronous disk IO.  iodelay counts only where the kernel's
  delay accounting is on (``sysctl kernel.task_delayacct``, off by default since Linux 5.14), else
  it reads 0.  pidstat prints -1 where it may not read /proc/PID/io: NaN here.
* ``threads``: one row per thread per interval.
* ``tree``: where the service is a tree or a cgroup's processes (``TREE_SCRIPT``), one row per
  process per interval from its process row, with its parent and command line from the script's
  ``#kneeswarm-member`` lines (role: ``engine`` by name, agents/remote/tree.py ENGINE_MARKS;
  ``worker`` for every process but the one found); none for pidstat run on one pid.

The service as a tree (``scope`` "tree" or "cgroup"; agents/remote/tree.py for the python agent's
way): pidstat is run by ``TREE_SCRIPT``, a POSIX sh loop that lists the service's processes every
interval (the process found and its descendants, each staying while it lives; or every process of
its cgroup) and, whenever they change, stops pidstat (SIGINT) and starts it again on the new pids.
Before each start it writes ``#kneeswarm-tree <epoch> <root> <pids...>`` and one
``#kneeswarm-member <pid> <ppid> <command line>`` per process to the same file (and, once,
``#kneeswarm-note <text>`` where a cgroup scope found the process in the root cgroup).  What the shell
agent can do with pidstat alone: a process's CPU is counted while it is listed (a worker's last
interval before it dies, and the first interval of pidstat started again, are lost), where the
python agent's /proc sampler loses none.

Read as a stream (:class:`PidstatStream`): only the interval being read is held as records, and a
file is read a piece at a time (:func:`parse_pidstat_file`), so 2 h of a 256-thread process (1.8M
thread rows, 293 MB of text) is parsed in ~0.5 GB, not 2.2 GB (bench/soak.py --threads 256); the
live view feeds the same stream what each fetch added (kneeswarm.collectors.parsed.LiveParse).
"""
from __future__ import annotations

import logging
from array import array
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import numpy as np

from kneeswarm.agents.remote.defaults import SCOPE_PROCESS
from kneeswarm.agents.remote.tree import ENGINE_MARKS
from kneeswarm.collectors.base import (BASE_ENV, MIGRATIONS_SAMPLED, NAN, PROCESS_COLUMNS, THREAD_COLUMNS, TREE_COLUMNS,
                                       Collector, HostContext, Parsed, frame, local_epoch, split_hms, to_float,
                                       whole_line_pieces)

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
          "cswch/s": "cswch", "nvcswch/s": "nvcswch", "kB_rd/s": "kb_rd", "kB_wr/s": "kb_wr",
          "iodelay": "iodelay"}
#: Clock ticks per second of /proc/PID/stat's delayacct_blkio_ticks (USER_HZ, 100 on Linux).
USER_HZ = 100.0
#: A record's slots: the command name, then each field key (NaN until a section gives it).
SLOTS = ("name", "usr", "sys", "wait", "cpu", "core", "minflt", "majflt", "vsz", "rss", "cswch", "nvcswch",
         "kb_rd", "kb_wr", "iodelay")
SLOT = {k: i for i, k in enumerate(SLOTS)}
FIELD_SLOT = {col: SLOT[k] for col, k in FIELDS.items()}
#: The fields a thread row is read for (its table, and the process's sums and migrations): the
#: others (faults, memory, the process's IO) are the process row's; not parsing them is a third less.
THREAD_FIELD_SLOT = {col: i for col, i in FIELD_SLOT.items()
                     if SLOTS[i] in ("usr", "sys", "wait", "cpu", "core", "cswch", "nvcswch", "iodelay")}
#: The slots of the threads table's value columns (THREAD_COLUMNS after t, tid, name).
THREAD_VALUE_SLOTS = tuple(SLOT[k] for k in ("cpu", "usr", "sys", "core", "cswch", "nvcswch"))
TREE_MARK, MEMBER_MARK, NOTE_MARK = "#kneeswarm-tree", "#kneeswarm-member", "#kneeswarm-note"  # TREE_SCRIPT's lines
#: pidstat on the service's processes, started again whenever they change (the module's text).
#: $1 the process found, $2 the scope, $3 the interval; the rest: pidstat's options but -p.
TREE_SCRIPT = r"""root=$1 scope=$2 iv=$3
shift 3
members="" child="" hier="" group=""
trap '[ -n "$child" ] && kill -INT "$child" 2>/dev/null && wait "$child"; exit 0' INT TERM
if [ "$scope" = cgroup ]; then
	line=$(grep -m1 '^0::/.' "/proc/$root/cgroup" 2>/dev/null || grep -m1 '[:,]cpu[,:]/.' "/proc/$root/cgroup" 2>/dev/null)
	hier=${line%%:*} group=${line#*:*:}
	[ -n "$line" ] || echo "#kneeswarm-note it is in the root cgroup: every process this host shows is watched"
fi
scan() {
	if [ "$scope" = cgroup ]; then
		awk -v h="$hier" -v g="$group" -v me=$$ 'FNR == 1 { split(FILENAME, f, "/"); pid = f[3] }
			{ i = index($0, ":"); id = substr($0, 1, i - 1); rest = substr($0, i + 1); path = substr(rest, index(rest, ":") + 1) }
			id == h && (path == g || index(path, g "/") == 1 || h == "") && pid != me { print pid }' /proc/[0-9]*/cgroup 2>/dev/null | sort -un | tr '\n' ' '
	else
		cat /proc/[0-9]*/stat 2>/dev/null | sed -n 's/^\([0-9]*\) (.*) [A-Za-z] \([0-9]*\) .*/\1 \2/p' | awk -v root="$root" -v keep="$members" -v me=$$ '
			{ parent[$1] = $2 }
			END {
				n = split(keep, k, " "); for (i = 1; i <= n; i++) if (k[i] in parent) in_[k[i]] = 1
				if (root in parent) in_[root] = 1
				for (grown = 1; grown;) { grown = 0; for (p in parent) if (!(p in in_) && (parent[p] in in_) && p != me && parent[p] != me) { in_[p] = 1; grown = 1 } }
				for (p in in_) print p
			}' | sort -n | tr '\n' ' '
	fi
}
while [ -d "/proc/$root" ] || [ "$scope" = cgroup ]; do
	now=$(scan)
	if [ -n "$now" ] && { [ "$now" != "$members" ] || ! kill -0 "$child" 2>/dev/null; }; then
		if [ -n "$child" ]; then kill -INT "$child" 2>/dev/null; wait "$child"; fi
		members=$now
		echo "#kneeswarm-tree $(date +%s) $root $members"
		for p in $members; do
			echo "#kneeswarm-member $p $(sed 's/^.*) [A-Za-z] \([0-9]*\) .*/\1/' "/proc/$p/stat" 2>/dev/null) $(tr '\000\n' '  ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-300)"
		done
		pidstat "$@" -p "$(echo $members | tr ' ' ,)" "$iv" &
		child=$!
	fi
	sleep "$iv"
done
[ -n "$child" ] && kill -INT "$child" 2>/dev/null && wait "$child"
"""
LINES_CHUNK = 1 << 23  # characters of the text split into lines at a time (a whole day's lines would be held)
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


class PidstatStream:
    """pidstat text read a piece at a time, in whole lines (:meth:`feed_text`); :meth:`take` returns the
    rows read so far as the two tables and forgets them.

    Why a stream: 2 h of a 256-thread process is 1.8M thread rows and 293 MB of text (a 2-hour soak,
    bench/soak.py); the whole text and a record per row peaked at 2.2 GB.  Here only the interval
    being read is held as records (rows of one Time; a row of another Time closes it), and each
    closed interval goes into typed columns (8 bytes a number; thread names shared).  The same
    stream serves the live view (kneeswarm.collectors.parsed.LiveParse): fed what a fetch added, its
    ``take()`` gives the new intervals only.  An interval is closed by the next one's first row, so
    ``take()`` leaves the last one open unless ``final``.  Times are taken as they come: a Time seen
    again after another (a clock stepped back) starts an interval of its own (the whole-text parse
    before the stream merged it into the earlier interval of that Time).
    """

    def __init__(self, tz: tzinfo | None = None, interval: float = 1.0) -> None:
        self.clock = _Clock(tz)
        self.interval = interval
        self.columns: list[str] | None = None
        self.lines = self.skipped = 0
        self.last_tgid: int | None = None
        self.t_open: float | None = None
        self.open: dict[tuple[int, int | None], list] = {}  # the open interval's records by (pid, tid)
        self.prev: dict[int, tuple[float, dict[int, float]]] = {}  # pid -> (t, {tid: core}): migrations
        self.names: dict[str, str] = {}  # one str per thread name
        self.root: int | None = None  # TREE_SCRIPT's process found (None: pidstat on one pid, no tree table)
        self.members: dict[int, tuple[float, str | None]] = {}  # pid -> (ppid, command line) of its last listing
        self.shown: set[int] = set()  # pids whose command line is already on a tree row
        self.note: str | None = None  # TREE_SCRIPT's note: why the processes are not what the scope asked
        self._reset_columns()

    def _reset_columns(self) -> None:
        self.process_rows: list[list] = []
        self.tree_rows: list[list] = []
        self.thread_t, self.thread_tid = array("d"), array("q")
        self.thread_names: list[str] = []
        self.thread_values = [array("d") for _ in THREAD_VALUE_SLOTS]

    def feed_text(self, text: str) -> None:
        for line in _lines(text):
            self.feed_line(line)

    def feed_line(self, line: str) -> None:
        self.lines += 1
        tokens = line.split()
        if not tokens:
            return
        first = tokens[0]
        if first in (TREE_MARK, MEMBER_MARK, NOTE_MARK):
            self._tree_line(first, line)
            return
        if first == "Linux" or first == "Average:":
            if first == "Linux" and self.clock.day is None:
                self.clock.day = _banner_date(tokens)
            return
        if "Command" in tokens and ("PID" in tokens or "TGID" in tokens or "TID" in tokens):
            self.columns = _header_columns(tokens)
            return
        columns = self.columns
        if first.startswith("#") or columns is None:
            self.skipped += 1
            return
        ampm = None
        if len(tokens) > 1 and tokens[1] in ("AM", "PM"):
            ampm = tokens.pop(1)
        ncol = len(columns)
        if len(tokens) < ncol:
            self.skipped += 1
            return
        row = dict(zip(columns[:-1], tokens[:ncol - 1]))
        t = self.clock.epoch(tokens[0], ampm)
        key = None if t is None else _row_key(row, self.last_tgid)
        if t is None or key is None:
            self.skipped += 1
            return
        if t != self.t_open:
            self._close()
            self.t_open = t
        self._record(key, " ".join(tokens[ncol - 1:]), row)

    def _tree_line(self, mark: str, line: str) -> None:
        """TREE_SCRIPT's listing of the service's processes (a new listing replaces the last)."""
        parts = line.split(None, 3)
        try:
            if mark == NOTE_MARK:
                self.note = line.split(None, 1)[1].strip()
            elif mark == TREE_MARK:  # pidstat starts again on new pids: the interval read so far is whole
                self.root = _pid(parts[2])
                self._close()
                self.t_open = None
                self.members = {}
            else:
                self.members[_pid(parts[1])] = (to_float(parts[2]) if len(parts) > 2 else NAN,
                                                parts[3].strip() if len(parts) > 3 else None)
        except (IndexError, ValueError):
            self.skipped += 1

    def _record(self, key: tuple[int, int | None], command: str, row: dict[str, str]) -> None:
        pid, tid = key
        if tid is None:
            self.last_tgid = pid
        rec = self.open.get(key)
        if rec is None:
            rec = self.open[key] = [NAN] * len(SLOTS)
        name = command[len(THREAD_PREFIX):] if command.startswith(THREAD_PREFIX) else command
        rec[0] = self.names.setdefault(name, name)
        fields = FIELD_SLOT if tid is None else THREAD_FIELD_SLOT
        for col, val in row.items():
            k = fields.get(col)
            if k is not None:
                rec[k] = to_float(val)

    def _close(self) -> None:
        """The open interval's records -> rows of the two tables (in the order they came)."""
        t, records = self.t_open, self.open
        if t is None or not records:
            return
        by_pid: dict[int, list[tuple[int, list]]] = {}
        for (pid, tid), rec in records.items():
            if tid is None:
                continue
            by_pid.setdefault(pid, []).append((tid, rec))
            self.thread_t.append(t)
            self.thread_tid.append(tid)
            self.thread_names.append(rec[0])
            for col, slot in zip(self.thread_values, THREAD_VALUE_SLOTS):
                col.append(rec[slot])
        for (pid, tid), rec in records.items():
            if tid is None:
                row = self._process_row(t, pid, rec, by_pid.get(pid))
                self.process_rows.append(row)
                if self.root is not None:
                    self.tree_rows.append(self._tree_row(row, rec[0]))
        self.open = {}

    def _tree_row(self, row: list, name: str) -> list:
        """A ``tree`` row from a process row (PROCESS_COLUMNS) and its command name."""
        pid = row[1]
        ppid, cmdline = self.members.get(pid, (NAN, None))
        role = ("engine" if any(m in f"{name} {cmdline or ''}" for m in ENGINE_MARKS)
                else None if pid == self.root else "worker")
        shown = cmdline if pid not in self.shown else None
        self.shown.add(pid)
        return [row[0], pid, ppid, name, role, row[2], row[6], row[8], row[9], row[10], row[5], shown]

    def _process_row(self, t: float, pid: int, rec: list, ths: list[tuple[int, list]] | None) -> list:
        g = lambda r, k: r[SLOT[k]]  # noqa: E731
        n_threads = cswch = nvcswch = migr = NAN
        wait = g(rec, "wait")
        if ths:
            n_threads = float(len(ths))
            cswch = sum(g(r, "cswch") for _, r in ths)
            nvcswch = sum(g(r, "nvcswch") for _, r in ths)
            wait = sum(g(r, "wait") for _, r in ths)  # NaN without %wait (sysstat < 11.5.5)
            cores = {tid_: g(r, "core") for tid_, r in ths}
            if pid in self.prev:
                t_prev, cores_prev = self.prev[pid]
                dt = t - t_prev
                if dt > 0:
                    moved = sum(1 for k, c in cores.items() if k in cores_prev and c == c and c != cores_prev[k])
                    migr = moved / dt
            self.prev[pid] = (t, cores)
        else:
            cswch, nvcswch = g(rec, "cswch"), g(rec, "nvcswch")
        return [t, pid, g(rec, "cpu"), g(rec, "usr"), g(rec, "sys"), wait, g(rec, "rss") / 1024.0,
                g(rec, "vsz") / 1024.0, n_threads, cswch, nvcswch, migr, g(rec, "minflt"), g(rec, "majflt"),
                *_io(rec, ths, self.interval), MIGRATIONS_SAMPLED if migr == migr else NAN]

    def take(self, final: bool = True) -> Parsed:
        """The rows of the intervals closed so far (and, ``final``, of the open one), as the
        ``process`` and ``threads`` tables; they are forgotten here (the line counts are not)."""
        if final:
            self._close()
            self.t_open = None
        process = frame(self.process_rows, PROCESS_COLUMNS)
        if len(self.thread_t):
            cols: dict[str, Any] = {"t": np.frombuffer(self.thread_t, dtype=float),
                                    "tid": np.frombuffer(self.thread_tid, dtype=np.int64),
                                    "name": self.thread_names}
            cols.update({c: np.frombuffer(a, dtype=float) for c, a in zip(THREAD_COLUMNS[3:], self.thread_values)})
            threads = frame(cols, THREAD_COLUMNS)
        else:
            threads = frame([], THREAD_COLUMNS)
        tree = frame(self.tree_rows, TREE_COLUMNS, ints=("pid",))
        self._reset_columns()
        return Parsed({"process": process, "threads": threads, "tree": tree}, self.lines, self.skipped)


def parse_pidstat(text: str, tz: tzinfo | None = None, interval: float = 1.0) -> Parsed:
    """pidstat text (sampled every ``interval`` seconds) -> ``process`` and ``threads`` tables.
    Never raises."""
    stream = PidstatStream(tz, interval)
    stream.feed_text(text)
    return stream.take()


def parse_pidstat_file(path: Path, tz: tzinfo | None = None, interval: float = 1.0) -> Parsed:
    """:func:`parse_pidstat` of a file's text (UTF-8, bad bytes replaced), read LINES_CHUNK
    characters at a time: the whole text is never held."""
    stream = PidstatStream(tz, interval)
    for text in whole_line_pieces(path, LINES_CHUNK):
        stream.feed_text(text)
    return stream.take()


def _lines(text: str, chunk: int = LINES_CHUNK):
    """``text.splitlines()``, a chunk at a time: each chunk ends just after a newline, so no line
    (nor a CR LF pair) is cut, and only one chunk's lines are held at once."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + chunk)
        end = len(text) if end < 0 else end + 1
        yield from text[start:end].splitlines()
        start = end


def _header_columns(tokens: list[str]) -> list[str]:
    if tokens[0] == "#":
        tokens = tokens[1:]
    elif tokens[0].startswith("#"):
        tokens = [tokens[0][1:] or "Time"] + tokens[1:]
    else:  # sectioned output: the header starts with the interval's time
        tokens = ["Time"] + tokens[2 if len(tokens) > 1 and tokens[1] in ("AM", "PM") else 1:]
    return tokens


# The kernel's largest pid (PID_MAX_LIMIT on 64-bit, include/linux/threads.h): an id beyond it is
# garbage (a fuzzed line once carried a 30-digit TID, which overflowed the int64 column).
PID_MAX_LIMIT = 4 * 1024 * 1024


def _pid(text: str) -> int:
    """A process or thread id, ValueError unless 0 <= id <= PID_MAX_LIMIT."""
    n = int(text)
    if not 0 <= n <= PID_MAX_LIMIT:
        raise ValueError(f"not a pid: {text}")
    return n


def _row_key(row: dict[str, str], last_tgid: int | None) -> tuple[int, int | None] | None:
    """(pid, tid) of a data row: tid None for a process row; None for a row whose ids are not ids."""
    tgid = row.get("TGID", row.get("PID"))
    tid = row.get("TID")
    try:
        if tid is None or tid in NO_ID:
            return (_pid(tgid), None) if tgid is not None and tgid not in NO_ID else None
        if tgid is None or tgid in NO_ID:
            return (last_tgid, _pid(tid)) if last_tgid is not None else None
        return _pid(tgid), _pid(tid)
    except ValueError:
        return None


def _io(rec: list, ths: list[tuple[int, list]] | None, interval: float) -> list[float]:
    """[io_read_kb_s, io_write_kb_s, io_delay_pct] of a process row (-1: not readable -> NaN)."""
    g = lambda r, k: (lambda v: NAN if v < 0 else v)(r[SLOT[k]])  # noqa: E731
    ticks = sum(g(r, "iodelay") for _, r in ths) if ths else g(rec, "iodelay")
    return [g(rec, "kb_rd"), g(rec, "kb_wr"), ticks / USER_HZ / max(interval, 1.0) * 100.0]


class PidstatCollector(Collector):
    name = "pidstat"
    raw_file = "pidstat.txt"
    kind = "command"
    tables = ("process", "threads", "tree")
    #: The agent's /proc sampler reads the process every interval and its threads less often;
    #: pidstat -t reads every thread each second (1.75 % of a core for 256 threads with SSH
    #: fetches).  It runs where the sampler cannot: hosts with the shell agent (no python3).
    instead_of = "procfs"

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
        argv += ["-h", "-u", "-r", "-w", "-d", "-t", "-p", str(int(pid)), str(max(1, round(interval)))]
        return argv, {**BASE_ENV, "S_TIME_FORMAT": "ISO"}

    def host_command(self, ctx: HostContext, version: str | None) -> tuple[list[str], dict[str, str]] | None:
        """``command``; for a service of several processes (``ctx.scope``), TREE_SCRIPT running it."""
        cmd = self.command(ctx.pid, ctx.interval, version)
        if cmd is None or ctx.scope == SCOPE_PROCESS:
            return cmd
        argv, env = cmd
        cut = argv.index("-p")
        return (["sh", "-c", TREE_SCRIPT, "kneeswarm-tree", argv[cut + 1], ctx.scope, argv[-1], *argv[1:cut]], env)

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_pidstat(text, tz, max(1, round(interval)))

    def parse_file_unguarded(self, path: Path, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_pidstat_file(path, tz, max(1, round(interval)))


COLLECTOR = PidstatCollector()
