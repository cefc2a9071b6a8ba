"""Real closed-loop QPS noise against window length (what a probe's early end must allow for), real processes.

The knee search may end a growth probe early once its scaling is certain; bench/search_sim.py
models a probe's QPS noise as ∝ 1/√rows.  This bench measures the real noise: it starts the demo
target (kneeswarm.launch.cli start_target, as bench/search.py does) and runs ``kneeswarm run`` with a fixed
grid at a fixed hold (``hold = 60``, ``settle = 1``, closed loop, 1 worker) against

- ``--mode knee --slots 24`` (service 200 ms), users 4, 8, 16 (all below the knee),
- ``--mode usl --sigma 0.02 --kappa 0.002``, users 4, 8,

both targets side by side (two `kneeswarm run` processes), the whole thing twice (two runs).
Each step's successful rows after its settle (summary steps' [t_lo, t_hi), by t_start, the rows
locustfiles/steady.py judges) are cut, for each window length t in WINDOWS, into non-overlapping
windows of t seconds.  Per (target, users) and t it prints:

- n: the windows (both runs);
- σ_t within: std of the windows' QPS, each relative to its own step's mean QPS, pooled over the
  two runs (one degree of freedom per step spent on its mean): the within-step noise, sampling
  plus slow drift;
- σ_t incl. run-to-run: std (ddof 1) of the windows' QPS relative to the two runs' mean, so a
  run's offset counts too;
- hw_z/1.96: the mean over the windows of steady.qps_half_width(per-second counts of the window's
  whole seconds) / 1.96 -- the σ steady's interval claims (calibrated when it matches σ_t);
- hw_t/1.96: the same with Student's t_{0.975,k−1} in place of 1.96 (k: the window's seconds);
- hw_N/1.96: steady.closed_loop_qps_half_width with the step's users (the half-width the code uses:
  the count's ends, users/(rows − users), and the mean latency's noise) / 1.96;
- cover t, cover N: the share of the windows whose QPS is within hw_t, hw_N of its step's mean (a 95 %
  half-width should hold 95 % of them or more);
- σ_t·√t: constant if σ ∝ 1/√rows;

then the fit σ(t)² = sys² + samp²·(15.5/t) (least squares over t, weighted by the windows' n − 1):
sys the part that does not shrink with the window, samp the sampling σ at 15.5 s.  And the
systematic part between runs: per (target, users) the full-step QPS of each run, their relative
difference, and QPS / users against the truth (knee: min(N, K)/0.2 s; usl: N/(0.2 s·(1 + σ(N−1) +
κN(N−1)))).

    nice python bench/qps_noise.py [--keep DIR]      # runs the load (~6.5 min), then prints
    python bench/qps_noise.py --from DIR             # prints again from the runs kept in DIR
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneeswarm.launch.cli import start_target, stop_target  # noqa: E402
from kneeswarm.contracts.rundir import RunDir  # noqa: E402
from kneeswarm.locustfiles.steady import Z95, closed_loop_qps_half_width, qps_half_width  # noqa: E402

SERVICE_S = 0.2  # the targets' service time (bench/search.py's 200 ms)
SLOTS = 24  # knee target: saturates at 24 users, so 4, 8, 16 all scale linearly
SIGMA, KAPPA = 0.02, 0.002
CASES = {"knee": (["--mode", "knee", "--slots", str(SLOTS)], [4, 8, 16]),
         "usl": (["--mode", "usl", "--sigma", str(SIGMA), "--kappa", str(KAPPA)], [4, 8])}
HOLD_S = 60  # ~60 s a step: 3 + 2 steps side by side, twice, keeps the load near 7 min
PLAN = "[load]\nsteps = {steps}\nhold = {hold}\nsettle = 1\nramp = 0.5\nworkers = 1\n"
WINDOWS = [3.0, 4.0, 6.0, 9.0, 12.0, 15.5]
REF_T = 15.5  # the full probe the sim's 3 % refers to
RUNS = 2
RUN_TIMEOUT_S = 900


def truth_qps(kind: str, n: int) -> float:
    if kind == "knee":
        return min(n, SLOTS) / SERVICE_S
    return n / (SERVICE_S * (1 + SIGMA * (n - 1) + KAPPA * n * (n - 1)))


def run_once(work: Path, hold: int) -> None:
    """Both targets' grids side by side, each on its own target process; run dirs under work/<kind>."""
    targets = {kind: start_target([*args, "--service-ms", str(SERVICE_S * 1000)]) for kind, (args, _) in CASES.items()}
    procs = {}
    try:
        for kind, (_, users) in CASES.items():
            plan = work / f"{kind}.toml"
            plan.write_text(PLAN.format(steps=users, hold=hold))
            procs[kind] = subprocess.Popen([sys.executable, "-m", "kneeswarm.launch.cli", "run", str(plan), "--target",
                                            targets[kind][1], "--out", str(work / kind), "-q"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for kind, p in procs.items():
            _, err = p.communicate(timeout=RUN_TIMEOUT_S)
            if p.returncode != 0:
                print(f"{kind}: kneeswarm run exited {p.returncode}: {err.strip()[-500:]}", file=sys.stderr)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for proc, _ in targets.values():
            stop_target(proc)


Step = tuple[np.ndarray, np.ndarray, float, float]  # successful rows' t_start (sorted), their latency_ms, t_lo, t_hi


def step_rows(run: Path) -> dict[int, Step]:
    """{users: (successful rows' t_start in [t_lo, t_hi), their latency_ms, t_lo, t_hi)} of one run's steps."""
    summary = json.loads((run / "report" / "summary.json").read_text())
    df = RunDir.open(run).read_requests()
    out = {}
    for i, s in enumerate(summary["steps"]):
        if s.get("t_lo") is None or s.get("t_hi") is None:
            continue
        mine = (df["step"].to_numpy() == i) & df["ok"].to_numpy().astype(bool)
        t, lat = df["t_start"].to_numpy()[mine], df["latency_ms"].to_numpy()[mine]
        keep = (t >= s["t_lo"]) & (t < s["t_hi"])
        order = np.argsort(t[keep], kind="stable")
        out[int(s["users"])] = (t[keep][order], lat[keep][order], float(s["t_lo"]), float(s["t_hi"]))
    return out


def windows(step: Step, users: int, w: float) -> list[tuple[float, float, float, float]]:
    """Per non-overlapping window of w seconds: (QPS, hw_z, hw_t, hw_N), relative 95 % half-widths:
    hw_z, hw_t from the per-second counts of the window's whole seconds (steady.qps_half_width),
    hw_N steady.closed_loop_qps_half_width with the users (whole seconds too)."""
    t, lat, t_lo, t_hi = step
    out = []
    k = int(math.floor(w))
    for i in range(int((t_hi - t_lo) // w)):
        a = t_lo + i * w
        rows = t[(t >= a) & (t < a + w)]
        counts = np.bincount(((rows - a) // 1.0).astype(int), minlength=k)[:k].astype(float)
        hw = qps_half_width(counts)
        out.append((len(rows) / w, hw, hw * float(stats.t.ppf(0.975, k - 1)) / Z95,
                    closed_loop_qps_half_width(users, t, lat, a, a + k)))
    return out


def collect(root: Path) -> dict[tuple[str, int], list[Step]]:
    """{(kind, users): [each run's step rows]} from root/run<i>/<kind>/<run dir>."""
    out: dict[tuple[str, int], list[Step]] = {}
    for r in sorted(root.glob("run*")):
        for kind in CASES:
            runs = sorted((r / kind).iterdir()) if (r / kind).is_dir() else []
            for run in runs[:1]:
                for users, rows in step_rows(run).items():
                    out.setdefault((kind, users), []).append(rows)
    return out


def noise_rows(steps: list[Step], users: int, w: float) -> dict:
    """One window length's figures over the steps (runs) of one (target, users)."""
    full = [len(t) / (hi - lo) for t, _, lo, hi in steps]
    grand = float(np.mean(full))
    within, across, hz, ht, hn = [], [], [], [], []
    for step, mean in zip(steps, full):
        for qps, hw_z, hw_t, hw_n in windows(step, users, w):
            within.append(qps / mean - 1)  # each step's own mean: the within-step noise
            across.append(qps / grand - 1)  # the runs' mean: run-to-run offsets count too
            hz.append(hw_z)
            ht.append(hw_t)
            hn.append(hw_n)
    err = np.abs(within)
    n, dof = len(within), len(within) - len(steps)  # one mean estimated per step
    return {"t": w, "n": n, "dof": dof, "sigma": math.sqrt(sum(d * d for d in within) / dof) if dof > 0 else math.nan,
            "sigma_all": float(np.std(across, ddof=1)) if n > 1 else math.nan,
            "hw_z": float(np.mean(hz)) / Z95, "hw_t": float(np.mean(ht)) / Z95, "hw_n": float(np.mean(hn)) / Z95,
            "cover_t": float(np.mean(err <= np.array(ht))), "cover_n": float(np.mean(err <= np.array(hn))),
            "poisson": 1 / math.sqrt(grand * w)}


def fit(rows: list[dict], key: str) -> tuple[float, float]:
    """(sys, samp) of σ(t)² = sys² + samp²·(REF_T/t), least squares weighted by each σ's degrees of
    freedom; sys² clamped at 0 (a negative variance is noise in the fit, refit through the origin)."""
    x = np.array([REF_T / r["t"] for r in rows])
    y = np.array([r[key] ** 2 for r in rows])
    w = np.array([max(r["dof"], 0) for r in rows], dtype=float)
    ok = np.isfinite(y) & (w > 0)
    x, y, w = x[ok], y[ok], w[ok]
    if len(x) < 2:
        return math.nan, math.nan
    a, b = np.linalg.lstsq(np.c_[np.ones_like(x), x] * np.sqrt(w)[:, None], y * np.sqrt(w), rcond=None)[0]
    if a < 0:
        a, b = 0.0, float(np.sum(w * x * y) / np.sum(w * x * x))
    return math.sqrt(max(a, 0.0)), math.sqrt(max(b, 0.0))


def report(data: dict) -> int:
    if not data:
        print("no steps with rows found (no run directories?)", file=sys.stderr)
        return 2
    pct = lambda v: f"{v:.2%}"  # noqa: E731
    for (kind, users), steps in sorted(data.items()):
        print(f"\n### {kind} users={users} ({len(steps)} runs, truth {truth_qps(kind, users):.2f} QPS)")
        print("| t s | windows | σ_t within | σ_t incl. run-to-run | hw_z/1.96 | hw_t/1.96 | hw_N/1.96 | cover t | "
              "cover N | σ_t·√t | 1/√rows |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = [noise_rows(steps, users, w) for w in WINDOWS]
        for r in rows:
            print(f"| {r['t']:g} | {r['n']} | {pct(r['sigma'])} | {pct(r['sigma_all'])} | {pct(r['hw_z'])} | "
                  f"{pct(r['hw_t'])} | {pct(r['hw_n'])} | {r['cover_t']:.0%} | {r['cover_n']:.0%} | "
                  f"{r['sigma'] * math.sqrt(r['t']):.4f} | {pct(r['poisson'])} |")
        for key, name in (("sigma", "within"), ("sigma_all", "incl. run-to-run")):
            sys_, samp = fit(rows, key)
            print(f"fit ({name}): sys = {pct(sys_)}, samp(15.5 s) = {pct(samp)}")
    print("\n### systematic: full-step QPS by run")
    print("| target | users | QPS by run | rel. diff (r2−r1)/mean | QPS/user by run | truth QPS/user | vs truth |")
    print("|---|---:|---|---:|---|---:|---|")
    for (kind, users), steps in sorted(data.items()):
        full = [len(t) / (hi - lo) for t, _, lo, hi in steps]
        diff = (full[-1] - full[0]) / float(np.mean(full)) if len(full) > 1 else math.nan
        truth = truth_qps(kind, users)
        print(f"| {kind} | {users} | {', '.join(f'{q:.2f}' for q in full)} | {pct(diff)} | "
              f"{', '.join(f'{q / users:.3f}' for q in full)} | {truth / users:.3f} | "
              f"{', '.join(f'{q / truth - 1:+.2%}' for q in full)} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="keep the runs in this directory (created)")
    ap.add_argument("--from", dest="src", type=Path, help="print from the runs kept in this directory; run nothing")
    ap.add_argument("--hold", type=int, default=HOLD_S, help="seconds each step is held (default %(default)s)")
    args = ap.parse_args()
    if args.src is not None and not args.src.is_dir():
        print(f"--from {args.src}: not a directory", file=sys.stderr)
        return 2
    if args.hold <= REF_T + 1:
        print(f"--hold {args.hold}: must exceed {REF_T + 1:g} s (one {REF_T:g} s window after the settle)", file=sys.stderr)
        return 2
    if args.src is not None:
        return report(collect(args.src))
    with tempfile.TemporaryDirectory(prefix="kneeswarm-bench-noise-") as tmp:
        root = args.keep or Path(tmp)
        for i in range(RUNS):
            (root / f"run{i + 1}").mkdir(parents=True, exist_ok=True)
            run_once(root / f"run{i + 1}", args.hold)
        return report(collect(root))


if __name__ == "__main__":
    sys.exit(main())
