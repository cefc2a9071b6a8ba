"""Soak (``[load] mode = "soak"``: leaks and drifts): what crept while one load was held.

A soak records one step per window of one unchanged load (kneeswarm.contracts.plan: ``steps`` = the load x
the windows, ``hold`` = the window), so every per-step figure the analysis already computes is a
point of the soak's time series: QPS, P50/P95/P99/P999, errors by category (kneeswarm.analysis.measure.requestscan,
one window in memory at a time) and, per monitored host, the service's RSS, threads and open file
descriptors (sums over its processes: a growth rule names the process whose own series grew most), the GPUs' memory and the target's own series (kneeswarm.analysis.measure.serverstats, means of the
window's samples; ``fb_peak_mb`` its largest).  ``soak_section`` lays them out over time (seconds
from the first window's start to each window's middle) and runs the trend test of kneeswarm.analysis.models.trend
on each series: Mann–Kendall with the Theil–Sen slope, per second.

A finding needs the series to drift the worse way: the test's p-value below ``SOAK_ALPHA`` and
the fitted line moving at least ``trend.MIN_RELATIVE_DRIFT`` of the series' median over the soak,
and, for counts and memory, at least the absolute floor named below.  None fires on a steady run.

* ``memory_growth``: RSS rising; the evidence projects when the fitted line reaches the memory
  limit (the service's cgroup limit, else the host's memory).
* ``latency_drift``: P50 or P99 rising.
* ``throughput_decay``: QPS falling.
* ``fd_growth`` / ``thread_growth``: open file descriptors / threads rising.
* ``gpu_memory_creep``: the windows' peak GPU memory rising (the sweep rule of the same id in
  kneeswarm.analysis.findings.memory_gpu reads steps of rising users; a soak's windows hold one load),
  projected to the GPUs' memory.

A soak is not a step sweep: it has no knee, no P99 knee and no USL fit (``soak_knees`` says so);
the report shows the windows' series and these findings instead.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from kneeswarm.analysis.findings.context import process_evidence, process_growth, process_text, rounded
from kneeswarm.analysis.findings.finding import finding
from kneeswarm.analysis.findings.memory_gpu import GPU_CREEP_MIN_MB
from kneeswarm.analysis.models.trend import MIN_RELATIVE_DRIFT, drift
from kneeswarm.analysis.schema.summary import (Evidence, Finding, HostFacts, Knee, PlanTable, ProcessGrowth, Series,
                                               SoakSection, SoakSeries, SoakTrends, Summary, SummaryStep, Trend, num)

logger = logging.getLogger(__name__)

# Significance of each trend test.  A soak tests about seven series per host at once (QPS, P50,
# P99, RSS, fds, threads, GPU memory); at 0.05 each, a steady run would show one false finding in
# three.  0.05 / 7 = 0.007 (Bonferroni), rounded up to 0.01.  Mann–Kendall's exact p over 6
# windows reaches it only when the series is perfectly monotonic (2/6! = 0.003), hence
# kneeswarm.contracts.plan.SOAK_MIN_WINDOWS = 6.
SOAK_ALPHA = 0.01
# Absolute floors of the fitted line's change over the soak (besides MIN_RELATIVE_DRIFT):
MEMORY_MIN_GROWTH_MB = 8.0  # an allocator's arenas settling after warm-up move RSS a few MB
FD_MIN_GROWTH = 8.0  # a pool opening a few more connections under load is not a leak
THREAD_MIN_GROWTH = 4.0  # likewise a thread pool growing to its size
GPU_MIN_GROWTH_MB = GPU_CREEP_MIN_MB  # the sweep rule's floor: a cache block or two is noise

CLIENT_SERIES = ("qps", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "error_rate")
# host series: summary key of steps[].server[host] -> soak series name
HOST_SERIES = {"rss_mb": "rss_mb", "threads": "threads", "fds": "fds", "fb_used_mb": "gpu_mb",
               "fb_peak_mb": "gpu_peak_mb"}
# series -> the direction that is worse (+1: rising)
WORSE = {"qps": -1, "p50_ms": +1, "p95_ms": +1, "p99_ms": +1, "p999_ms": +1, "error_rate": +1,
         "rss_mb": +1, "threads": +1, "fds": +1, "gpu_mb": +1, "gpu_peak_mb": +1}
THRESHOLDS = {"alpha": SOAK_ALPHA, "min_relative_drift": MIN_RELATIVE_DRIFT, "memory_min_growth_mb": MEMORY_MIN_GROWTH_MB,
              "fd_min_growth": FD_MIN_GROWTH, "thread_min_growth": THREAD_MIN_GROWTH,
              "gpu_min_growth_mb": GPU_MIN_GROWTH_MB}


def soak_knees() -> dict[str, Knee]:
    """``knee`` and ``latency_knee`` of a soak: none (one load held, not a step sweep)."""
    return {"knee": {"users": None, "qps": None, "method": "none"},
            "latency_knee": {"users": None, "p99_ms": None, "method": "none", "took_off_users": None}}


def series(steps: list[SummaryStep]) -> SoakSeries:
    """{t, t_lo, t_hi, window_s, client {name: [...]}, errors [{category: n}], hosts {host: {name: [...],
    target {key: [...]}}}}: each window's figures, in time order; ``t``: the window's middle in
    seconds from the first window's start."""
    starts = [num(s.get("t_lo")) for s in steps]
    t0 = next((t for t in starts if t is not None), None)
    mids = [None if t0 is None or num(s.get("t_lo")) is None or num(s.get("t_hi")) is None
            else (s["t_lo"] + s["t_hi"]) / 2.0 - t0 for s in steps]  # type: ignore[operator]  # both numbers: _num
    hosts = sorted({h for s in steps for h in (s.get("server") or {})})
    out: SoakSeries = {"t": mids, "t_lo": starts, "t_hi": [num(s.get("t_hi")) for s in steps],
                           "window_s": [num(s.get("window_s")) for s in steps],
                           "client": {k: [num(s.get(k)) for s in steps] for k in CLIENT_SERIES},
                           "errors": [dict(s.get("errors") or {}) for s in steps], "hosts": {}}
    for h in hosts:
        per = [(s.get("server") or {}).get(h) or {} for s in steps]
        got: dict[str, Series | dict[str, Series]] = {name: [num(m.get(key)) for m in per] for key, name in HOST_SERIES.items()
               if any(m.get(key) is not None for m in per)}
        targets = [tg if isinstance(tg := m.get("target"), dict) else {} for m in per]
        keys = sorted({k for tg in targets for k in tg})
        if keys:
            got["target"] = {k: [num(tg.get(k)) for tg in targets] for k in keys}
        out["hosts"][h] = got
    return out


def trends(ser: SoakSeries) -> SoakTrends:
    """{client: {name: drift}, hosts: {host: {name: drift}}} over the windows' mid times (slope per second)."""
    x = [math.nan if t is None else t for t in ser["t"]]
    test = lambda name, values: drift(values, WORSE[name], x=x, alpha=SOAK_ALPHA)  # noqa: E731
    return {"client": {k: test(k, v) for k, v in ser["client"].items()},
            "hosts": {h: {k: test(k, v) for k, v in m.items() if k in WORSE} for h, m in ser["hosts"].items()}}


def _worse(tr: Trend | None, floor: float = 0.0) -> bool:
    """The series drifted the worse way by at least ``floor`` (the fitted line's change over the soak)."""
    return bool(tr and tr.get("drifting") and tr.get("direction") == "worse" and abs(tr.get("change") or 0.0) >= floor)


def _evidence(tr: Trend, key: str, scale: float = 1.0) -> Evidence:
    """The trend's numbers for a finding: the slope per ``scale`` seconds (as ``key``), p, change, median."""
    return {key: (tr.get("slope") or 0.0) * scale, "p": tr["p"], "windows": tr["n"], "change": tr["change"],
            "median": tr["median"], "alpha": SOAK_ALPHA}


def _last_fit(tr: Trend, values: Series | dict[str, Series], x: Series) -> float | None:
    """The fitted line's value at the last window (median intercept of Theil–Sen)."""
    pts = [(t, v) for t, v in zip(x, values) if t is not None and v is not None] if isinstance(values, list) else []
    slope = tr.get("slope")
    if not pts or slope is None:
        return None
    ts = sorted(v - slope * t for t, v in pts)
    return ts[len(ts) // 2] + slope * pts[-1][0]


def _hours_to(limit: float | None, now: float | None, slope_per_s: float) -> float | None:
    if limit is None or now is None or not slope_per_s > 0:
        return None
    return max(0.0, (limit - now) / slope_per_s / 3600.0)


def memory_limit_mb(facts: HostFacts) -> tuple[float | None, str | None]:
    """(limit MB, what it is) of a host: its service's cgroup memory limit, else the host's memory."""
    cg = num((facts.get("service") or {}).get("memory_limit_mb"))
    if cg is not None:
        return cg, "cgroup memory limit"
    kb = num(facts.get("memory_total_kb"))
    return (kb / 1024.0, "host memory") if kb is not None else (None, None)


def gpu_memory_mb(facts: HostFacts) -> float | None:
    """The host's GPUs' memory, summed (MB), or None when not known."""
    totals = [num(g.get("memory_total_mb")) for g in facts.get("gpus") or [] if isinstance(g, dict)]
    known = [t for t in totals if t is not None]
    return sum(known) if known and len(known) == len(totals) else None


def memory_findings(ser: SoakSeries, tr: SoakTrends, hosts: dict[str, HostFacts],
                    first: list[SummaryStep], steps: list[SummaryStep] | None = None) -> list[Finding]:
    """memory_growth and gpu_memory_creep, per host, with the projected time to the limit; where the
    service is several processes, the one whose own RSS rose most (``steps``: the windows)."""
    out = []
    for h, m in tr["hosts"].items():
        facts = hosts.get(h) or HostFacts()
        for name, fid, floor, (limit, kind) in (
                ("rss_mb", "memory_growth", MEMORY_MIN_GROWTH_MB, memory_limit_mb(facts)),
                ("gpu_peak_mb", "gpu_memory_creep", GPU_MIN_GROWTH_MB, (gpu_memory_mb(facts), "GPU memory"))):
            t = m.get(name)
            if t is None or not _worse(t, floor):
                continue
            slope = t.get("slope") or 0.0  # drifting: a slope
            now = _last_fit(t, ser["hosts"][h][name], ser["t"])
            hours = _hours_to(limit, now, slope)
            what = "RSS" if name == "rss_mb" else "peak GPU memory"
            grew = process_growth(steps or [], h, name, hosts)
            ev = {"host": h, **_evidence(t, "slope_mb_per_hour", 3600.0), "slope_mb_per_s": slope, "now_mb": now,
                  "limit_mb": limit, "limit": kind if limit is not None else None, "hours_to_limit": hours,
                  **process_evidence(grew)}
            reach = (f"; at this rate it reaches the {kind} ({limit:,.0f} MB) in {hours:,.1f} h" if hours is not None
                     else "; no memory limit is known to project against")
            out.append(finding(fid, first, ev,
                               f"{h}: {what} grew {slope * 3600.0:,.1f} MB/hour over the soak "
                               f"(Mann–Kendall p = {t['p']:.2g}, {t['n']} windows; {t['change']:+,.0f} MB in all"
                               f"{process_text(grew, ' MB')}){reach}.",
                               "Something is kept per request: caches without a bound, a growing list or queue, "
                               "tensors or responses held by a reference; take heap snapshots some minutes apart "
                               "(tracemalloc, memray, jemalloc profiling) and compare."))
    return out


def _series_finding(fid: str, tr: Trend, first: list[SummaryStep], host: str | None, what: str,
                    unit: str, advice: str) -> Finding:
    per_min = (tr.get("slope") or 0.0) * 60.0  # drifting: a slope
    ev = {"host": host, **_evidence(tr, "slope_per_minute", 60.0)}
    where = f"{host}: " if host else ""
    return finding(fid, first, ev, f"{where}{what} moved {per_min:+,.3g} {unit}/minute over the soak (Mann–Kendall "
                                   f"p = {tr['p']:.2g}, {tr['n']} windows; {tr['change']:+,.4g} {unit} in all, "
                                   f"median {tr['median']:,.4g}).", advice)


def series_findings(tr: SoakTrends, first: list[SummaryStep], steps: list[SummaryStep] | None = None,
                    hosts: dict[str, HostFacts] | None = None) -> list[Finding]:
    """latency_drift, throughput_decay, fd_growth, thread_growth (naming, where the service is
    several processes, the one whose own threads rose most)."""
    out = []
    client = tr["client"]
    for k in ("p50_ms", "p99_ms"):
        if _worse(client.get(k)):
            out.append(_series_finding("latency_drift", client[k], first, None, f"{k[:-3].upper()} latency", "ms",
                                       "Latency rose at a constant load: look for what grows with time (queues, "
                                       "caches, fragmentation, a longer input over time) in the windows' server series."))
            break
    if _worse(client.get("qps")):
        out.append(_series_finding("throughput_decay", client["qps"], first, None, "QPS", "req/s",
                                   "Throughput fell at a constant load: check the latency drift and the server's "
                                   "memory and threads over the same windows."))
    for h, m in tr["hosts"].items():
        for name, fid, floor, what in (("fds", "fd_growth", FD_MIN_GROWTH, "open file descriptors"),
                                       ("threads", "thread_growth", THREAD_MIN_GROWTH, "threads")):
            if _worse(m.get(name), floor):
                grew = process_growth(steps or [], h, name, hosts) if name == "threads" else None
                out.append(_with_process(grew, _series_finding(fid, m[name], first, h, f"the service's {what}", "", (
                    "Descriptors that only grow are connections or files never closed: list them "
                    "(ls -l /proc/PID/fd, lsof -p PID) some minutes apart." if name == "fds" else
                    "Threads that only grow are started per request or per connection and never joined: "
                    "bound the pool, and dump the threads' stacks (py-spy dump) some minutes apart."))))
    return out


def _with_process(grew: ProcessGrowth | None, f: Finding) -> Finding:
    """``f`` naming the process whose own series rose most (process_growth), where there is one."""
    if grew:
        f["evidence"].update({k: rounded(v) if isinstance(v, float) else v
                              for k, v in process_evidence(grew).items() if v is not None})
        f["text"] = f["text"][:-2] + process_text(grew) + ")."
    return f


def soak_section(summary: Summary, plan: PlanTable) -> SoakSection:
    """summary.json ``soak``: the held load, the windows' series, the trend of each and the findings' ids
    (the findings themselves go to ``findings``: ``soak_findings``)."""
    load = got if isinstance(got := plan.get("load"), dict) else {}
    steps = summary.get("steps") or []
    ser = series(steps)
    tr = trends(ser)
    return {"users": num(load.get("users")), "rate": num(load.get("rate")), "duration_s": num(load.get("duration")),
            "window_s": num(load.get("window")), "windows": len(steps), "series": ser, "trends": tr,
            "thresholds": dict(THRESHOLDS)}


def soak_findings(summary: Summary) -> list[Finding]:
    """The soak findings of a summary whose ``soak`` section is filled (soak_section)."""
    soak = summary.get("soak") or SoakSection()
    first = (summary.get("steps") or [])[:1]
    tr = soak.get("trends") or SoakTrends(client={}, hosts={})
    steps, hosts = summary.get("steps") or [], summary.get("hosts") or {}
    return memory_findings(soak.get("series") or SoakSeries(), tr, hosts, first, steps) + series_findings(tr, first, steps, hosts)


# -- text -----------------------------------------------------------------------------------
SOAK_IDS = ("memory_growth", "latency_drift", "throughput_decay", "fd_growth", "thread_growth", "gpu_memory_creep")
# (header, series, format) of the windows table; host columns are prefixed with the host's name
CLIENT_COLUMNS = (("QPS", "qps", "{:,.1f}"), ("P50 ms", "p50_ms", "{:,.1f}"), ("P95 ms", "p95_ms", "{:,.1f}"),
                  ("P99 ms", "p99_ms", "{:,.1f}"), ("P999 ms", "p999_ms", "{:,.1f}"))
HOST_COLUMNS = (("RSS MB", "rss_mb", "{:,.1f}"), ("threads", "threads", "{:,.0f}"), ("open fds", "fds", "{:,.0f}"),
                ("GPU MB", "gpu_mb", "{:,.0f}"), ("GPU peak MB", "gpu_peak_mb", "{:,.0f}"))


def _fmt(v: Any, fmt: str) -> str:
    return "–" if num(v) is None else fmt.format(v)


def held_line(summary: Summary) -> str:
    """One Markdown line: what the soak held, and what the report shows instead of a knee."""
    soak = summary.get("soak") or SoakSection()
    what = f"{soak['rate']:g} requests/s" if soak.get("rate") is not None else f"{_fmt(soak.get('users'), '{:.0f}')} users"
    return (f"**Soak:** {what} held {_fmt(soak.get('duration_s'), '{:,.0f}')} s in {soak.get('windows', 0)} windows "
            f"of {_fmt(soak.get('window_s'), '{:,.0f}')} s; one load, not a step sweep: no knee, no USL fit or "
            "capacity plan; each window's series and the trend of each are below")


def soak_verdict(summary: Summary) -> str:
    """The soak's result in one sentence (Markdown)."""
    ids = list(dict.fromkeys(f["id"] for f in summary.get("findings") or [] if f.get("id") in SOAK_IDS))
    n = (summary.get("soak") or {}).get("windows", 0)
    if ids:
        return f"**Verdict:** something crept over the soak's {n} windows: " + ", ".join(f"`{i}`" for i in ids) + " (below)."
    return (f"**Verdict:** nothing crept: no trend over the soak's {n} windows in memory, latency, throughput, "
            "file descriptors, threads or GPU memory.")


def trend_rows(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the trend table: each series' first and last window, slope per minute, p, drifting."""
    soak = summary.get("soak") or SoakSection()
    ser, tr = soak.get("series") or {}, soak.get("trends") or {}
    rows = []
    named = [("", k, ser.get("client", {}).get(k), (tr.get("client") or {}).get(k)) for k in CLIENT_SERIES]
    named += [(h, k, v, ((tr.get("hosts") or {}).get(h) or {}).get(k)) for h, m in (ser.get("hosts") or {}).items()
              for k, v in m.items() if k in WORSE and isinstance(v, list)]
    for host, k, values, t in named:
        if not t or not values:
            continue
        vals = [v for v in values if v is not None]
        verdict = t.get("direction") or ("no" if t.get("p") is not None else (t.get("reason") or "–"))
        rows.append([f"{host} {k}".strip(), _fmt(vals[0] if vals else None, "{:,.4g}"),
                     _fmt(vals[-1] if vals else None, "{:,.4g}"),
                     _fmt(None if (slope := t.get("slope")) is None else slope * 60.0, "{:+,.3g}"),
                     _fmt(t.get("p"), "{:.2g}"), verdict])
    return ["series", "first", "last", "slope /min", "p", "drifting"], rows


def window_rows(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the windows table: mid time, the client's figures, errors, each host's series."""
    ser = (summary.get("soak") or {}).get("series") or {}
    hosts = {h: m for h, m in (ser.get("hosts") or {}).items() if any(k in m for _, k, _ in HOST_COLUMNS)}
    cols = [(h, head, k, f) for h in hosts for head, k, f in HOST_COLUMNS if k in hosts[h]]
    header = ["t s", *[c[0] for c in CLIENT_COLUMNS], "errors %", *[f"{h} {head}" if len(hosts) > 1 else head
                                                                   for h, head, _, _ in cols]]
    rows = []
    for i, t in enumerate(ser.get("t") or []):
        er = (ser.get("client", {}).get("error_rate") or [None] * (i + 1))[i]
        row = [_fmt(t, "{:,.0f}"), *[_fmt(ser["client"][k][i], f) for _, k, f in CLIENT_COLUMNS],
               _fmt(None if er is None else 100 * er, "{:.2f}")]
        row += [_fmt(v[i] if isinstance(v := hosts[h][k], list) else None, f) for h, _, k, f in cols]
        rows.append(row)
    return header, rows
