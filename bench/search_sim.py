"""The knee search's decisions on closed forms with QPS noise, many seeds: how often the knee
it reports (the last scaling probe) is within max(1 user, 10 %) of the truth, and what it costs.

The cases are bench/search.py's: ``knee:K`` (K slots of service S: QPS = min(N, K)/S, P99 = S·⌈N/K⌉)
and ``usl:σ:κ`` (QPS = N/(S·(1 + σ(N−1) + κN(N−1))), its truth where the marginal efficiency falls
to kneeswarm.launch.search.EFFICIENCY_MIN).  Each probe's QPS is the closed form times (1 + noise·z), z a
standard normal drawn per probe from the seed's generator (a real 2-core host: 2–5 % QPS noise).

    python bench/search_sim.py [--seeds 200] [--first-seed 0] [--noise 0.03 | --sys S --samp S] [--early [--gate 0.02]] [--cases knee:3,...] [--why 3]

``--early``: growth probes (and the start) end before max_hold once their figures say "scaling" with
kneeswarm.launch.search.SCALING_MARGIN against every rule (SearchDriver.may_end, EARLY_END); the sim models it on
bench/search.py's hold (min_hold 3, max_hold 18, settle 1, the rows 0-3 s behind) and the analysis's
100 rows.  A probe's QPS from t seconds of rows is off by σ(t)² = sys² + samp²·(FULL_S / t): ``--sys``
the host's drift over a probe (the same for its whole hold: more rows do not average it out), ``--samp``
the sampling noise of a full hold (∝ 1/√rows); ``--noise`` is the full hold's total √(sys² + samp²)
(alone: sys 0, samp = noise, the model before the split).  The sampling part's running mean is a
Brownian path ending at the full hold's draw, looked at once a second from the earliest end
(max(steady.MIN_SECONDS, 100 rows)); a look counts only once its QPS half-width is within ``--gate``
(kneeswarm.launch.search.EARLY_QPS_CI; ``--gate inf``: no gate) as the real gate reckons it,
steady.closed_loop_qps_half_width: users/(rows − users) for the count's ends (the demo's service time
has no noise of its own to add; the gate sees neither the drift nor this model's sampling noise,
which at samp 0.01 is above the real runs' at 6-15 s: bench/qps_noise.py), and the first look that
scaling_certain passes ends the probe with that figure.  ``--margin M`` sets the margin.  Without ``--early`` every probe is held in full.

``--why N`` prints to stderr, for the first N searches of each case that miss, every probe with the
rule that chose it and the reason the search stopped.

Pure: no processes, no load; a few seconds a case.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kneeswarm.launch.search import (EARLY_QPS_CI, EARLY_RULES, EFFICIENCY_MIN, SCALING_MARGIN, Probe, Settings, decide, scaling_certain)  # noqa: E402
from kneeswarm.locustfiles.steady import MIN_SECONDS  # noqa: E402
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


@dataclass(frozen=True)
class Noise:
    """A probe's QPS error: ``sys`` the host's drift over the probe (fixed for its hold), ``samp`` the
    sampling noise of a full hold (∝ 1/√rows); σ(t)² = sys² + samp²·(FULL_S / t)."""
    sys: float
    samp: float

    @property
    def full(self) -> float:  # a full hold's total
        return math.hypot(self.sys, self.samp)


def early_figure(qps: float, z: float, noise: Noise, rng: np.random.Generator,
                 certain: Callable[[float, float], bool], gate: float, users: int) -> tuple[float, float] | None:
    """(QPS, seconds of rows) at the first look, once a second from the earliest end, whose sampling
    half-width users/(qps·t − users) is within ``gate`` and where ``certain`` (QPS, rows) holds, or None
    (held in full: the full hold's figure, qps x (1 + noise.full x z)).  z splits into the drift's and
    the sampling's standard normals (a rotation by a second draw w: given z, both are still standard
    normals, independent); the sampling part's running mean is a Brownian path B (var t) through
    B(FULL_S) = √FULL_S·z_samp, its error at t samp·√FULL_S·B(t)/t (samp at FULL_S, x √(FULL_S/t) before)."""
    t0 = max(float(MIN_SECONDS), MIN_ROWS / qps)
    if t0 >= FULL_S:
        return None
    z_sys, z_samp = 0.0, z
    if noise.sys > 0:  # (no draw without drift: the paths are the model's before the split)
        w, c, s = rng.standard_normal(), noise.sys / noise.full, noise.samp / noise.full
        z_sys, z_samp = c * z + s * w, s * z - c * w
    times = np.arange(t0, FULL_S, 1.0)  # the looks: the same draws whatever the gate
    steps = np.diff(np.concatenate([[0.0], times, [FULL_S]]))
    w_path = np.cumsum(rng.standard_normal(len(steps)) * np.sqrt(steps))
    bridge = w_path[:-1] - times / FULL_S * w_path[-1]  # W(t) - (t/T) W(T): independent of the end point
    b = times / FULL_S * math.sqrt(FULL_S) * z_samp + bridge
    for t, bt in zip(times, b):
        if users / max(qps * t - users, 1e-9) > gate:
            continue
        x = qps * (1 + noise.sys * z_sys + noise.samp * math.sqrt(FULL_S) * bt / t)
        if certain(x, qps * t):
            return x, float(t)
    return None


def one_search(truth: Callable[[int], tuple[float, float]], rng: np.random.Generator, noise: Noise,
               settings: Settings, whys: list[str] | None = None, margin: float | None = SCALING_MARGIN,
               paths: np.random.Generator | None = None, gate: float = EARLY_QPS_CI
               ) -> tuple[list[int], int | None, list[float]]:
    """(the users probed in order, the knee reported: the bracket's low end, the seconds of rows each
    probe was judged on); ``whys`` gets each probe's users and why, then the reason the search
    stopped.  ``margin`` None: every probe held in full; ``paths``: the early looks' draws (apart, so
    that the full holds' draws are the same as without them); ``gate``: early_figure's."""
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
                Probe(users=n, qps=x, p99_ms=p99, requests=int(rows)), probes, settings, margin) is not None, gate, n)
        if whys is not None:
            whys.append(f"{d.users:4d}: {d.why}" + (f" [ended after {early[1]:.0f} s]" if early else ""))
        probes.append(Probe(users=d.users, qps=early[0] if early else qps * (1 + noise.full * z), p99_ms=p99,
                            requests=1000))
        held.append(early[1] if early else FULL_S)
        d = decide(probes, settings, 10.0 * len(probes))
    if whys is not None:
        whys.append(f"stop: {d.stopped_because} (knee bracket {d.knee_bracket})")
    return [p.users for p in probes], (d.knee_bracket or [None])[0], held


def evaluate(case: str, seeds: int, noise: Noise, first_seed: int = 0, why: int = 0,
             margin: float | None = SCALING_MARGIN, gate: float = EARLY_QPS_CI) -> dict:
    truth, k = closed_form(case)
    within, n_probes, load, errors, early, saved = 0, [], [], [], [], []
    for seed in range(first_seed, first_seed + seeds):
        whys: list[str] = []
        users, knee, held = one_search(truth, np.random.default_rng(seed), noise, Settings(start=1, max=512), whys,
                                       margin, np.random.default_rng(10**6 + seed), gate)
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


def noise_of(noise: float | None, sys_: float | None, samp: float | None) -> Noise | str:
    """The model from the flags, or what is wrong with them (one line)."""
    if any(v is not None and not (math.isfinite(v) and v >= 0) for v in (noise, sys_, samp)):
        return "--noise, --sys and --samp must be finite and >= 0"
    s = sys_ or 0.0
    if samp is None:
        total = 0.03 if noise is None else noise
        if s > total:
            return f"--sys {s:g} is more than the full hold's total --noise {total:g}"
        return Noise(s, math.sqrt(total * total - s * s))
    if noise is not None and not math.isclose(noise, math.hypot(s, samp), rel_tol=1e-6):
        return f"--noise {noise:g} is not √(sys² + samp²) = {math.hypot(s, samp):g}: give --noise or --sys/--samp"
    return Noise(s, samp)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--noise", type=float, default=None, help="a full hold's QPS noise, in all (default 0.03)")
    ap.add_argument("--sys", type=float, default=None, help="the drift over a probe, fixed for its hold (default 0)")
    ap.add_argument("--samp", type=float, default=None, help="a full hold's sampling noise (default √(noise² - sys²))")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--why", type=int, default=0, help="print the decisions of this many missed searches a case")
    ap.add_argument("--early", action="store_true", help="growth probes end once their scaling is certain")
    ap.add_argument("--margin", type=float, default=SCALING_MARGIN, help="scaling_certain's margin (with --early)")
    ap.add_argument("--gate", type=float, default=EARLY_QPS_CI,
                    help="the early end's bound on the QPS sampling half-width (with --early; inf: none)")
    args = ap.parse_args()
    noise = noise_of(args.noise, args.sys, args.samp)
    if isinstance(noise, str) or args.seeds < 1 or not args.gate > 0:
        print(f"search_sim: {noise if isinstance(noise, str) else '--seeds must be >= 1 and --gate > 0'}",
              file=sys.stderr)
        return 2
    margin = args.margin if args.early else None
    print(f"sys {noise.sys:g}, samp {noise.samp:g} (full hold {noise.full:.4f}), "
          + (f"early (margin {args.margin:g}, gate {args.gate:g})" if args.early else "off"))
    print("| case | truth | within max(1, 10 %) | mean error % | mean probes | mean users summed over probes "
          "| probes ended early | s of rows saved |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        try:
            r = evaluate(case, args.seeds, noise, args.first_seed, args.why, margin, args.gate)
        except (ValueError, IndexError) as e:
            print(f"search_sim: bad case {case!r} ({e})", file=sys.stderr)
            return 2
        print(f"| {r['case']} | {r['truth']:.1f} | {r['within']}/{r['seeds']} | {r['error']:.2f} | {r['probes']:.2f} | "
              f"{r['user_probes']:.1f} | {r['early']:.2f} | {r['saved_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
