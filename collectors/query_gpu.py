"""nvidia-smi --query-gpu: the stable CSV alternative to dmon.

Command: ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,memory.used,
memory.total,power.draw,clocks.sm,clocks.mem,temperature.gpu --format=csv,nounits -lms 1000``
(``TZ=UTC0``). The first line is the header (``timestamp, index, utilization.gpu [%], ...``); the
unit in brackets is dropped and columns are found by name (nvidia-smi prints ``clocks.sm`` as
``clocks.current.sm``). The header may repeat. ``[N/A]``/``[Not Supported]`` become NaN. The
timestamp (``2026/11/30 01:24:45.085``) is local time of the tool: the ``tz`` argument, else the
local zone of the machine that parses.

Table ``gpu`` (canonical columns; memory.used is MiB, stored as fb_used_mb).
"""
from __future__ import annotations

import logging
from datetime import tzinfo

from kneeswarm.collectors.base import BASE_ENV, GPU_COLUMNS, Parsed, WallClock, frame, to_float
from kneeswarm.collectors.dmon import NvidiaSmiCollector

logger = logging.getLogger(__name__)

QUERY_FIELDS = ("timestamp,index,utilization.gpu,utilization.memory,memory.used,memory.total,"
                "power.draw,clocks.sm,clocks.mem,temperature.gpu")
DATE_FORMAT = "%Y/%m/%d"
#: query-gpu header names (unit dropped) -> canonical gpu-table column.
CANONICAL = {"index": "gpu", "utilization.gpu": "sm_pct", "utilization.memory": "mem_pct",
             "memory.used": "fb_used_mb", "power.draw": "power_w",
             "power.draw.instant": "power_w", "clocks.sm": "sm_clock_mhz",
             "clocks.current.sm": "sm_clock_mhz", "clocks.mem": "mem_clock_mhz",
             "clocks.current.memory": "mem_clock_mhz", "temperature.gpu": "temp_c"}


def _timestamp(s: str, clock: WallClock) -> float | None:
    parts = s.split()
    return clock.epoch(parts[0], parts[1]) if len(parts) == 2 else None


def parse_query_gpu(text: str, tz: tzinfo | None = None) -> Parsed:
    """nvidia-smi --query-gpu CSV text -> ``gpu`` table. Never raises."""
    columns: list[str] | None = None
    rows: list[dict[str, float]] = []
    lines = skipped = 0
    clock = WallClock(tz, DATE_FORMAT)
    for line in text.splitlines():
        lines += 1
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if fields[0] == "timestamp" or "index" in fields:
            columns = [f.split(" [", 1)[0].strip() for f in fields]
            continue
        if columns is None or len(fields) != len(columns) or "timestamp" not in columns:
            skipped += 1
            continue
        row = dict(zip(columns, fields))
        t = _timestamp(row["timestamp"], clock)
        if t is None:
            skipped += 1
            continue
        out = {"t": t}
        for name, value in row.items():
            canon = CANONICAL.get(name)
            if canon is not None and canon not in out:
                out[canon] = to_float(value)
        if out.get("gpu", float("nan")) != out.get("gpu", float("nan")):
            skipped += 1
            continue
        rows.append(out)
    return Parsed({"gpu": frame(rows, GPU_COLUMNS)}, lines, skipped)


class QueryGpuCollector(NvidiaSmiCollector):
    name = "query_gpu"
    raw_file = "query-gpu.csv"
    kind = "command"
    tables = ("gpu",)
    default = False  # an alternative to dmon: only where a host lists it

    def command(self, pid: int | None, interval: float,
                version: str | None = None) -> tuple[list[str], dict[str, str]] | None:
        ms = max(100, int(round(interval * 1000)))
        return (["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,nounits",
                 "-lms", str(ms)], dict(BASE_ENV))

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_query_gpu(text, tz)


COLLECTOR = QueryGpuCollector()
