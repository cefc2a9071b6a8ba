"""What went wrong in a run, in one place: summary.json ``complete``, ``warnings`` and ``lost``.

Three sources, merged: meta.json's own ``warnings`` (one line each) and ``lost`` ({what: count});
each host's entry in meta.json["hosts"] (its ``warnings``, ``lost``, ``complete`` and any
collector ``error``); and what analysis itself found (unreadable files, defaults used, rows that
had to be rebuilt).  A host's losses are keyed ``hosts.<label>.<what>``.  The run is reported
complete only when meta.json says so, the run did not stop while "running", no host says it is
incomplete or that its agent directory was left on it (``left_on_server``: the removal failed)
and nothing was lost.  The report shows these lines before anything else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable

from kneeswarm.analysis.schema.summary import as_dict
from kneeswarm.contracts.outcome import Ended
from kneeswarm.contracts.rundir import Meta, WarningLog

logger = logging.getLogger(__name__)

RUNNING = Ended.RUNNING  # meta.json "ended" while the controller runs; still there if it was killed


@dataclass
class Problems:
    complete: bool
    warnings: list[str] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)


def _lines(x: Any) -> list[str]:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [str(w) for w in x]
    return [str(x)]


def merge_lost(into: dict[str, int], lost: Any, prefix: str = "") -> None:
    """Add {what: count} into ``into`` (counts of one key summed; non-numbers skipped)."""
    for what, n in as_dict(lost).items():
        try:
            count = int(n)
        except (TypeError, ValueError):
            logger.warning("lost[%r] = %r is not a count", what, n)
            continue
        key = f"{prefix}{what}"
        into[key] = into.get(key, 0) + count


def _ended(meta: Meta) -> tuple[bool, list[str]]:
    """(meta.json says the load completed, lines to add); the status line already names "ended"."""
    if not meta:
        return False, ["meta.json is missing: how the run ended is unknown"]
    if meta.get("ended") == RUNNING:
        return False, ['meta.json still says "ended": "running": the controller was killed (or is still '
                       "running); this report covers only what was recorded before"]
    return bool(meta.get("complete")), []


def not_run_lines(meta: Meta) -> set[str]:
    """"<label>: collector <name> skipped..." prefixes of collectors that were not run (absent
    tools, e.g. no GPU): the report's host section says so under "not run", they are not losses."""
    out = set()
    for label, host in as_dict(meta.get("hosts")).items():
        for name, c in as_dict(as_dict(host).get("collectors")).items():
            if as_dict(c) and not as_dict(c).get("enabled", True):
                out.add(f"{label}: collector {name} skipped")
    return out


class _Log(WarningLog):
    """A WarningLog that leaves out the lines of collectors that were not run."""

    def __init__(self, not_run: set[str]):
        super().__init__()
        self.not_run = tuple(not_run)

    def add(self, text: str) -> None:
        if not (self.not_run and text.startswith(self.not_run)):
            super().add(text)


def _host_problems(label: str, host: dict[str, Any], log: WarningLog, lost: dict[str, int]) -> bool:  # meta's entry
    """Add one host's warnings and losses; False when the host says its data is incomplete."""
    for w in _lines(host.get("warnings")):
        log.add(f"{label}: {w}")
    merge_lost(lost, host.get("lost"), f"hosts.{label}.")
    for where in ("collectors", "parse"):
        for name, c in sorted(as_dict(host.get(where)).items()):
            if as_dict(c).get("error"):
                log.add(f"{label}: collector {name}: {c['error']}")
    if host.get("complete") is False:
        log.add(f"{label}: the host's data is incomplete")
        return False
    if host.get("left_on_server"):  # its data is home and verified, but the server keeps a copy
        log.add(f"{label}: the agent directory {host['left_on_server']} was left on the host (its removal failed)")
        return False
    return True


def collect(meta: Meta, analysis_warnings: Iterable[str] = (),
            analysis_lost: dict[str, int] | None = None) -> Problems:
    """Merge meta.json's, each host's and analysis's own warnings and losses."""
    log, lost = _Log(not_run_lines(meta)), dict[str, int]()
    load_complete, lines = _ended(meta)
    for line in lines:
        log.add(line)
    for w in _lines(meta.get("warnings")):
        log.add(w)
    merge_lost(lost, meta.get("lost"))
    hosts_complete = all([_host_problems(str(label), as_dict(h), log, lost)
                          for label, h in sorted(as_dict(meta.get("hosts")).items(), key=lambda kv: str(kv[0]))])
    for w in analysis_warnings:
        log.add(w)
    merge_lost(lost, analysis_lost or {})
    lost = {k: v for k, v in sorted(lost.items()) if v}
    if lost:
        log.add("data was lost: " + ", ".join(f"{k} {v:,}" for k, v in lost.items()))
    complete = load_complete and hosts_complete and not lost
    return Problems(complete=complete, warnings=log.to_list(), lost=lost)

