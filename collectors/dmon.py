"""nvidia-smi dmon: per-GPU utilisation, memory, power, clocks, temperature, once a second.

Command: ``nvidia-smi dmon -d 1 -o DT -s pucvmet`` (``TZ=UTC0``). Header lines start with ``#``:
the first names the columns (``#Date Time gpu pwr gtemp mtemp sm mem ...``), the second gives units
(``#YYYYMMDD HH:MM:SS Idx W C ...``) and is ignored. Column order follows the ``-s`` letters and
changes between drivers, so parsing is by header name; headers may repeat. ``-`` marks a value
the GPU does not support and becomes NaN.

Timestamps: with ``-o DT`` each row has Date (YYYYMMDD) and Time (HH:MM:SS) in the tool's local
zone: the ``tz`` argument, else the local zone of the machine that parses (``collectors.parse_raw``
passes UTC, the zone ``command()`` pins). Without ``-o DT`` rows carry no time at all: a new sample
starts when the gpu index does not increase, and sample k gets ``t0 + k*interval`` when ``t0`` is
given, else NaN.

Tables: ``gpu`` (canonical: sm -> sm_pct, mem -> mem_pct, fb -> fb_used_mb (MiB), pwr -> power_w,
pclk -> sm_clock_mhz, mclk -> mem_clock_mhz, gtemp -> temp_c) and ``dmon``: t, gpu and every other
numeric dmon column under its dmon name (pviol, tviol, enc, dec, rxpci, ...).
"""
from __future__ import annotations

import logging
from datetime import tzinfo

from kneeswarm.collectors.base import (BASE_ENV, GPU_COLUMNS, NAN, Collector, Parsed, WallClock, frame, to_float)

logger = logging.getLogger(__name__)

METRICS = "pucvmet"
#: dmon column -> canonical gpu-table column.
CANONICAL = {"sm": "sm_pct", "mem": "mem_pct", "fb": "fb_used_mb", "pwr": "power_w",
             "pclk": "sm_clock_mhz", "mclk": "mem_clock_mhz", "gtemp": "temp_c"}
TIME_COLUMNS = ("Date", "Time")
DATE_FORMAT = "%Y%m%d"


def parse_dmon(text: str, tz: tzinfo | None = None, t0: float | None = None,
               interval: float = 1.0) -> Parsed:
    """nvidia-smi dmon text -> ``gpu`` and ``dmon`` tables. Never raises."""
    columns: list[str] | None = None
    extra_cols: list[str] = []
    gpu_rows: list[list[float]] = []
    dmon_rows: list[dict[str, float]] = []
    lines = skipped = 0
    sample = -1
    last_gpu: float | None = None
    clock = WallClock(tz, DATE_FORMAT)
    for line in text.splitlines():
        lines += 1
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            tokens = s.lstrip("#").split()
            if "gpu" in tokens and "Idx" not in tokens:
                columns = tokens
                for c in tokens:
                    if c not in TIME_COLUMNS and c not in ("gpu", "t") and c not in extra_cols:
                        extra_cols.append(c)
            elif "Idx" not in tokens:
                skipped += 1
            continue
        tokens = s.split()
        if columns is None or len(tokens) != len(columns):
            skipped += 1
            continue
        row = dict(zip(columns, tokens))
        gpu = to_float(row.get("gpu"))
        if gpu != gpu:
            skipped += 1
            continue
        if "Date" in row and "Time" in row:
            t = clock.epoch(row["Date"], row["Time"])
            if t is None:
                skipped += 1
                continue
        else:
            if last_gpu is None or gpu <= last_gpu:
                sample += 1
            t = t0 + sample * interval if t0 is not None else NAN
        last_gpu = gpu
        gpu_rows.append([t, gpu] + [to_float(row.get(k)) for k in _DMON_FOR_CANONICAL])
        dmon_rows.append({"t": t, "gpu": gpu,
                          **{c: to_float(v) for c, v in row.items()
                             if c not in TIME_COLUMNS and c not in ("gpu", "t")}})
    return Parsed({"gpu": frame(gpu_rows, GPU_COLUMNS),
                   "dmon": frame(dmon_rows, ["t", "gpu"] + extra_cols)}, lines, skipped)


_DMON_FOR_CANONICAL = [{v: k for k, v in CANONICAL.items()}[c] for c in GPU_COLUMNS[2:]]


class NvidiaSmiCollector(Collector):
    """What every nvidia-smi based collector shares: the check and the driver version."""

    needs_gpu = True

    def check_argv(self) -> list[str] | None:
        return ["nvidia-smi", "--version"]

    def version_from(self, text: str) -> str | None:
        return nvidia_smi_version(text)


class DmonCollector(NvidiaSmiCollector):
    name = "dmon"
    raw_file = "dmon.txt"
    kind = "command"
    tables = ("gpu", "dmon")

    def command(self, pid: int | None, interval: float,
                version: str | None = None) -> tuple[list[str], dict[str, str]] | None:
        return (["nvidia-smi", "dmon", "-d", str(max(1, round(interval))), "-o", "DT",
                 "-s", METRICS], dict(BASE_ENV))

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_dmon(text, tz, t0, interval)


def nvidia_smi_version(text: str) -> str | None:
    """Driver version from ``nvidia-smi --version`` ("NVIDIA-SMI version  : 580.159.04") or the
    first line of ``nvidia-smi -h`` ("NVIDIA System Management Interface -- v580.159.04")."""
    for line in text.splitlines():
        if line.startswith("NVIDIA-SMI version") and ":" in line:
            return line.split(":", 1)[1].strip() or None
        if line.startswith("DRIVER version") and ":" in line:
            return line.split(":", 1)[1].strip() or None
        if "--" in line and "NVIDIA System Management Interface" in line:
            v = line.rsplit("--", 1)[1].strip().lstrip("v")
            return v or None
    return None


COLLECTOR = DmonCollector()
