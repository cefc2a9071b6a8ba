"""The search's decisions (issue 18) on closed forms with QPS noise, many seeds: how often the knee
it reports (the last scaling probe) is within max(1 user, 10 %) of the truth, and what it costs.

The cases are bench/search.py's: ``knee:K`` (K slots of service S: QPS = min(N, K)/S, P99 = S·⌈N/K⌉)
and ``usl:σ:κ`` (QPS = N/(S·(1 + σ(N−1) + κN(N−1))), its truth where the marginal efficiency falls
to kneeswarm.search.EFFICIENCY_MIN).  Each probe's QPS is the closed form times (1 + noise·z), z a
standard normal drawn per probe from the seed's generator (a real 2-core host: 2–5 % QPS noise).

    python bench/search_sim.py [--seeds 200] [--first-seed 0] [--noise 0.03] [--cases knee:3,...] [--why 3]

``--early``: growth probes (and the start) end before max_hold once their figures say "scaling" with
kneeswarm.search.SCALING_MARGIN against every rule (SearchDriver.may_end, off in runs: EARLY_END); the sim models it on
bench/search.py's hold (min_hold 3, max_hold 18, settle 1, the rows 0-3 s behind) and the analysis's
100 rows: a probe's QPS from t seconds of rows has the noise of the full hold x √(FULL_S / t) (noise
∝ 1/√rows), the running mean a Brownian path ending at the full hold's draw, looked at once a second
from the earliest end (max(steady.MIN_SECONDS, 100 rows)); the first look that scaling_certain passes
ends it with that figure.  ``--margin M`` sets the margin.  Without ``--early`` every probe is held in full.

``--why N`` prints to stderr, for the first N searches of each case that miss, every probe with the
rule that chose it and the reason the search stopped.

Pure: no processes, no load; a few seconds a case.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kneeswarm.search import EARLY_RULES, EFFICIENCY_MIN, SCALING_MARGIN, Probe, Settings, decide, scaling_certain  # noqa: E402
from locustfiles.steady import MIN_SECONDS  # noqa: E402
from kneeswarm.target.engine import usl_efficiency_users  # noqa: E402

DEFAULT_CASES = "knee:3,knee:5,knee:6,knee:11,knee:24,usl:0.0:0.01,usl:0.02:0.002"
SERVICE_S = 0.2  # bench/search.py's 200 ms
PRECISION = 0.10
MAX_PROBES = 40  # a search that has not stopped by then is a bug (tests/test_search.py's bound)
# bench/search.py's hold: max_hold 18 s less the 1 s settle and the rows' mean 1.5 s delay: the seconds of
# rows a probe held in full is judged on; an early end needs the analysis's min_requests (100) rows
FULL_S, MIN_ROWS = 18.0 - 1.0 - 1.5, 100


def closed_form(case: str) -> tuple[Callable[[int], tuple[float, float]], float]:
    """(users -> (QPS, P99 ms) of the truth, the knee's true users)."""
    kind, *params = case.split(":")
    if kind == "knee":
        k = int(params[0])
        return (lambda n: (min(n, k) / SERVICE_S, SERVICE_S * 1000 * math.ceil(n / k))), float(k)
    sigma, kappa = float(params[0]), float(params[1])

    def usl(n: int) -> tuple[float, float]:
        stretch = 1 + sigma * (n - 1) + kappa * n * (n - 1)
        return n / (SERVICE_S * stretch), SERVICE_S * 1000 * stretch
    return usl, usl_efficiency_users(sigma, kappa, EFFICIENCY_MIN)


def early_figure(qps: float, z: float, noise: float, rng: np.random.Generator,
                 certain: Callable[[float, float], bool]) -> tuple[float, float] | None:
    """(QPS, seconds of rows) at the first look, once a second from the earliest end, where ``certain``
    (QPS, rows) holds, or None (held in full: the full hold's figure, qps x (1 + noise x z)).  The
    running mean of the rows: a Brownian path B (var t) through B(FULL_S) = √FULL_S·z, its error at t
    noise·√FULL_S·B(t)/t (noise at FULL_S, x √(FULL_S/t) before)."""
    t0 = max(float(MIN_SECONDS), MIN_ROWS / qps)
    if t0 >= FULL_S:
        return None
    times = np.arange(t0, FULL_S, 1.0)
    steps = np.diff(np.concatenate([[0.0], times, [FULL_S]]))
    w = np.cumsum(rng.standard_normal(len(steps)) * np.sqrt(steps))
    bridge = w[:-1] - times / FULL_S * w[-1]  # W(t) - (t/T) W(T): independent of the end point
    b = times / FULL_S * math.sqrt(FULL_S) * z + bridge
    for t, bt in zip(times, b):
        x = qps * (1 + noise * math.sqrt(FULL_S) * bt / t)
        if certain(x, qps * t):
            return x, float(t)
    return None


def one_search(truth: Callable[[int], tuple[float, float]], rng: np.random.Generator, noise: float,
               settings: Settings, whys: list[str] | None = None, margin: float | None = SCALING_MARGIN,
               paths: np.random.Generator | None = None) -> tuple[list[int], int | None, list[float]]:
    """(the users probed in order, the knee reported: the bracket's low end, the seconds of rows each
    probe was judged on); ``whys`` gets each probe's users and why, then the reason the search
    stopped.  ``margin`` None: every probe held in full; ``paths``: the early looks' draws (apart, so
    that the full holds' draws are the same as without them)."""
    probes: list[Probe] = []
    held: list[float] = []
    d = decide(probes, settings, 0.0)
    while d.users is not None and len(probes) < MAX_PROBES:
        qps, p99 = truth(d.users)
        z = rng.standard_normal()
        early = None
        if margin is not None and paths is not None and d.rule in EARLY_RULES:
            n = d.users
            early = early_figure(qps, z, noise, paths, lambda x, rows: scaling_certain(
                Probe(users=n, qps=x, p99_ms=p99, requests=int(rows)), probes, settings, margin) is not None)
        if whys is not None:
            whys.append(f"{d.users:4d}: {d.why}" + (f" [ended after {early[1]:.0f} s]" if early else ""))
        probes.append(Probe(users=d.users, qps=early[0] if early else qps * (1 + noise * z), p99_ms=p99, requests=1000))
        held.append(early[1] if early else FULL_S)
        d = decide(probes, settings, 10.0 * len(probes))
    if whys is not None:
        whys.append(f"stop: {d.stopped_because} (knee bracket {d.knee_bracket})")
    return [p.users for p in probes], (d.knee_bracket or [None])[0], held


def evaluate(case: str, seeds: int, noise: float, first_seed: int = 0, why: int = 0,
             margin: float | None = SCALING_MARGIN) -> dict:
    truth, k = closed_form(case)
    within, n_probes, load, errors, early, saved = 0, [], [], [], [], []
    for seed in range(first_seed, first_seed + seeds):
        whys: list[str] = []
        users, knee, held = one_search(truth, np.random.default_rng(seed), noise, Settings(start=1, max=512), whys,
                                       margin, np.random.default_rng(10**6 + seed))
        hit = knee is not None and abs(knee - k) <= max(1, PRECISION * k)
        if knee is not None:
            errors.append(abs(knee - k) / k)
        early.append(sum(h < FULL_S for h in held))
        saved.append(sum(FULL_S - h for h in held))
        if not hit and why > 0:
            why -= 1
            print(f"{case} seed {seed} (truth {k:.2f}) missed:\n  " + "\n  ".join(whys), file=sys.stderr)
        within += hit
        n_probes.append(len(users))
        load.append(sum(users))
    return {"case": case, "truth": k, "within": within, "seeds": seeds, "probes": float(np.mean(n_probes)),
            "user_probes": float(np.mean(load)), "error": 100 * float(np.mean(errors)) if errors else math.nan,
            "early": float(np.mean(early)), "saved_s": float(np.mean(saved))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--why", type=int, default=0, help="print the decisions of this many missed searches a case")
    ap.add_argument("--early", action="store_true", help="growth probes end once their scaling is certain")
    ap.add_argument("--margin", type=float, default=SCALING_MARGIN, help="scaling_certain's margin (with --early)")
    args = ap.parse_args()
    margin = args.margin if args.early else None
    print("| case | truth | within max(1, 10 %) | mean error % | mean probes | mean users summed over probes "
          "| probes ended early | s of rows saved |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        r = evaluate(case, args.seeds, args.noise, args.first_seed, args.why, margin)
        print(f"| {r['case']} | {r['truth']:.1f} | {r['within']}/{r['seeds']} | {r['error']:.2f} | {r['probes']:.2f} | "
              f"{r['user_probes']:.1f} | {r['early']:.2f} | {r['saved_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
