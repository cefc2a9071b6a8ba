"""The search's decisions (issue 18) on closed forms with QPS noise, many seeds: how often the knee
it reports (the last scaling probe) is within max(1 user, 10 %) of the truth, and what it costs.

The cases are bench/search.py's: ``knee:K`` (K slots of service S: QPS = min(N, K)/S, P99 = S·⌈N/K⌉)
and ``usl:σ:κ`` (QPS = N/(S·(1 + σ(N−1) + κN(N−1))), its truth where the marginal efficiency falls
to kneeswarm.search.EFFICIENCY_MIN).  Each probe's QPS is the closed form times (1 + noise·z), z a
standard normal drawn per probe from the seed's generator (a real 2-core host: 2–5 % QPS noise).

    python bench/search_sim.py [--seeds 200] [--first-seed 0] [--noise 0.03] [--cases knee:3,...] [--why 3]

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

from kneeswarm.search import EFFICIENCY_MIN, Probe, Settings, decide  # noqa: E402
from kneeswarm.target.engine import usl_efficiency_users  # noqa: E402

DEFAULT_CASES = "knee:3,knee:5,knee:6,knee:11,knee:24,usl:0.0:0.01,usl:0.02:0.002"
SERVICE_S = 0.2  # bench/search.py's 200 ms
PRECISION = 0.10
MAX_PROBES = 40  # a search that has not stopped by then is a bug (tests/test_search.py's bound)


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


def one_search(truth: Callable[[int], tuple[float, float]], rng: np.random.Generator, noise: float,
               settings: Settings, whys: list[str] | None = None) -> tuple[list[int], int | None]:
    """(the users probed in order, the knee reported: the bracket's low end); ``whys`` gets each
    probe's users and why, then the reason the search stopped."""
    probes: list[Probe] = []
    d = decide(probes, settings, 0.0)
    while d.users is not None and len(probes) < MAX_PROBES:
        if whys is not None:
            whys.append(f"{d.users:4d}: {d.why}")
        qps, p99 = truth(d.users)
        probes.append(Probe(users=d.users, qps=qps * (1 + noise * rng.standard_normal()), p99_ms=p99, requests=1000))
        d = decide(probes, settings, 10.0 * len(probes))
    if whys is not None:
        whys.append(f"stop: {d.stopped_because} (knee bracket {d.knee_bracket})")
    return [p.users for p in probes], (d.knee_bracket or [None])[0]


def evaluate(case: str, seeds: int, noise: float, first_seed: int = 0, why: int = 0) -> dict:
    truth, k = closed_form(case)
    within, n_probes, load = 0, [], []
    for seed in range(first_seed, first_seed + seeds):
        whys: list[str] = []
        users, knee = one_search(truth, np.random.default_rng(seed), noise, Settings(start=1, max=512), whys)
        hit = knee is not None and abs(knee - k) <= max(1, PRECISION * k)
        if not hit and why > 0:
            why -= 1
            print(f"{case} seed {seed} (truth {k:.2f}) missed:\n  " + "\n  ".join(whys), file=sys.stderr)
        within += hit
        n_probes.append(len(users))
        load.append(sum(users))
    return {"case": case, "truth": k, "within": within, "seeds": seeds, "probes": float(np.mean(n_probes)),
            "user_probes": float(np.mean(load))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--why", type=int, default=0, help="print the decisions of this many missed searches a case")
    args = ap.parse_args()
    print("| case | truth | within max(1, 10 %) | mean probes | mean users summed over probes |")
    print("|---|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        r = evaluate(case, args.seeds, args.noise, args.first_seed, args.why)
        print(f"| {r['case']} | {r['truth']:.1f} | {r['within']}/{r['seeds']} | {r['probes']:.2f} | "
              f"{r['user_probes']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
