"""Analysis at scale: a generated run of one hour at 10,000 requests/s, analysed end to end.

    .venv/bin/python bench/analysis.py                 # 36M rows, and 18M for the ratio
    .venv/bin/python bench/analysis.py --rows 2e6      # a quick check (and 1M for the ratio)
    .venv/bin/python bench/analysis.py --rows 2e6 --no-ratio
    .venv/bin/python bench/analysis.py --rows 2e6 --no-ratio --streaming 32   # LLM rows: 32 gaps each

The run directory is what a real run leaves (kneeswarm/contracts/rundir.py): request parts written with
``RunDir.write_request_part`` every FLUSH_S seconds of the run (the recorder's cadence, rows a
little out of order across parts, as workers' batches arrive), one generator CSV per worker, and
HOSTS hosts with one hour of 1-s samples as *raw* text only (``pidstat -H -h -u -r -w -t`` with
THREADS threads, ``vmstat -n -t -w``), so analysis rebuilds the parsed CSVs from raw/ too.
The requests are spread over the hour at the same ROWS/3600 rate whatever ``--rows`` says.

Each size is analysed in a fresh child process (``analysis.analyze``, report included); the
child prints its wall seconds and peak RSS (``ru_maxrss``).  Generated directories are cached
under ``--cache`` (default /tmp/kneeswarm-bench-analysis/<rows>) and reused; the reports are
rewritten by each analysis.  Targets on 2 cores (1 h at 10k/s): <= 60 s and <= 2 GB at 36M rows, and
the 36M/18M ratio of the seconds <= 2.2.

``--streaming GAPS``: every row is a streamed LLM answer (TTFT, GAPS inter-token gaps, GAPS + 1
output tokens, both token counts), so kneeswarm.analysis.measure.streaming's cost and memory show; cached apart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from kneeswarm.contracts.plan import AnalysisPlan, LoadPlan, Plan  # noqa: E402
from kneeswarm.contracts.rundir import RunDir, write_csv  # noqa: E402

T0 = 1_796_000_000.0  # epoch of the first step's ramp
DURATION_S = 3600.0
USERS = (8, 16, 32, 64, 128, 256)
QPS_SHARE = (0.4, 0.8, 1.2, 1.2, 1.2, 1.2)  # x the mean rate: scaling, then flat (mean 1.0)
RAMP_S = 10.0
FLUSH_S = 2.0  # locustfiles/recorder.py FLUSH_INTERVAL: one part every 2 s
LATE_SHARE = 0.02  # rows of a flush interval that arrive in the next part
WORKERS = 4
HOSTS = 3
THREADS = 64
ERROR_SHARE = 0.001
CLOCK_ERROR_S = 5e-5
DEFAULT_CACHE = Path("/tmp/kneeswarm-bench-analysis")


def step_table() -> list[list[float]]:
    hold = DURATION_S / len(USERS) - RAMP_S
    rows, t = [], T0
    for i, n in enumerate(USERS):
        rows.append([i, n, t, t + RAMP_S, t + RAMP_S + hold])
        t += RAMP_S + hold
    return rows


def streaming_columns(n: int, lat: np.ndarray, gaps: int, rng: np.random.Generator) -> dict[str, object]:
    """The streaming columns of ``n`` rows: TTFT a quarter of the latency, the rest in ``gaps`` equal-ish gaps."""
    import pyarrow as pa

    ttft = lat * 0.25
    values = (np.repeat(lat * 0.75 / gaps, gaps) * rng.lognormal(0.0, 0.1, n * gaps)).astype(np.float32)
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * gaps)
    return {"ttft_ms": ttft, "itl_ms": pa.ListArray.from_arrays(offsets, pa.array(values)),
            "tokens_out": np.full(n, gaps + 1, np.int64), "usage_out": np.full(n, gaps + 1, np.int64),
            "chunks_out": np.full(n, gaps + 1, np.int64), "tokens_counted": np.zeros(n, dtype=bool)}


def write_requests(rd: RunDir, total_rows: int, steps: list[list[float]], rng: np.random.Generator,
                   gaps: int = 0) -> None:
    """Request parts, one per FLUSH_S of the run; latency from Little's law (N = X R); with ``gaps``,
    streamed LLM rows (streaming_columns)."""
    mean_rate = total_rows / DURATION_S
    bounds = np.array([s[2] for s in steps] + [steps[-1][4]])
    rate = np.array([mean_rate * q for q in QPS_SHARE])
    carry: dict[str, np.ndarray] | None = None
    seq = 0
    workers = np.array([f"worker-{w}" for w in range(WORKERS)])
    for start in np.arange(T0, T0 + DURATION_S, FLUSH_S):
        i = int(np.searchsorted(bounds, start, side="right") - 1)
        n = rng.poisson(rate[i] * FLUSH_S)
        t = np.sort(rng.uniform(start, start + FLUSH_S, n))
        lat = USERS[i] / rate[i] * 1000.0 * rng.lognormal(-0.02, 0.2, n)
        ok = rng.random(n) > ERROR_SHARE
        cols = {"t_start": t, "latency_ms": lat, "ok": ok, "status": np.where(ok, 200, 503).astype(np.int32),
                "error": np.where(ok, None, "http_5xx"), "step": np.full(n, i, np.int32),
                "users": np.full(n, USERS[i], np.int32), "worker": workers[rng.integers(0, WORKERS, n)],
                "name": np.full(n, "infer", dtype=object), "tokens_in": np.full(n, 128, np.int64),
                "bytes": np.full(n, 412, np.int64)}
        if gaps:
            cols.update(streaming_columns(n, lat, gaps, rng))
        late = rng.random(n) < LATE_SHARE
        out = {k: _take(v, ~late) for k, v in cols.items()}
        if carry is not None:
            out = {k: _cat(carry[k], out[k]) for k in out}
        carry = {k: _take(v, late) for k, v in cols.items()}
        rd.write_request_part({k: _plain(v) for k, v in out.items()}, seq)
        seq += 1
    if carry is not None and len(carry["t_start"]):
        rd.write_request_part({k: _plain(v) for k, v in carry.items()}, seq)


def _take(v, mask: np.ndarray):
    return v.filter(mask) if hasattr(v, "filter") and not isinstance(v, np.ndarray) else v[mask]


def _cat(a, b):
    if isinstance(a, np.ndarray):
        return np.concatenate([a, b])
    import pyarrow as pa

    return pa.concat_arrays([a, b])


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray) and v.dtype == object else v


def write_generator(rd: RunDir, steps: list[list[float]]) -> None:
    secs = np.arange(T0, T0 + DURATION_S, 1.0)
    users = np.array(USERS)[np.searchsorted([s[2] for s in steps], secs, side="right") - 1]
    for w in range(WORKERS):
        write_csv(rd.generator_dir / f"worker-{w}.csv", ("t", "cpu_pct", "rss_mb", "users", "lag_ms"),
                  zip(secs + 0.3, np.full(len(secs), 45.0 + w), np.full(len(secs), 180.0), users // WORKERS,
                      np.full(len(secs), 1.0)))


PIDSTAT_HEADER = ("# Time        UID      TGID       TID    %usr %system  %guest   %wait    %CPU   CPU  minflt/s  "
                  "majflt/s     VSZ     RSS   %MEM   cswch/s nvcswch/s  Command")
VMSTAT_HEADER = (
    "--procs-- -----------------------memory---------------------- ---swap-- -----io---- -system-- "
    "----------cpu---------- -----timestamp-----\n"
    "   r    b         swpd         free         buff        cache   si   so    bi    bo   in   cs  us  sy  id  wa  "
    "st  gu                 UTC\n")


def pidstat_text(rng: np.random.Generator, pid: int) -> str:
    """``pidstat -H -h -u -r -w -t`` output: one block (header, process, THREADS threads) a second."""
    out = ["Linux 6.8.0 (server) \t2026-11-30 \t_x86_64_\t(64 CPU)", ""]
    for k in range(int(DURATION_S)):
        t = int(T0) + k
        cpu = rng.uniform(20.0, 90.0, THREADS)
        out.append(PIDSTAT_HEADER)
        out.append(f"{t:>10}      0 {pid:>9}         - {cpu.sum() * 0.95:7.2f} {cpu.sum() * 0.05:7.2f}    0.00    0.00 "
                   f"{cpu.sum():7.2f}     3      0.00      0.00 9876543 2345678   3.50      0.00      0.00  python")
        for j, c in enumerate(cpu):
            out.append(f"{t:>10}      0         - {pid + j:>9} {c * 0.95:7.2f} {c * 0.05:7.2f}    0.00    1.00 {c:7.2f}"
                       f" {j % 64:5d}      0.00      0.00 9876543 2345678   3.50    120.00     30.00  |__python")
        out.append("")
    return "\n".join(out) + "\n"


def vmstat_text(rng: np.random.Generator) -> str:
    lines = [VMSTAT_HEADER.rstrip("\n")]
    for k in range(int(DURATION_S)):
        stamp = dt.datetime.fromtimestamp(T0 + k, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        us = int(rng.uniform(40, 80))
        lines.append(f"{int(rng.integers(2, 40)):4d} {0:4d} {0:12d} {23899676:12d} {5364:12d} {616436:12d} {0:4d} "
                     f"{0:4d} {0:5d} {0:5d} {600:4d} {int(rng.integers(5000, 90000)):4d} {us:3d} {5:3d} "
                     f"{95 - us:3d} {0:3d} {0:3d} {0:3d} {stamp}")
    return "\n".join(lines) + "\n"


def write_hosts(rd: RunDir, rng: np.random.Generator) -> dict[str, object]:
    hosts = {}
    for h in range(HOSTS):
        label = f"server-{h}"
        raw = rd.raw_dir(label)
        raw.mkdir(parents=True, exist_ok=True)
        (raw / "pidstat.txt").write_text(pidstat_text(rng, 4000 + 100 * h))
        (raw / "vmstat.txt").write_text(vmstat_text(rng))
        side = {"offset": 0.0, "error": CLOCK_ERROR_S, "rtt_min": 2 * CLOCK_ERROR_S, "rtt_median": 3 * CLOCK_ERROR_S,
                "rounds": 20, "kept": 10, "t": T0}
        hosts[label] = {"clock": {"before": side, "after": {**side, "t": T0 + DURATION_S}}}
    return hosts


def generate(path: Path, rows: int, gaps: int = 0) -> RunDir:
    """A run directory of ``rows`` request rows over one hour (cached: reused when complete)."""
    done = path / ".generated"
    if done.exists():
        return RunDir(path)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for sub in ("requests", "generator", "hosts", "report"):
        (path / sub).mkdir()
    rd = RunDir(path)
    rng = np.random.default_rng(7)
    plan = Plan(name="bench", load=LoadPlan(steps=list(USERS), ramp=RAMP_S, hold=DURATION_S / len(USERS) - RAMP_S,
                                            settle=5.0), analysis=AnalysisPlan())
    rd.plan_path.write_text(plan.to_toml())
    steps = step_table()
    rd.write_steps(steps)
    t = time.perf_counter()
    write_requests(rd, rows, steps, rng, gaps)
    write_generator(rd, steps)
    hosts = write_hosts(rd, rng)
    rd.update_meta(run_id=f"bench-{rows}", complete=True, ended="completed", started=T0,
                   finished=T0 + DURATION_S, hosts=hosts)
    done.write_text(f"{rows}\n")
    print(f"generated {rows:,} rows in {time.perf_counter() - t:.0f} s: {path}", flush=True)
    return rd


def fresh(path: Path) -> None:
    """Remove what analysis wrote (parsed host CSVs, the report), so each analysis starts from raw."""
    for host in (path / "hosts").iterdir():
        for csv in host.glob("*.csv"):
            csv.unlink()
    shutil.rmtree(path / "report", ignore_errors=True)


def child(path: str) -> None:
    """Analyse one run directory in this process; print {seconds, peak_rss_mb, ...} as JSON."""
    import logging

    from kneeswarm import analysis
    logging.basicConfig(level=logging.WARNING)
    t = time.perf_counter()
    s = analysis.analyze(path)
    seconds = time.perf_counter() - t
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    step = s["steps"][-1]
    streaming = None
    if step.get("itl_p99_ms") is not None:
        streaming = (f"last step: TTFT P99 {step['ttft_p99_ms']:.1f} ms, ITL P99 {step['itl_p99_ms']:.1f} ms over "
                     f"{step['itl_gaps']:,} gaps (sampled: {step['itl_sampled']}), {step['tokens_s']:,.0f} tokens/s")
    print(json.dumps({"seconds": seconds, "peak_rss_mb": rss_mb, "requests": s["totals"]["requests"],
                      "valid_steps": s["totals"]["valid_steps"], "knee": s["knee"]["users"],
                      "warnings": len(s["warnings"]), "findings": [f["id"] for f in s["findings"]],
                      "streaming": streaming}))


def measure(path: Path) -> dict[str, object]:
    fresh(path)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, __file__, "--child", str(path)], env=env, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"analysis of {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=float, default=36e6, help="request rows over the hour (default 36e6)")
    ap.add_argument("--no-ratio", action="store_true", help="skip the half-size run")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--streaming", type=int, default=0, metavar="GAPS",
                    help="streamed LLM rows with GAPS inter-token gaps each (cached apart)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    sizes = [int(args.rows)] if args.no_ratio else [int(args.rows) // 2, int(args.rows)]
    results = {}
    for rows in sizes:
        rd = generate(args.cache / (f"{rows}-stream{args.streaming}" if args.streaming else str(rows)), rows,
                      args.streaming)
        results[rows] = r = measure(rd.path)
        print(f"{rows:>12,} rows: {r['seconds']:6.1f} s, peak RSS {r['peak_rss_mb']:7.0f} MB "
              f"({r['valid_steps']} valid steps, knee {r['knee']}, {r['warnings']} warnings, findings {r['findings']})",
              flush=True)
        if r.get("streaming"):
            print(f"{'':>12}  {r['streaming']}", flush=True)
    if len(sizes) == 2:
        a, b = (results[n] for n in sizes)
        print(f"ratio {sizes[1]:,} / {sizes[0]:,} rows: seconds {b['seconds'] / a['seconds']:.2f}, "
              f"peak RSS {b['peak_rss_mb'] / a['peak_rss_mb']:.2f}")
    print("targets (36M rows, 2 cores): <= 60 s, <= 2048 MB, seconds ratio <= 2.2")


if __name__ == "__main__":
    main()
