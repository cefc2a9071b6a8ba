"""A two-hour soak's row stream through every process that holds it: peak RSS and seconds of each.

    .venv/bin/python bench/soak.py                  # 36M rows over 2 h (5,000 requests/s), 60-s windows
    .venv/bin/python bench/soak.py --rows 2e6       # a quick check at the same 2 h and windows
    .venv/bin/python bench/soak.py --threads 256    # the monitored process with 256 threads
    .venv/bin/python bench/soak.py --source pidstat # its process and threads from pidstat -t (a shell-agent host)

Soaks last hours: bounded memory for the whole run on every process.  Each process runs as a child of
its own, in the order a real soak runs them (peak RSS: the child's VmHWM, ``peak_rss_mb``):

* ``master``: the Locust master's ingest, ``kneeswarm.locustfiles.recorder.RequestWriter``: the rows arrive
  as workers send them (lists of values per column, WORKERS workers, one report per worker every
  REPORT_S) and are stamped with their window (one step per window, as kneeswarm.contracts.plan makes a
  soak) and written as one part every FLUSH_S seconds of the run.  The run directory it leaves is
  the one the others read (plus 2 h of raw host samples as agents fetch them: the monitored
  process with THREADS threads from ``--source``, vmstat, fds.jsonl).
* ``parse procfs`` / ``parse pidstat``: kneeswarm.collectors.parsed.write_parsed_csvs of each source's 2-h raw
  file alone (what an agent does after its final fetch, and analysis after a crash): the /proc
  sampler's procfs.jsonl (the default source: the process every second, its threads every
  kneeswarm.collectors.procfs.THREAD_INTERVAL seconds, in the agent's format) and pidstat -t's text (every
  thread every second: the shell agent's source).
* ``conductor``: ``kneeswarm.launch.progress.Progress`` reading every part as the run goes (what
  `kneeswarm run` prints, and the web UI's live table through kneeswarm.launch.lifecycle).
* ``analysis``: ``analysis.analyze`` of the whole directory (host CSVs rebuilt from raw of
  ``--source``, the windows' statistics, the soak's series and trends, the report).

Generated directories are cached under ``--cache`` and reused (the master's figures are then
those of the run that made it: ``master.json``).  Targets (2 cores): <= 2 GB each, analysis <= 60 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

T0 = 1_796_000_000.0
DURATION_S = 7200.0
WINDOW_S = 60.0
USERS = 64
RAMP_S, SETTLE_S = 10.0, 5.0
FLUSH_S = 2.0  # locustfiles/recorder.py FLUSH_INTERVAL
REPORT_S = 1.0  # a worker's report every second (Locust's WORKER_REPORT_INTERVAL is 3 s: smaller batches cost more)
WORKERS = 4
THREADS = 64
PID = 4000
SOURCES = {"procfs": "procfs.jsonl", "pidstat": "pidstat.txt"}  # --source: the raw file of the process and threads
LEAK_MB_PER_S = 0.05  # the monitored process's RSS grows: memory_growth is found (a finding, not a no-op)
DEFAULT_CACHE = Path("/tmp/kneeswarm-bench-soak")
POLL_PARTS = 10  # the conductor polls once a second; here once per 10 parts (20 s of the run)


def plan_toml() -> str:
    from kneeswarm.contracts.planfile import plan_from_dict

    plan = plan_from_dict({"name": "bench-soak", "target": "http://127.0.0.1:8000", "load": {
        "mode": "soak", "users": USERS, "duration": DURATION_S, "window": WINDOW_S, "ramp": RAMP_S, "settle": SETTLE_S}})
    return plan.to_toml()


def windows() -> list[list[float]]:
    """steps.csv of the soak: the first window ramps, each later one starts where the one before ended."""
    n = int(DURATION_S / WINDOW_S)
    steady = T0 + RAMP_S
    out = [[0, USERS, T0, steady, steady + WINDOW_S]]
    for i in range(1, n):
        out.append([i, USERS, steady + i * WINDOW_S, steady + i * WINDOW_S, steady + (i + 1) * WINDOW_S])
    return out


def report(rng: np.random.Generator, start: float, n: int) -> dict[str, list]:
    """One worker's report: ``n`` rows of the wire format (lists, as Locust's report carries them)."""
    t = np.sort(rng.uniform(start, start + REPORT_S, n))
    lat = rng.lognormal(np.log(12.0), 0.3, n)
    ok = rng.random(n) > 0.001
    return {"t_start": t.tolist(), "latency_ms": lat.tolist(), "bytes": [412] * n, "ok": ok.tolist(),
            "status": np.where(ok, 200, 503).tolist(), "error": [None if o else "http_5xx" for o in ok],
            "name": ["infer"] * n, "tokens_in": [128] * n}


def master(path: Path, rows: int) -> dict[str, float]:
    """The master's ingest of ``rows`` rows over DURATION_S (in this process)."""
    from kneeswarm.contracts.rundir import RunDir
    from kneeswarm.locustfiles.recorder import RequestWriter

    rd = RunDir(path)
    steps = windows()
    rate = rows / (DURATION_S - RAMP_S)
    rng = np.random.default_rng(7)
    writer = RequestWriter(rd, lambda: [(s[2], s[1]) for s in steps])
    t = time.perf_counter()
    for k, start in enumerate(np.arange(T0 + RAMP_S, T0 + DURATION_S, REPORT_S)):
        for w in range(WORKERS):
            writer.add(f"worker-{w}", report(rng, start, int(rng.poisson(rate * REPORT_S / WORKERS))))
        if (k + 1) % int(FLUSH_S / REPORT_S) == 0:
            writer.flush()
    writer.flush()
    return {"seconds": time.perf_counter() - t, "rows": writer.rows_written}


def pidstat_text() -> str:
    """2 h of ``pidstat -t`` of a THREADS-thread process (bench/analysis.py's text), its RSS growing."""
    import bench.analysis as ba

    ba.DURATION_S, ba.T0, ba.THREADS = DURATION_S, T0, THREADS
    text = ba.pidstat_text(np.random.default_rng(8), PID)
    lines, k = [], 0
    for line in text.splitlines():
        tok = line.split()
        if len(tok) > 3 and tok[2] == str(PID) and tok[3] == "-":  # the process line: its RSS (kB) grows
            line = line.replace(" 2345678 ", f" {2345678 + int(LEAK_MB_PER_S * 1024 * k)} ", 1)
            k += 1
        lines.append(line)
    return "\n".join(lines) + "\n"


def procfs_lines() -> Iterator[str]:
    """2 h of the agent's /proc sampler (agents/remote/samplers.py ProcSampler; the format in
    collectors/procfs.py's docstring) for a THREADS-thread process: a sample every second, the
    threads (``tasks``, cumulative ticks and switches) every THREAD_INTERVAL s; its RSS growing."""
    from kneeswarm.collectors.procfs import THREAD_INTERVAL

    rng = np.random.default_rng(9)
    hz, every = 100, int(THREAD_INTERVAL)
    tids = np.arange(PID, PID + THREADS)
    names = ["python"] + [f"worker{j}" for j in range(1, THREADS)]
    ticks = np.zeros((THREADS, 2))  # utime, stime per thread
    cs = np.zeros((THREADS, 2))  # voluntary, nonvoluntary
    wait_ns = blkio = 0
    core = np.arange(THREADS) % 64
    for k in range(int(DURATION_S)):
        pct = rng.uniform(0.0, 90.0, THREADS) * (rng.random(THREADS) < 0.6)  # some threads idle each second
        ticks += np.column_stack([pct * 0.95, pct * 0.05]) * hz / 100.0
        cs += rng.poisson([120.0, 30.0], (THREADS, 2))
        wait_ns += int(rng.integers(0, 50_000_000))
        rec: dict[str, object] = {
            "t": round(T0 + k + rng.uniform(0.0, 0.004), 3), "pid": PID, "utime": int(ticks[:, 0].sum()),
            "stime": int(ticks[:, 1].sum()), "clk_tck": hz, "rss_kb": 2345678 + int(LEAK_MB_PER_S * 1024 * k),
            "vsz_kb": 9876543, "threads": THREADS, "minflt": 3088 + 10 * k, "majflt": 0, "ncpu": 64,
            "read_bytes": 0, "write_bytes": 4096 * k}
        if k % every == 0:
            move = rng.random(THREADS) < 0.01  # a thread stays on its core, a few move each sample
            core = np.where(move, rng.integers(0, 64, THREADS), core)
            rec.update(vol_cs=int(cs[:, 0].sum()), invol_cs=int(cs[:, 1].sum()), wait_ns=wait_ns, blkio_ticks=blkio,
                       tasks=[[int(tid), n, int(u), int(s), int(c), int(v), int(nv)] for tid, n, u, s, c, v, nv
                              in zip(tids, names, ticks[:, 0], ticks[:, 1], core, cs[:, 0], cs[:, 1])])
        yield json.dumps(rec) + "\n"


def write_raw(raw: Path, source: str) -> Path:
    """``source``'s 2-h raw file in ``raw`` (kept if there)."""
    path = raw / SOURCES[source]
    if not path.exists():
        raw.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            if source == "pidstat":
                f.write(pidstat_text())
            else:
                f.writelines(procfs_lines())
        tmp.rename(path)
    return path


def write_hosts(path: Path, source: str) -> dict[str, object]:
    """2 h of raw samples of one monitored host: ``source``'s file, vmstat, fds."""
    import bench.analysis as ba
    from kneeswarm.contracts.rundir import RunDir

    ba.DURATION_S, ba.T0 = DURATION_S, T0
    rng = np.random.default_rng(8)
    rd = RunDir(path)
    raw = rd.raw_dir("server")
    raw.mkdir(parents=True, exist_ok=True)
    os.link(write_raw(path.parent / f"raw-threads{THREADS}", source), raw / SOURCES[source])
    (raw / "vmstat.txt").write_text(ba.vmstat_text(rng))
    (raw / "fds.jsonl").write_text("".join(json.dumps({"t": T0 + k, "pid": 4000, "fds": 40}) + "\n"
                                           for k in range(int(DURATION_S))))
    side = {"offset": 0.0, "error": 5e-5, "rtt_min": 1e-4, "rtt_median": 1.5e-4, "rounds": 20, "kept": 10, "t": T0}
    return {"server": {"clock": {"before": side, "after": {**side, "t": T0 + DURATION_S}}}}


def generate(path: Path, rows: int, source: str) -> None:
    """The run directory, written by the master's ingest (measured: master.json), cached; the
    request parts of another cached directory of the same rows are linked, not written again."""
    from kneeswarm.contracts.rundir import RunDir

    if (path / ".generated").exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    for sub in ("generator", "hosts", "report"):
        (path / sub).mkdir(parents=True)
    rd = RunDir(path)
    rd.plan_path.write_text(plan_toml())
    rd.write_steps(windows())
    done = [p for p in path.parent.glob(f"{rows}*/.generated") if p.read_text().strip() == str(rows)]
    if done:
        shutil.copytree(done[0].parent / "requests", path / "requests", copy_function=os.link)
        shutil.copy(done[0].parent / "master.json", path / "master.json")
    else:
        (path / "requests").mkdir()
        (path / "master.json").write_text(json.dumps(run_child("master", path, rows)))
    rd.update_meta(run_id=f"bench-soak-{rows}", complete=True, ended="completed", started=T0,
                   finished=T0 + DURATION_S, hosts=write_hosts(path, source))
    (path / ".generated").write_text(f"{rows}\n")


def conductor(path: Path) -> dict[str, object]:
    """kneeswarm.launch.progress over every part, as `kneeswarm run` reads them while the run goes."""
    import io

    from kneeswarm.contracts.planfile import load_plan
    from kneeswarm.launch.progress import Progress
    from kneeswarm.contracts.rundir import RunDir

    rd = RunDir(path)
    progress = Progress(rd, load_plan(rd.plan_path), stream=io.StringIO(), live=False)
    parts = rd.request_parts()
    t = time.perf_counter()
    for k in range(0, len(parts), POLL_PARTS):  # the parts as a poll finds them while the run goes
        rd.request_parts = lambda k=k: parts[:k + POLL_PARTS]  # type: ignore[method-assign]
        progress.poll(force=True)
    progress.finish()
    return {"seconds": time.perf_counter() - t, "lines": progress.stream.getvalue().count("\n")}


def parse_child(raw: Path, source: str) -> dict[str, object]:
    """kneeswarm.collectors.parsed.write_parsed_csvs of ``source``'s raw file alone, into a scratch run directory."""
    import tempfile

    from kneeswarm.collectors.parsed import write_parsed_csvs
    from kneeswarm.contracts.rundir import RunDir

    with tempfile.TemporaryDirectory(dir=raw.parent) as tmp:
        rd = RunDir(Path(tmp))
        rd.raw_dir("server").mkdir(parents=True)
        os.link(raw / SOURCES[source], rd.raw_dir("server") / SOURCES[source])
        t = time.perf_counter()
        stats = write_parsed_csvs(rd, "server", 0.0, [source])
        seconds = time.perf_counter() - t
        mb = {p.name: round(p.stat().st_size / 2**20) for p in rd.host_dir("server").glob("*.csv")}
    return {"seconds": seconds, "raw_mb": round((raw / SOURCES[source]).stat().st_size / 2**20),
            "rows": stats[source]["tables"], "csv_mb": mb}


def analysis_child(path: Path) -> dict[str, object]:
    from kneeswarm import analysis

    for csv in (path / "hosts").glob("*/*.csv"):
        csv.unlink()  # rebuilt from raw, as after a crash (the heavier path)
    t = time.perf_counter()
    s = analysis.analyze(path)
    return {"seconds": time.perf_counter() - t, "requests": s["totals"]["requests"], "windows": len(s["steps"]),
            "findings": [f["id"] for f in s["findings"]], "warnings": len(s["warnings"])}


def run_child(what: str, path: Path, rows: int = 0) -> dict[str, object]:
    """``what`` in a fresh child process; its figures plus its peak RSS (MB)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, __file__, "--child", what, "--rows", str(rows), "--cache", str(path),
                          "--threads", str(THREADS)], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(what: str, path: Path, rows: int) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    fig = {"master": lambda: master(path, rows), "conductor": lambda: conductor(path),
           "analysis": lambda: analysis_child(path), "parse procfs": lambda: parse_child(path, "procfs"),
           "parse pidstat": lambda: parse_child(path, "pidstat")}[what]()
    fig["peak_rss_mb"] = peak_rss_mb()
    use = resource.getrusage(resource.RUSAGE_SELF)
    fig["cpu_s"] = round(use.ru_utime + use.ru_stime, 1)  # on a shared machine: what it cost, not its wait
    print(json.dumps(fig))


def peak_rss_mb() -> float:
    """This process's peak RSS: /proc/self/status VmHWM.  Not ``ru_maxrss``: Linux keeps in it the
    RSS of the forked copy of the parent before exec (a parent of 460 MB read as a child's 461 MB)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=float, default=36e6, help="request rows over the 2 h (default 36e6)")
    ap.add_argument("--threads", type=int, default=THREADS, help=f"threads of the monitored process (default {THREADS})")
    ap.add_argument("--source", choices=sorted(SOURCES), default="procfs",
                    help="the raw file of the process and threads the analysis reads (default procfs, the agent's)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows = int(args.rows)
    globals()["THREADS"] = args.threads
    if args.child:
        child(args.child, args.cache, rows)
        return
    path = args.cache / f"{rows}-threads{args.threads}-{args.source}"
    generate(path, rows, args.source)
    raw = args.cache / f"raw-threads{args.threads}"
    for source in SOURCES:
        write_raw(raw, source)
    figures = {"master": json.loads((path / "master.json").read_text()),
               "conductor": run_child("conductor", path),
               **{f"parse {s}": run_child(f"parse {s}", raw) for s in SOURCES},
               "analysis": run_child("analysis", path)}
    for what, f in figures.items():
        print(f"{what:>13}: peak RSS {f['peak_rss_mb']:7.0f} MB, {f['seconds']:6.1f} s ({f.get('cpu_s', math.nan):6.1f} s CPU)  "
              f"{ {k: v for k, v in f.items() if k not in ('peak_rss_mb', 'seconds', 'cpu_s')} }", flush=True)
    print(f"{rows:,} rows over {DURATION_S:.0f} s in {int(DURATION_S / WINDOW_S)} windows of {WINDOW_S:.0f} s, "
          f"a {args.threads}-thread process from {args.source}; "
          "targets (2 cores): <= 2048 MB each, analysis <= 60 s")


if __name__ == "__main__":
    main()
