"""Host facts for the report header: what each monitored host was, and how well it was measured.

From meta.json (any key may be absent; nothing here raises on a partial meta):

* ``hosts_preflight[label]`` and ``hosts[label]["facts"]`` (the agent's preflight): hostname,
  kernel, CPU model and topology, memory, GPUs, the monitored process (pid, command line,
  how it was chosen), which collectors ran and their versions;
* ``hosts[label]["clock"]``: the clock offsets measured before and after the run, their error
  bounds and the drift between them;
* ``hosts[label]["parse"]``: per collector, lines read and lines skipped as malformed;
* the host's ``tree`` table (collectors/base.py: each process of the monitored service per
  sample): ``tree`` {``scope``, ``count`` (processes seen), ``at_once`` (the most at one sample),
  ``t_first``, ``t_last``, ``processes`` [{pid, ppid, name, role, cmdline, cpu_pct (the mean of
  its samples), cpu_pct_max, rss_mb and threads (their largest), t_first, t_last}], the busiest
  first}; with the preflight's ``process`` {``scope``, ``member_count``, ``cgroup``, ``note``}
  it says which processes were watched and how they were found;
* the host's ``cgroup`` table (collectors/cgroup.py), when its agent sampled the monitored
  process's cgroup: ``service`` {``cpus`` (the CPUs the service may use: the smallest of the
  cgroup's CPU quota / period, its cpuset and the host's logical CPUs), ``bound`` ("quota",
  "cpuset" or "host": which of the three it is), ``quota_cpus``, ``cpuset_cpus``, ``host_cpus``,
  ``memory_limit_mb``, ``cgroup_version``}; a host with logical CPUs but no cgroup samples gets
  ``service`` {cpus: its logical CPUs, bound: "host"};
* ``target_metrics`` (the conductor's scraper of the target's /metrics, written to
  ``hosts/<its host>/``, ``rundir.TARGET_HOST`` by default): url, scrapes, ok, failed, last_error, and its
  parse counts (added to that host's ``parse`` as "prometheus").

Hosts are keyed by their directory name under ``hosts/`` (``RunDir.host_dir``), so that the
facts line up with ``steps[i]["server"][host]``; a host with CSVs but no facts gets ``{}``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable, Mapping, cast

from kneeswarm.analysis.schema.summary import (ClockFacts, HostFacts, ParseCount, RawFacts, ServiceLimits, ServiceTree,
                                               TreeProcess, as_dict)
from kneeswarm.contracts.rundir import TARGET_HOST, Meta, safe_name

logger = logging.getLogger(__name__)

CPU_KEYS = ("model", "sockets", "physical_cores", "threads_per_core", "logical_cpus")
GPU_KEYS = ("index", "name", "memory_total_mb", "driver")
PROCESS_KEYS = ("pid", "cmdline", "by", "candidates", "error", "scope", "member_count", "cgroup", "note")
TREE_LISTED = 200  # processes of the service kept in hosts[host]["tree"] (the busiest; ``count`` counts all)
TREE_SHOWN = 12  # of them, one line each in the report; the others in one line
TREE_CMDLINE_SHOWN = 80  # characters of a process's command line on its report line
CLOCK_SIDE_KEYS = ("offset", "error", "rtt_min", "t")
SCRAPER_KEYS = ("url", "scrapes", "ok", "failed", "last_error")
KB_PER_GIB = 1024 * 1024
CMDLINE_MAX = 200  # characters of a command line shown in the report


def _num(x: Any) -> float | None:
    """A finite float of a value the host's agent reported (untyped JSON: a number may come as text), or None."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# -- meta.json's host entries and the agent's preflight: untyped JSON, picked and coerced here --------
def _pick(d: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    return {k: d[k] for k in keys if k in d and d[k] is not None}


def _collectors(info: Any) -> dict[str, dict[str, Any]]:
    """{collector: its enabled/kind/version/reason} of a host's meta; {} when it says none."""
    out = {}
    for name, c in sorted(as_dict(info).items()):
        c = as_dict(c)
        out[name] = _pick(c, ("enabled", "kind", "version", "reason"))
    return out


def _clock(clock: dict[str, Any]) -> ClockFacts:
    out: ClockFacts = {}
    sides: dict[str, dict[str, float]] = {}
    for side in ("before", "after"):
        s = as_dict(clock.get(side))
        picked = {k: v for k in CLOCK_SIDE_KEYS if (v := _num(s.get(k))) is not None}
        if picked:
            sides[side] = picked
    if "before" in sides:
        out["before"] = sides["before"]
    if "after" in sides:
        out["after"] = sides["after"]
    first = sides.get("before") or sides.get("after")
    if first and "offset" in first:
        out["offset_s"] = first["offset"]
    errs = [sides[s]["error"] for s in ("before", "after") if "error" in sides.get(s, {})]
    if errs:
        out["error_s"] = max(errs)
    if (drift := _num(clock.get("drift_ppm"))) is not None:
        out["drift_ppm"] = drift
    if clock.get("applied"):
        out["applied"] = clock["applied"]
    if clock.get("errors"):
        out["errors"] = [str(e) for e in clock["errors"]]
    return out


def parse_counts(parse: dict[str, Any]) -> dict[str, ParseCount]:
    out = {}
    for name, p in sorted(as_dict(parse).items()):
        p = as_dict(p)
        rec: ParseCount = {}
        if (v := _num(p.get("lines"))) is not None:
            rec["lines"] = int(v)
        if (v := _num(p.get("skipped"))) is not None:
            rec["skipped"] = int(v)
        if p.get("error"):
            rec["error"] = str(p["error"])
        if rec:
            out[name] = rec
    return out


# In the order a tie is named: a limit equal to the host's CPUs binds nothing (a cpuset of every
# CPU is the default), and a quota equal to a cpuset is named, as it is the one that throttles.
SERVICE_BOUNDS = ("host", "quota", "cpuset")


def _tightest(cgroup: Any, column: str) -> float | None:
    """The smallest positive finite value of a cgroup table column over the run, None without one
    (or without a table): limits rarely change during a run; where one did, the tightest bounded
    the service."""
    try:
        values = [float(v) for v in cgroup[column]]
    except (KeyError, TypeError, ValueError):
        return None
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return min(finite) if finite else None


def service_limits(cgroup: Any, host_cpus: float | None) -> ServiceLimits:
    """``service`` facts from a cgroup table (None: none sampled) and the host's logical CPUs."""
    limits = {"quota": _tightest(cgroup, "quota_cpus"), "cpuset": _tightest(cgroup, "cpuset_cpus"),
              "host": host_cpus if host_cpus is not None and host_cpus > 0 else None}
    known = [(v, b) for b in SERVICE_BOUNDS if (v := limits[b]) is not None]
    out: ServiceLimits = {}
    if known:
        cpus, bound = min(known, key=lambda vb: vb[0])  # min keeps the first of equals
        out.update({"cpus": cpus, "bound": bound})
    if (v := limits["quota"]) is not None:
        out["quota_cpus"] = v
    if (v := limits["cpuset"]) is not None:
        out["cpuset_cpus"] = v
    if (v := limits["host"]) is not None:
        out["host_cpus"] = v
    mem, version = _tightest(cgroup, "memory_limit_mb"), _tightest(cgroup, "version")
    if mem is not None:
        out["memory_limit_mb"] = mem
    if version is not None:
        out["cgroup_version"] = int(version)
    return out


# How migrations/s was counted (kneeswarm.collectors.base.MIGRATIONS_KERNEL / MIGRATIONS_SAMPLED), in the
# report's words: the sampled count is at most one per thread per sample, a lower bound.
MIGRATIONS_COUNTED = {1.0: "kernel", 0.0: "sampled"}
MIGRATIONS_TEXT = {"kernel": "the kernel's count (se.nr_migrations of each thread, /proc/PID/task/TID/sched)",
                   "sampled": "threads whose CPU changed between two samples (at most one per thread per "
                              "sample: a lower bound; the kernel's counter was not readable)"}


def migrations_counted(process: Any) -> str | None:
    """"kernel", "sampled" or "kernel, sampled" (both in one run: each row says which) from a
    process table's ``migrations_counted`` column; None without one (a run from before it)."""
    try:
        values = {float(v) for v in process["migrations_counted"]}
    except (KeyError, TypeError, ValueError):
        return None
    named = [MIGRATIONS_COUNTED[v] for v in sorted((v for v in values if v in MIGRATIONS_COUNTED), reverse=True)]
    return ", ".join(named) or None


def host_facts_one(preflight: dict[str, Any], host_meta: dict[str, Any]) -> HostFacts:
    """The facts of one host from its preflight dict and its meta.json["hosts"] entry."""
    facts = {**as_dict(host_meta.get("facts")), **as_dict(preflight)}  # the preflight wins where both say
    out: HostFacts = {}
    for k in ("hostname", "kernel", "machine", "python"):
        if facts.get(k):
            out[k] = facts[k]
    cpu = _pick(as_dict(facts.get("cpu")), CPU_KEYS)
    if cpu:
        out["cpu"] = cpu
    mem_kb = _num(facts.get("memory_total_kb"))
    if mem_kb is not None:
        out["memory_total_kb"] = int(mem_kb)
        out["memory_gib"] = round(mem_kb / KB_PER_GIB, 1)
    if isinstance(facts.get("gpus"), list):
        out["gpus"] = [_pick(as_dict(g), GPU_KEYS) for g in facts["gpus"]]
    proc = _pick(as_dict(facts.get("process")), PROCESS_KEYS)
    if "pid" not in proc and host_meta.get("pid") is not None:
        proc["pid"] = host_meta["pid"]
    if proc:
        out["process"] = proc
    collectors = _collectors(host_meta.get("collectors") or facts.get("collectors"))
    if collectors:
        out["collectors"] = collectors
    clock = _clock(as_dict(host_meta.get("clock")))
    if clock:
        out["clock"] = clock
    parse = parse_counts(as_dict(host_meta.get("parse")))
    if parse:
        out["parse"] = parse
    if host_meta.get("transport"):
        out["transport"] = host_meta["transport"]
    if host_meta.get("label"):
        out["label"] = host_meta["label"]
    if host_meta.get("warnings"):
        out["warnings"] = [str(w) for w in host_meta["warnings"]]
    return out


def _column(df: Any, name: str) -> list[Any]:
    try:
        return list(df[name])
    except (KeyError, TypeError):
        return []


def _first_text(values: Iterable[Any]) -> str | None:
    return next((v for v in values if isinstance(v, str) and v.strip()), None)


def service_tree(tree: Any, scope: str | None = None) -> ServiceTree:
    """``tree`` facts (the module's text) from a tree table; {} without rows."""
    try:
        pids = [_num(x) for x in tree["pid"]]
        ts = [_num(x) for x in tree["t"]]
    except (KeyError, TypeError):
        return {}
    cols = {c: _column(tree, c) for c in ("ppid", "name", "role", "cmdline", "cpu_pct", "rss_mb", "threads")}
    per: dict[int, dict[str, list[Any]]] = {}
    at: dict[float, set[int]] = {}
    for i, (pid, t) in enumerate(zip(pids, ts)):
        if pid is None or t is None:
            continue
        rec = per.setdefault(int(pid), {"t": []})
        rec["t"].append(t)
        at.setdefault(t, set()).add(int(pid))
        for c, values in cols.items():
            rec.setdefault(c, []).append(values[i] if i < len(values) else None)
    if not per:
        return {}
    procs = [_tree_process(pid, rec) for pid, rec in per.items()]
    procs.sort(key=lambda p: (-(p.get("cpu_pct") or 0.0), p["pid"]))
    out: ServiceTree = {"count": len(procs), "at_once": max(len(v) for v in at.values()),
                           "t_first": min(at), "t_last": max(at), "processes": procs[:TREE_LISTED]}
    if scope:
        out["scope"] = scope
    return out


def _tree_process(pid: int, rec: dict[str, list[Any]]) -> TreeProcess:
    """One process of the service over the run (``service_tree``)."""
    def numbers(c: str) -> list[float]:
        return [v for x in rec.get(c, []) if (v := _num(x)) is not None]

    out: TreeProcess = {"pid": pid, "t_first": min(rec["t"]), "t_last": max(rec["t"])}
    ppid = numbers("ppid")
    if ppid:
        out["ppid"] = int(ppid[-1])
    if name := _first_text(reversed(rec.get("name", []))):
        out["name"] = name
    if role := _first_text(reversed(rec.get("role", []))):
        out["role"] = role
    if cmd := _first_text(rec.get("cmdline", [])):
        out["cmdline"] = cmd
    if cpu := numbers("cpu_pct"):
        out["cpu_pct"], out["cpu_pct_max"] = sum(cpu) / len(cpu), max(cpu)
    if rss := numbers("rss_mb"):
        out["rss_mb"] = max(rss)
    if threads := numbers("threads"):
        out["threads"] = max(threads)
    return out


def host_facts(meta: Meta, data_hosts: Iterable[str] = (),
               rebuilt: dict[str, dict[str, Any]] | None = None,
               cgroups: Mapping[str, Any] | None = None,
               processes: Mapping[str, Any] | None = None,
               trees: Mapping[str, Any] | None = None) -> dict[str, HostFacts]:
    """{host dir name: facts} over the hosts in meta.json and those with data under hosts/;
    ``rebuilt``: {host: parse stats} of hosts whose raw files analysis parsed again; ``cgroups``:
    {host: its cgroup table} (the ``service`` facts); ``processes``: {host: its process table}
    (``migrations_counted``: how the migrations/s column was counted); ``trees``: {host: its tree
    table} (the ``tree`` facts: which processes were the service)."""
    pre, hosts = as_dict(meta.get("hosts_preflight")), as_dict(meta.get("hosts"))
    out: dict[str, HostFacts] = {}
    for label in sorted(set(pre) | set(hosts), key=str):
        facts = host_facts_one(as_dict(pre.get(label)), as_dict(hosts.get(label)))
        name = safe_name(str(label))
        if name != label:
            facts.setdefault("label", label)
        out[name] = facts
    scraper = as_dict(meta.get("target_metrics"))
    if scraper:
        facts = out.setdefault(safe_name(str(scraper.get("host") or TARGET_HOST)), {})
        picked = _pick(scraper, SCRAPER_KEYS)
        if picked:
            facts["scraper"] = picked
        parse = parse_counts({"prometheus": scraper.get("parse")})
        if parse:
            facts["parse"] = {**facts.get("parse", {}), **parse}
    for h in data_hosts:
        out.setdefault(h, {})
    for h, stats in (rebuilt or {}).items():
        parse = parse_counts(stats)
        if parse and not out.setdefault(h, {}).get("parse"):
            out[h]["parse"] = parse
    cgroups = cgroups or {}
    for h, facts in out.items():
        service = service_limits(cgroups.get(h), _num(as_dict(facts.get("cpu")).get("logical_cpus")))
        if service:
            facts["service"] = service
        counted = migrations_counted((processes or {}).get(h))
        if counted:
            facts["migrations_counted"] = counted
        tree = service_tree((trees or {}).get(h), as_dict(facts.get("process")).get("scope"))
        if tree:
            facts["tree"] = tree
    return dict(sorted(out.items()))


def skipped_lines(facts: dict[str, HostFacts]) -> list[tuple[str, str, int, int]]:
    """(host, collector, skipped, lines) for every collector that skipped malformed lines."""
    return [(h, c, p["skipped"], p.get("lines", 0)) for h, f in facts.items()
            for c, p in (f.get("parse") or {}).items() if p.get("skipped")]


# -- text ---------------------------------------------------------------------------------------
def _fmt_s(x: float) -> str:
    a = abs(x)
    if a >= 1:
        return f"{x:.3f} s"
    if a >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} µs"


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def cpu_line(f: HostFacts) -> str | None:
    cpu = f.get("cpu") or {}
    parts = []
    if cpu:
        topo = []
        if cpu.get("sockets") is not None:
            topo.append(_plural(cpu["sockets"], "socket"))
        if cpu.get("physical_cores") is not None:
            topo.append(_plural(cpu["physical_cores"], "physical core"))
        if cpu.get("threads_per_core") is not None:
            topo.append(f"{cpu['threads_per_core']} thread(s)/core")
        if cpu.get("logical_cpus") is not None:
            topo.append(_plural(cpu["logical_cpus"], "logical CPU"))
        parts.append(f"{cpu.get('model') or 'CPU'}" + (f" ({', '.join(topo)})" if topo else ""))
    if f.get("memory_gib") is not None:
        parts.append(f"{f['memory_gib']:g} GiB memory")
    if "gpus" in f:
        gpus = f["gpus"]
        if gpus:
            parts.append("GPUs: " + ", ".join(
                f"{g.get('index', i)}: {g.get('name', '?')}"
                + (f" {g['memory_total_mb'] / 1024:.0f} GiB" if _num(g.get("memory_total_mb")) else "")
                for i, g in enumerate(gpus)))
        else:
            parts.append("no GPU")
    return "; ".join(parts) or None


BOUND_TEXT = {"quota": "the cgroup's CPU quota", "cpuset": "the cgroup's cpuset", "host": "the host's logical CPUs"}


def service_line(f: HostFacts) -> str | None:
    """"CPUs the service may use: 0.5 (bound by the cgroup's CPU quota; ...)"; None when the host
    bounds it and no cgroup limit was read (the CPU line already says so)."""
    sv = f.get("service") or {}
    if sv.get("cpus") is None or (sv.get("bound") == "host" and "cgroup_version" not in sv):
        return None
    others = [f"{what} {v:g}" for v, what in ((sv.get("quota_cpus"), "quota"), (sv.get("cpuset_cpus"), "cpuset"),
                                               (sv.get("host_cpus"), "host")) if v is not None]
    bound = sv.get("bound")
    line = (f"CPUs the service may use: {sv['cpus']:g} (bound by {BOUND_TEXT.get(bound or '', bound)}"
            + (f"; {', '.join(others)}" if others else "") + ")")
    if sv.get("memory_limit_mb") is not None:
        line += f"; memory limit {sv['memory_limit_mb']:,.0f} MB"
    if sv.get("cgroup_version") is not None:
        line += f" (cgroup v{sv['cgroup_version']})"
    return line


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


#: How the report names what was watched, by scope (the preflight's ``process.scope``).
SCOPE_TEXT = {"tree": "the process tree of pid {pid} (it and every descendant, found again at every sample)",
              "cgroup": "every process of the cgroup of pid {pid}{group}",
              "process": "pid {pid} alone"}


def process_line(f: HostFacts) -> str | None:
    p = f.get("process")
    if not p:
        return None
    if p.get("error"):
        return f"monitored process: none ({p['error']})"
    if p.get("pid") is None:
        return "monitored process: none chosen"
    cmd = _cut(str(p.get("cmdline") or ""), CMDLINE_MAX)
    by = f" (chosen by {p['by']})" if p.get("by") else ""
    scope = p.get("scope") or as_dict(f.get("tree")).get("scope")
    if scope not in SCOPE_TEXT:  # a run from before the service was a tree
        return f"monitored process: pid {p['pid']}{by}" + (f": `{cmd}`" if cmd else "")
    what = SCOPE_TEXT[scope].format(pid=p["pid"], group=f" ({p['cgroup']})" if p.get("cgroup") else "")
    line = f"monitored service: {what}; pid {p['pid']}{by}" + (f": `{cmd}`" if cmd else "")
    return line + (f"; note: {p['note']}" if p.get("note") else "")


def _tree_member_line(m: TreeProcess, tree: ServiceTree) -> str:
    """One process of the service: "pid 124 (parent 123, worker): 95 % CPU (peak 101 %), ..."."""
    who = ", ".join(x for x in (f"parent {m['ppid']}" if m.get("ppid") is not None else "", m.get("role") or "") if x)
    figs = []
    if m.get("cpu_pct") is not None:
        figs.append(f"{m['cpu_pct']:.1f} % CPU (peak {m.get('cpu_pct_max', m['cpu_pct']):.0f} %)")
    if m.get("rss_mb") is not None:
        figs.append(f"RSS {m['rss_mb']:,.0f} MB")
    if m.get("threads") is not None:
        figs.append(_plural(int(m["threads"]), "thread"))
    t0, t1 = _num(tree.get("t_first")), _num(tree.get("t_last"))
    if t0 is not None and t1 is not None and (m["t_first"] > t0 or m["t_last"] < t1):
        figs.append(f"seen from +{m['t_first'] - t0:.0f} s to +{m['t_last'] - t0:.0f} s of {t1 - t0:.0f} s")
    cmd = m.get("cmdline") or m.get("name")
    return (f"process {m['pid']}" + (f" ({who})" if who else "") + (": " + ", ".join(figs) if figs else "")
            + (f": `{_cut(str(cmd), TREE_CMDLINE_SHOWN)}`" if cmd else ""))


def tree_lines(f: HostFacts) -> list[str]:
    """The service's processes, one line each (the busiest TREE_SHOWN; the others summed in one)."""
    tree = as_dict(f.get("tree"))
    procs = [m for m in tree.get("processes") or [] if isinstance(m, dict) and "pid" in m]
    if not procs:
        return []
    count = int(tree.get("count") or len(procs))
    lines = [f"watched: {count} process" + ("" if count == 1 else "es") + (f", {tree['at_once']} at most at once" if
                                                        tree.get("at_once") and tree["at_once"] != count else "")
             + "; the service's figures are their sums"]
    lines += [_tree_member_line(cast(TreeProcess, m), cast(ServiceTree, tree)) for m in procs[:TREE_SHOWN]]
    rest = procs[TREE_SHOWN:]
    if rest or count > len(procs):
        cpu = sum(m.get("cpu_pct") or 0.0 for m in rest)
        lines.append(f"and {count - TREE_SHOWN} other process" + ("" if count - TREE_SHOWN == 1 else "es") + (f": {cpu:.1f} % CPU together" if rest else ""))
    return lines


def collectors_line(f: HostFacts) -> str | None:
    cs = f.get("collectors") or {}
    if not cs:
        return None
    ran = [f"{n} {c['version']}" if c.get("version") else n for n, c in cs.items() if c.get("enabled")]
    off = [f"{n} ({c['reason']})" if c.get("reason") else n for n, c in cs.items() if not c.get("enabled")]
    line = "collectors: " + (", ".join(ran) or "none")
    if off:
        line += "; not run: " + ", ".join(off)
    return line


def clock_line(f: HostFacts) -> str | None:
    c = f.get("clock") or {}
    sides = []
    for side, s in (("before", c.get("before") or {}), ("after", c.get("after") or {})):
        if "offset" in s:
            sides.append(f"{side} {_fmt_s(s['offset'])}" + (f" ± {_fmt_s(s['error'])}" if "error" in s else ""))
    if not sides and not c.get("errors"):
        return None
    line = "clock offset: " + (", ".join(sides) or "not measured")
    if c.get("drift_ppm") is not None:
        line += f"; drift {c['drift_ppm']:.2f} ppm"
    if c.get("errors"):
        line += "; errors: " + "; ".join(c["errors"])
    return line


def scraper_line(f: HostFacts) -> str | None:
    sc = f.get("scraper") or {}
    if not sc:
        return None
    line = f"/metrics scraped from {sc.get('url', '?')}"
    if sc.get("scrapes") is not None:
        line += f": {sc['scrapes']:,} scrapes, {sc.get('failed', 0):,} failed"
    if sc.get("failed") and sc.get("last_error"):
        line += f" (last: {sc['last_error']})"
    return line


def parse_line(f: HostFacts) -> str | None:
    p = f.get("parse") or {}
    if not p:
        return None
    items = []
    for name, rec in p.items():
        text = f"{name} {rec.get('lines', '?'):,} lines" if isinstance(rec.get("lines"), int) else f"{name} ? lines"
        text += f", **{rec['skipped']:,} skipped**" if rec.get("skipped") else ", 0 skipped"
        if rec.get("error"):
            text += f" (error: {rec['error']})"
        items.append(text)
    return "parsed: " + "; ".join(items)


def migrations_line(f: HostFacts) -> str | None:
    """"migrations/s: the kernel's count (...)"; None where the process table did not say."""
    counted = [MIGRATIONS_TEXT.get(c.strip(), c) for c in str(f.get("migrations_counted") or "").split(",") if c]
    return "migrations/s: " + "; in part ".join(counted) if counted else None


def host_lines(host: str, f: HostFacts) -> list[str]:
    """Markdown lines (one header, then sub-bullets) describing one host."""
    where = ", ".join(x for x in (f.get("hostname"), f.get("kernel") and f"Linux {f['kernel']}") if x)
    head = f"**{host}**" + (f" ({where})" if where else "")
    cpu = cpu_line(f)
    lines = [head + (f": {cpu}" if cpu else "")]
    for line in (service_line(f), process_line(f), *tree_lines(f), migrations_line(f), collectors_line(f),
                 scraper_line(f), clock_line(f), parse_line(f)):
        if line:
            lines.append(line)
    not_run = {n for n, c in (f.get("collectors") or {}).items() if not c.get("enabled")}
    for w in f.get("warnings") or []:
        if not any(w.startswith(f"collector {n} skipped") for n in not_run):  # already in "not run"
            lines.append(f"warning: {w}")
    return lines
