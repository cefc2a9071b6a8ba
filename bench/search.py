"""Search against the doubling grid (at no more load time), real processes: `kneeswarm run` against the demo
target's ground truths, each case twice side by side -- ``[load] mode = "search"`` from 1 to 64
users, and the fixed doubling grid 1, 2, 4 … 64 -- with the same hold rule (``hold = "auto"``).

Per case it prints the truth, the search's knee bracket and its error, the grid's knee (analysis
``find_knee`` over all its steps' QPS; a grid can only name one of its steps) and its error, the load
seconds of each, the load seconds of two linear grids fine enough to give the search's precision
(steps max(1, ⌊precision x the truth⌋) apart), and the rule that judged each probe
(``rules_by_probe``: scaling, or the saturation rule that named it the first saturated one):

- "linear 1..max" (the search should take half its load time at most) weighs it against fixed grids over the
  plan's range, as the doubling grid 1..64 runs in full: a linear grid of that precision over the
  same range 1..max is ⌈max / width⌉ steps, each at the doubling grid's mean step duration (a fixed
  grid over the same range under the same hold rule, measured beside the search).
- "linear 1..2x truth": an oracle that knows the knee lies below twice the truth and spends no step
  above it, ⌈2 x truth / width⌉ steps at the search's mean probe duration (its steps all lie near the
  knee, as refinement probes do).  No user has it; it is kept for honesty: for knees of 3-6 users
  (6-12 steps) the growth probes alone (1, 2, 4 and 8) are a third to a half of it.

Truths: ``--mode knee --slots K`` saturates at K users; ``--mode usl`` at the N where its marginal
efficiency 1 − N·d′/d (d = 1 + σ(N−1) + κN(N−1)) falls to kneeswarm.launch.search.EFFICIENCY_MIN.

    nice python bench/search.py [--service-ms 200] [--cases knee:3,knee:5,usl:0.0:0.01]

Each case's probes' QPS per user (the summary's, by probe), each probe's and grid step's seconds of
load (ramp to end), and each probe's why and the reason the search stopped go to stderr, to see which rule chose or judged a probe near the knee.

It runs for long (about 3 minutes a case on 2 cores); ``nice`` it on a shared host.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneeswarm.launch.cli import start_target, stop_target  # noqa: E402
from kneeswarm.analysis.models.knee import find_knee  # noqa: E402
from kneeswarm.launch.search import EFFICIENCY_MIN, Probe, Settings, knee_bracket  # noqa: E402
from kneeswarm.target.engine import usl_efficiency_users  # noqa: E402

DEFAULT_CASES = "knee:3,knee:5,knee:6,knee:11,knee:24,usl:0.0:0.01,usl:0.02:0.002"
HOLD = 'hold = "auto"\nmin_hold = 3\nmax_hold = 18\nsettle = 1\nramp = 0.5\nworkers = 1\n'
MAX = 64  # the plan's range: the search's max, the doubling grid's top step
GRID = [1, 2, 4, 8, 16, 32, 64]
PRECISION = 0.10


def target_args(case: str, service_ms: float) -> tuple[list[str], float]:
    kind, *params = case.split(":")
    if kind == "knee":
        return ["--mode", "knee", "--slots", params[0], "--service-ms", str(service_ms)], float(params[0])
    sigma, kappa = float(params[0]), float(params[1])
    return (["--mode", "usl", "--sigma", str(sigma), "--kappa", str(kappa), "--service-ms", str(service_ms)],
            usl_efficiency_users(sigma, kappa, EFFICIENCY_MIN))


def run_both(case: str, service_ms: float, work: Path) -> dict:
    """The search and the grid on two targets of the same settings, side by side."""
    args, truth = target_args(case, service_ms)
    targets = [start_target(args), start_target(args)]
    plans = {"search": f'[load]\nmode = "search"\nstart = 1\nmax = {MAX}\n' + HOLD,
             "grid": f'[load]\nsteps = {GRID}\n' + HOLD}
    procs = {}
    try:
        for (name, text), (_, url) in zip(plans.items(), targets):
            (work / f"{name}.toml").write_text(text)
            procs[name] = subprocess.Popen([sys.executable, "-m", "kneeswarm.launch.cli", "run", str(work / f"{name}.toml"),
                                            "--target", url, "--out", str(work / name), "-q"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for p in procs.values():
            p.wait(timeout=900)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for proc, _ in targets:
            stop_target(proc)
    out = {"case": case, "truth": truth}
    for name in plans:
        run = next((work / name).iterdir())
        out[name] = json.loads((run / "report" / "summary.json").read_text())
    out["rules"] = rules_by_probe(json.loads((next((work / "search").iterdir()) / "generator" / "search.json").read_text()))
    return out


# the rule named by the start of kneeswarm.launch.search's verdict (saturated's, past_bound_knee's, on_plateau's words)
RULE_WORDS = (("errors", "errors"), ("429/503", "pushback"), ("achieved", "achieved < offered"), ("P99", "P99"),
              ("QPS per user", "per-user"), ("scaling efficiency", "efficiency"), ("past the bounds", "bound"),
              ("on the plateau", "plateau"))


def rules_by_probe(doc: dict) -> list[str]:
    """Which rule judged each probe, as it was judged (generator/search.json: each probe's measured
    figures, the settings): kneeswarm.launch.search.knee_bracket over the probes up to it -- the decision's
    own rules, so a rule changed there is the rule printed here.  "scaling" when it is at or below
    the bracket's low end, the rule's short name when it is the first saturated probe, "above" when
    it lies past a saturated one."""
    s, probes, out = Settings(**doc["settings"]), [], []
    for rec in doc["probes"]:
        m = rec.get("measured")
        if m is None:  # the probe the search chose but the run did not measure
            break
        probes.append(Probe(users=rec["users"], qps=m["qps"], p99_ms=m["p99_ms"], error_rate=m["error_rate"],
                            pushback=m["pushback"], valid=m["requests"] > 0 and rec.get("steady", True),
                            requests=m["requests"]))
        lo, hi, why = knee_bracket(probes, s)
        users = rec["users"]
        if hi is not None and users == hi.users:
            out.append(f"{users}: {next((n for w, n in RULE_WORDS if (why or '').startswith(w)), why)}")
        else:
            out.append(f"{users}: {'above' if hi is not None and users > hi.users else 'scaling'}")
    return out


def figures(r: dict) -> dict:
    truth, search, grid = r["truth"], r["search"]["search"], r["grid"]
    lo, hi = (search.get("knee_bracket") or [None, None])[:2]
    knee = lo  # the last scaling probe
    probes = search["probes"]
    mean_s = sum(p["duration_s"] for p in probes) / len(probes)
    grid_durations = [s["t_end"] - s["t_ramp"] for s in grid["steps"] if s.get("t_end") is not None]
    grid_s = sum(grid_durations)
    width = max(1, math.floor(PRECISION * truth))
    linear_max_s = math.ceil(MAX / width) * grid_s / len(grid_durations)  # "linear 1..max" (docstring)
    linear_s = math.ceil(2 * truth / width) * mean_s  # the oracle's
    # the grid's knee by kneeswarm.analysis.models.knee's rule on all its steps (a short max_hold leaves many steps
    # not valid for their P99, which would leave the summary's knee empty: their QPS is what counts here)
    steps = [s for s in grid["steps"] if s.get("qps") is not None]
    grid_knee = find_knee([s["users"] for s in steps], [s["qps"] for s in steps])["users"]
    err = lambda k: None if k is None else abs(k - truth) / truth  # noqa: E731
    return {"case": r["case"], "truth": truth, "bracket": search.get("knee_bracket"), "search_err": err(knee),
            "within": knee is not None and abs(knee - truth) <= max(1, PRECISION * truth),
            "grid_knee": grid_knee, "grid_err": err(grid_knee), "probes": [p["users"] for p in probes],
            "search_s": search["load_s"], "grid_s": grid_s, "linear_max_s": linear_max_s, "linear_s": linear_s,
            "n_star": (r["search"].get("usl") or {}).get("n_star"),
            "per_user": {p["users"]: p["qps"] / p["users"] for p in probes if p.get("qps") is not None},
            "durations": [f"{p['users']}: {p['duration_s']:.1f}" for p in probes],
            "grid_durations": [f"{s['users']}: {s['t_end'] - s['t_ramp']:.1f}" for s in grid["steps"]
                               if s.get("t_end") is not None],
            "whys": [f"{p['users']}: {p.get('why')}" for p in probes], "stopped_because": search.get("stopped_because"),
            "rules": r["rules"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--service-ms", type=float, default=200.0)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    args = ap.parse_args()
    print("| case | truth | search probes | knee bracket | error | within max(1,10 %) | grid knee | grid error "
          "| search s | grid s | linear 1..max s | search / linear 1..max | linear 1..2x truth s "
          "| search / linear 1..2x truth | rule by probe |", flush=True)
    print("|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory(prefix="kneeswarm-bench-search-") as tmp:
            f = figures(run_both(case, args.service_ms, Path(tmp)))
        pct = lambda x: "–" if x is None else f"{x:.0%}"  # noqa: E731
        print(f"| {f['case']} | {f['truth']:.1f} | {f['probes']} | {f['bracket']} | {pct(f['search_err'])} | "
              f"{'yes' if f['within'] else 'NO'} | {f['grid_knee']} | {pct(f['grid_err'])} | {f['search_s']:.0f} | "
              f"{f['grid_s']:.0f} | {f['linear_max_s']:.0f} | {f['search_s'] / f['linear_max_s']:.2f} | "
              f"{f['linear_s']:.0f} | {f['search_s'] / f['linear_s']:.2f} | "
              f"{', '.join(f['rules'])} |", flush=True)
        print(f"  {f['case']} QPS per user by probe: " + ", ".join(f"{u}: {q:.2f}" for u, q in f["per_user"].items()),
              file=sys.stderr, flush=True)
        print(f"  {f['case']} seconds by probe: " + ", ".join(f["durations"]) + "; grid steps: "
              + ", ".join(f["grid_durations"]), file=sys.stderr, flush=True)
        print(f"  {f['case']} decisions:\n    " + "\n    ".join(f["whys"]) + f"\n    stop: {f['stopped_because']}",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
