"""fd sampler output (fds.jsonl): the monitored service's open file descriptors.

The sampler runs in the remote agent (``FdSampler``, stdlib only) at the monitor's interval and
writes one JSON object per line, over the service's processes (the process found and its
descendants, or its cgroup's: agents/remote/tree.py)::

    {"t": 1796002084.01, "pid": 4041, "fds": 37,     # len(os.listdir("/proc/PID/fd")), summed
     "procs": [[4041, 30], [4042, 7]],               # each process's (absent before the tree)
     "unreadable": 1}                                 # processes whose fds could not be read (if any)
    {"t": 1796002085.01, "pid": 4041, "error": "/proc/4041/fd: Permission denied"}   # said once

Table ``fds``: t, pid, fds.  pidstat counts no descriptors; a soak reads this for ``fd_growth``
(kneeswarm.analysis.summary.soak).  Reading another user's /proc/PID/fd needs that user or root: where it cannot,
the one error line says so and the table stays empty.
"""

from __future__ import annotations

import logging
from datetime import tzinfo
from typing import Any

from kneeswarm.collectors.base import (FDS_COLUMNS, Collector, HostContext, Parsed, finite, frame, json_records, to_float)

logger = logging.getLogger(__name__)

def parse_fds(text: str) -> Parsed:
    """fds.jsonl text -> the ``fds`` table. Never raises (an error record is not a sample)."""
    samples, lines, bad = json_records(text)
    rows, skipped = [], 0
    for rec in samples:
        t, pid, fds = to_float(rec.get("t")), to_float(rec.get("pid")), to_float(rec.get("fds"))
        if "error" in rec and not finite(fds):
            continue
        if not (finite(t) and finite(fds)):
            skipped += 1
            continue
        rows.append([t, pid, fds])
    return Parsed({"fds": frame(rows, FDS_COLUMNS)}, lines, bad + skipped)


class FdsCollector(Collector):
    name = "fds"
    raw_file = "fds.jsonl"
    kind = "sampler"
    tables = ("fds",)
    output_tz = None

    def sampler_params(self, ctx: HostContext) -> dict[str, Any]:
        return {**self.process_params(ctx), "scope": ctx.scope}

    def parse_text(self, text: str, tz: tzinfo | None, t0: float | None, interval: float) -> Parsed:
        return parse_fds(text)


COLLECTOR = FdsCollector()
