"""NVML sampler output (nvml.jsonl): per-GPU and per-process GPU samples.

The sampler runs in the remote agent (``import pynvml`` from nvidia-ml-py, stdlib otherwise) and
writes ONE JSON OBJECT PER LINE, PER GPU, PER SAMPLE::

    {"t": 1796001890.221,            # epoch seconds (time.time()) when the sample was taken
     "gpu": 0,                       # device index
     "util": [66, 17],               # nvmlDeviceGetUtilizationRates: [gpu %, memory %]
     "mem": [1704853504, 150754820096],  # nvmlDeviceGetMemoryInfo: [used bytes, total bytes]
     "power_mw": 240696,             # nvmlDeviceGetPowerUsage (milliwatts)
     "sm_clock_mhz": 1515,           # nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)
     "mem_clock_mhz": 3201,          # nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM)
     "temp_c": 51,                   # nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)
     "procs": [[428, 1050673152]],   # nvmlDeviceGetComputeRunningProcesses: [[pid, used bytes]]
     "proc_util": [[428, 45, 10]],   # nvmlDeviceGetProcessUtilization(h, last_seen_us):
                                     #   [[pid, sm %, mem %]]
     "errors": {"proc_util": "Not Found"}}   # optional: key -> NVMLError text

Any value whose NVML call failed is ``null`` and its error text goes in ``errors`` (``proc_util``
raises "Not Found" when no process ran since ``last_seen``). ``used bytes`` may be ``null`` (no
per-process accounting, e.g. in containers). Unknown keys are ignored. tests/fixtures/gpu/
nvml.jsonl is a real recording (H200) in this format.

Tables: ``gpu`` (canonical; fb_used_mb = used bytes / 2**20, which counts the driver's reserved
memory, unlike dmon's fb; power_w = power_mw / 1000) and ``gpu_procs``: t, gpu, pid, used_mb,
sm_pct (one row per process per sample: the pids of ``procs`` and of ``proc_util``; sm_pct NaN
when ``proc_util`` is null or lacks the pid).
"""
from __future__ import annotations

import logging
from datetime import tzinfo
from typing import Any

from kneeswarm.collectors.base import (GPU_COLUMNS, GPU_PROC_COLUMNS, NAN, Collector, HostContext, Parsed, Unavailable, finite, frame, json_records, to_float)

logger = logging.getLogger(__name__)

MIB = float(2 ** 20)


def _pair(v: object, i: int) -> float:
    if isinstance(v, (list, tuple)) and len(v) > i:
        return to_float(v[i])
    return NAN


def parse_nvml(text: str) -> Parsed:
    """nvml.jsonl text -> ``gpu`` and ``gpu_procs`` tables. Never raises."""
    gpu_rows: list[list[float]] = []
    proc_rows: list[list[float]] = []
    records, lines, skipped = json_records(text)
    for rec in records:
        t, gpu = to_float(rec.get("t")), to_float(rec.get("gpu"))
        if not (finite(t) and finite(gpu)):
            skipped += 1
            continue
        util, mem = rec.get("util"), rec.get("mem")
        gpu_rows.append([t, gpu, _pair(util, 0), _pair(util, 1), _pair(mem, 0) / MIB,
                         to_float(rec.get("power_mw")) / 1000.0,
                         to_float(rec.get("sm_clock_mhz")), to_float(rec.get("mem_clock_mhz")),
                         to_float(rec.get("temp_c"))])
        used: dict[float, float] = {}
        for p in rec.get("procs") or ():
            pid = _pair(p, 0)
            if finite(pid):
                used[pid] = _pair(p, 1) / MIB
        sm: dict[float, float] = {}
        pu = rec.get("proc_util")
        for p in (pu if isinstance(pu, list) else ()):
            pid = _pair(p, 0)
            if finite(pid):
                sm[pid] = _pair(p, 1)  # several samples of one pid: the last wins
        for pid in list(used) + [p for p in sm if p not in used]:
            proc_rows.append([t, gpu, pid, used.get(pid, NAN), sm.get(pid, NAN)])
    return Parsed({"gpu": frame(gpu_rows, GPU_COLUMNS),
                   "gpu_procs": frame(proc_rows, GPU_PROC_COLUMNS)}, lines, skipped)


class NvmlCollector(Collector):
    name = "nvml"
    raw_file = "nvml.jsonl"
    kind = "sampler"
    tables = ("gpu", "gpu_procs")
    output_tz = None
    needs_gpu = True

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        nv = ctx.facts.get("nvml") or {}
        if not nv.get("available"):
            raise Unavailable(nv.get("error") or "NVML not available")
        return {}

    def sampler_version(self, ctx: HostContext) -> str | None:
        return (ctx.facts.get("nvml") or {}).get("driver")

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_nvml(text)


COLLECTOR = NvmlCollector()
