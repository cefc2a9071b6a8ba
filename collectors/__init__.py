"""What is measured on a host: commands to run, parsers of their raw text, in-process samplers.

Every collector is one module holding one ``Collector`` (see ``kneeswarm.collectors.base``); the registry
below lists them by name. Adding a collector is adding its module and one line here.

    >>> from kneeswarm.collectors import get, parse_raw
    >>> argv, env = get("vmstat").command(None, 1)
    >>> parsed = parse_raw("vmstat", text)        # Parsed(frames={"vmstat": df}, lines, skipped)
"""
from __future__ import annotations

import logging
from datetime import tzinfo
from pathlib import Path

from kneeswarm.collectors import cgroup, dmon, fds, nvml, pidstat, procfs, prometheus, query_gpu, vmstat
from kneeswarm.collectors.base import Collector, HostContext, Parsed, RunSpec, Unavailable

logger = logging.getLogger(__name__)

COLLECTORS: dict[str, Collector] = {c.name: c for c in (
    pidstat.COLLECTOR, vmstat.COLLECTOR, dmon.COLLECTOR, query_gpu.COLLECTOR, nvml.COLLECTOR,
    procfs.COLLECTOR, prometheus.COLLECTOR,
    cgroup.COLLECTOR, fds.COLLECTOR)}

_DEFAULT = object()


def get(name: str) -> Collector:
    """The collector called ``name``; KeyError naming the known ones otherwise."""
    try:
        return COLLECTORS[name]
    except KeyError:
        raise KeyError(f"unknown collector {name!r} (known: {', '.join(sorted(COLLECTORS))})"
                       ) from None


def by_raw_file(file_name: str) -> Collector | None:
    """The collector whose raw output file is ``file_name`` (e.g. "pidstat.txt"), if any."""
    for c in COLLECTORS.values():
        if c.raw_file == file_name:
            return c
    return None


def parse_raw(name: str, text: str, *, tz: tzinfo | None | object = _DEFAULT,
              t0: float | None = None, interval: float = 1.0) -> Parsed:
    """Parse raw output recorded by ``get(name).command()``: wall-clock times are read in the zone
    the command pinned (UTC) unless ``tz`` says otherwise (``tz=None``: local zone)."""
    c = get(name)
    zone = c.output_tz if tz is _DEFAULT else tz
    return c.parse(text, tz=zone, t0=t0, interval=interval)  # type: ignore[arg-type]


def parse_raw_file(name: str, path: Path, *, tz: tzinfo | None | object = _DEFAULT,
                   t0: float | None = None, interval: float = 1.0) -> Parsed:
    """:func:`parse_raw` of a raw file (the same tables; a collector whose files grow large, pidstat,
    reads it a piece at a time)."""
    c = get(name)
    zone = c.output_tz if tz is _DEFAULT else tz
    return c.parse_file(path, tz=zone, t0=t0, interval=interval)  # type: ignore[arg-type]


__all__ = ["COLLECTORS", "Collector", "HostContext", "Parsed", "RunSpec", "Unavailable", "by_raw_file", "get",
           "parse_raw", "parse_raw_file"]
