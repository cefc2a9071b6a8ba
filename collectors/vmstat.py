"""vmstat (procps): run queue, memory, swap, IO, interrupts, context switches, CPU split.

Command: ``vmstat -n -t -w 1`` (``LC_ALL=C``, ``TZ=UTC0``). Parsing is by header name: the header is
the line starting with ``r b``; columns r b swpd free buff cache si so bi bo in cs us sy id wa st
and ``gu`` (procps-ng >= 4, wide mode only) are kept, whatever their order. With ``-t`` each data
line ends with a date and a time, taken at the END of the interval, in the tool's local zone; the
header's last token names that zone (``UTC`` under ``TZ=UTC0``). The epoch is computed with, in
order: the ``tz`` argument, the zone the header names when it is UTC/GMT, else the local zone of
the machine that parses. Lines without a timestamp (no ``-t``) get ``t0 + i*interval`` or NaN.

The first data line (averages since boot) is dropped. Narrow mode can run numbers together; such
lines have the wrong number of fields and are skipped and counted.

Table ``vmstat``: t, r, b, swpd, free, buff, cache, si, so, bi, bo, in, cs, us, sy, id, wa, st
(+ gu when the tool printed it).
"""
from __future__ import annotations

import logging
from datetime import tzinfo

from kneeswarm.collectors.base import (BASE_ENV, NAN, VMSTAT_COLUMNS, Collector, Parsed, WallClock, frame, to_float, zone_from_name)

logger = logging.getLogger(__name__)

KNOWN_COLUMNS = frozenset(VMSTAT_COLUMNS[1:] + ["gu"])
DATE_FORMAT = "%Y-%m-%d"


def _header(tokens: list[str]) -> tuple[list[str], list[str]]:
    """A header line's known column names, and what follows them (the timestamp's zone name)."""
    cols = []
    for tok in tokens:
        if tok not in KNOWN_COLUMNS:
            break
        cols.append(tok)
    return cols, tokens[len(cols):]


def parse_vmstat(text: str, tz: tzinfo | None = None, t0: float | None = None,
                 interval: float = 1.0) -> Parsed:
    """vmstat text -> ``vmstat`` table. Never raises."""
    columns: list[str] | None = None
    zone = tz
    rows: list[list[float]] = []
    lines = skipped = 0
    first_dropped = False
    has_gu = False
    n_untimed = 0
    clock: WallClock | None = None
    for line in text.splitlines():
        lines += 1
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0] == "r" and len(tokens) > 1 and tokens[1] == "b":
            cols, extra = _header(tokens)
            if "cs" not in cols or len(extra) > 1:
                skipped += 1
                continue
            columns = cols
            has_gu = has_gu or "gu" in cols
            if tz is None and extra:
                zone = zone_from_name(extra[0])
            continue
        if tokens[0].startswith("procs") or tokens[0].startswith("--"):
            continue
        if columns is None:
            skipped += 1
            continue
        n = len(columns)
        if len(tokens) == n + 2:
            if clock is None or clock.tz is not zone:
                clock = WallClock(zone, DATE_FORMAT)
            t = clock.epoch(tokens[n], tokens[n + 1])
            if t is None:
                skipped += 1
                continue
        elif len(tokens) == n:
            t = t0 + n_untimed * interval if t0 is not None else NAN
        else:
            skipped += 1
            continue
        values = dict(zip(columns, tokens[:n]))
        nums = [to_float(values.get(c)) for c in VMSTAT_COLUMNS[1:]]
        if any(v != v for v, c in zip(nums, VMSTAT_COLUMNS[1:]) if c in values):
            skipped += 1
            continue
        if not first_dropped:  # averages since boot
            first_dropped = True
            continue
        n_untimed += 1
        row = [t] + nums
        if has_gu:
            row.append(to_float(values.get("gu")))
        rows.append(row)
    cols = VMSTAT_COLUMNS + (["gu"] if has_gu else [])
    rows = [r + [NAN] * (len(cols) - len(r)) for r in rows]
    return Parsed({"vmstat": frame(rows, cols)}, lines, skipped)


class VmstatCollector(Collector):
    name = "vmstat"
    raw_file = "vmstat.txt"
    kind = "command"
    tables = ("vmstat",)

    def check_argv(self) -> list[str] | None:
        return ["vmstat", "-V"]

    def version_from(self, text: str) -> str | None:
        # "vmstat from procps-ng 4.0.2" / "procps version 3.2.8" / "procps-ng version 3.3.10"
        for line in text.splitlines():
            tokens = line.split()
            if tokens and any(tok.startswith("procps") for tok in tokens):
                last = tokens[-1]
                if last[:1].isdigit():
                    return last
        return None

    def command(self, pid: int | None, interval: float,
                version: str | None = None) -> tuple[list[str], dict[str, str]] | None:
        return ["vmstat", "-n", "-t", "-w", str(max(1, round(interval)))], dict(BASE_ENV)

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_vmstat(text, tz, t0, interval)


COLLECTOR = VmstatCollector()
