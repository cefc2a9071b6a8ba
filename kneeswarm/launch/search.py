"""``[load] mode = "search"`` (not a guessed grid): the next probe is chosen from the probes so far.

``decide`` is pure: the probes measured so far (each an ordinary step: users, QPS, P99, errors)
in, the next probe and why out, or the reason to stop.  The rules, in order:

1. **Growth**: from ``start``, multiply the highest probe by ``growth`` until the first
   saturated probe (``saturated``): scaling efficiency from the last scaling probe below
   ``EFFICIENCY_MIN``, P99 above ``P99_RISE`` x the best P99 so far and rising (closed loop), errors above
   ``[sla] error_rate`` (``ERROR_RATE`` without one), 429/503 pushback above ``PUSHBACK_SHARE``,
   or (open loop) achieved rate below ``ACHIEVED_MIN`` x the offered one (the successes
   completed in the probe's window against the arrivals in it: steady.ProbeMeter).  Nothing goes above
   the first saturated probe except, with an ``[sla]`` still met there, one more growth step.
2. **Refinement**: the knee lies between the last scaling probe (lo) and the first saturated one
   (hi); probe inside until hi - lo <= max(1, precision x lo).  When the probes fit a sharp knee's
   asymptotic bounds (``bound_knee``), the next probe is where they cross, and a scaling probe past
   that crossing is moved above the bracket (``past_bound_knee``).  Else, with ``MIN_FIT_PROBES`` valid
   probes or more, the next probe is aimed by the USL fit (analysis/models/usl.py): where its efficiency
   from lo crosses ``EFFICIENCY_MIN``, else its N*, when either lies strictly inside the bracket
   and R² >= ``R2_AIM``; otherwise bisection.  A smooth curve (``smooth_knee``: the USL fit explains
   the probes with R² >= ``R2_KNEE`` and no worse than a sharp knee's bounds) is not left to the
   rules between adjacent probes, whose gain over one user is mostly QPS noise: its knee is where
   the fit's marginal efficiency crosses ``EFFICIENCY_MIN`` (the ground truth's definition), the
   bracket's low end the whole user nearest it, and both ends are probed to confirm it (the fit is
   redone with them).  A bracket of the rules is closed without another probe when its last scaling
   probe already serves the plateau (``plateau_close``: operational bounds put the knee at most at
   n x X_max / X(n), within the precision of n); its high end is then that bound, not a probe.
3. **SLA boundary** (with an ``[sla]``): the most users whose probe meets every limit, bracketed
   the same way.
4. **Stop** when both are bracketed, at ``max`` still scaling, or past ``max_duration`` of load.

The master drives it through ``SearchDriver`` (a callable the step schedule asks when a probe
ends); the probes' figures come from the rows the master receives (kneeswarm.locustfiles.steady.ProbeMeter),
not from Locust's rounded statistics.  generator/search.json records each decision.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from kneeswarm.analysis.models.usl import efficiency_users, fit_usl, usl_throughput
from kneeswarm.contracts.plan import Plan
from kneeswarm.contracts.rundir import SCALING_CERTAIN, SEARCH_FILE, RunDir, write_json
from kneeswarm.locustfiles.steps import WAIT

logger = logging.getLogger(__name__)

# QPS gain below this share of the ideal linear gain from the last scaling probe: saturated.  Above
# 0.5 so that a sharp knee half-way through a growth step (24 users between 16 and 32: gain 0.5)
# counts; a sharp knee in the top 40 % of a growth step (27 between 16 and 32: gain 0.69) is missed
# there and found at the next step up (the bracket's low end is then the probe past it).
EFFICIENCY_MIN = 0.6
# QPS per user below this share of the last scaling probe's: saturated.  The gain alone, over a wide
# bracket, passes a probe beyond a sharp knee (28 users from 16 at a knee of 24: gain 0.67, but
# each user gets 86 % of what it got at 16); a probe within 12 % past a sharp knee still passes.
PER_USER_MIN = 0.88
# a scaling probe whose next one up gains less than PLATEAU_GAIN of the linear gain, and whose own QPS
# per user is below PLATEAU_PER_USER x that of the probe before it, is on the plateau past a sharp knee
PLATEAU_GAIN, PLATEAU_PER_USER = 0.3, 0.92
# A sharp knee's probes lie on the asymptotic bounds min(N x the linear QPS per user, the plateau's
# QPS) within BOUND_TOL (bound_knee): ~2.5 sd of a probe's ratio to them under 3 % QPS noise; a USL
# curve bends further below them near its knee (4 users of σ = 0, κ = 0.01: 11 %).  Measured with
# bench/search_sim.py (200 seeds): 0.08 fits a sharp knee too rarely under 5 % noise (K = 24: 151 of
# 200 within 10 % against 166 at 0.10); 0.12 lets the USL curves fit (σ = 0, κ = 0.01, 3 % noise:
# 109 of 200 within 10 % against 118).
BOUND_TOL = 0.10
# a scaling probe more than this above the bounds' crossing is past the knee: the crossing, an average
# of several probes, is known to ~2 % under 3 % noise, and a probe within 5 % of the knee is within the
# 10 % asked of the search either way
PAST_MARGIN = 0.05
# ... when the plateau, from the first saturated probe up, has at least this many probes: one probe's
# QPS is too little to call flat (with one, USL σ = 0.02, κ = 0.002 had 15 of 200 searches moved by it)
PLATEAU_PROBES = 2
P99_RISE = 3.0  # P99 above this x the best probe's P99 (and above the last scaling probe's): saturated
ERROR_RATE = 0.01  # failed share above this (without [sla] error_rate): saturated
PUSHBACK_SHARE = 0.01  # share of 429/503 answers above this: the server pushes back, saturated
ACHIEVED_MIN = 0.95  # open loop: achieved rate below this x the offered rate: saturated ...
ARRIVAL_Z = 3.0  # ... when the shortfall is beyond this many standard deviations of Poisson arrivals
MIN_FIT_PROBES = 4  # valid probes needed before the USL fit aims the next probe
R2_AIM = 0.95  # below this R² the fit does not aim: bisection
# A smooth curve's knee is placed by the USL fit (smooth_knee), not by the rules between adjacent
# probes: over a bracket of 1 user at 4-10 users the gain statistic's noise is ~lo x √2 x the QPS
# noise (0.18 at 4 users under 3 %, against a margin of 0.07 at the USL target's knee), so a probe
# below the knee fails as often as not.  The fit, over all the probes, knows the crossing to ~0.3 user.
# R2_KNEE: the fit must explain this much of the probes' QPS (a USL fit of 3 % noise: >= 0.99)
R2_KNEE = 0.98
# ... and its squared log residuals must sum to at most this share of those of a sharp knee's bounds
# (min(N x rate, plateau), the best split): the better model of the two wins.  A sharp knee fits its
# bounds within the noise and bends 12-16 % away from any USL curve at its corner, so it keeps the
# rules (and bound_knee) that place it.  bench/search_sim.py, 200 seeds: 0.5 / 1.0 / 2.0 leave every
# sharp case within 4 of the old counts (3 % noise: the same); the USL cases at 5 % noise 123 / 135 /
# 138 and 90 / 115 / 126 of 200; above 1.0 a noisy sharp knee is placed by a model it fits worse
SMOOTH_RSS_RATIO = 1.0
# the fit places a knee only once a probe lies this far past its crossing (else one growth step
# first): below it the fit's κ is an extrapolation (USL σ = 0.02, κ = 0.002 from 1, 2, 4, 8 and its
# confirming probes: the crossing's sd 2.2 users under 3 % noise)
FIT_SPAN = 1.5
# plateau_close: the last scaling probe closes the bracket without another probe only when it serves at
# least this share of the plateau's QPS.  The knee read from the bracket is its low end, up to (1 - this)
# below the bounds' upper end: 5 %, half the 10 % precision, and within a real host's QPS noise (2-5 %) of
# the plateau.  bench/search_sim.py, 200 seeds at 3 %: a bare precision test (no share) reads K = 3 and 5
# one user low in 58 and 81 searches (mean error 1.5 -> 10 % and 2.1 -> 9 %: 2 users serve 2/3 of 3's
# plateau, and [2, 3] is within max(1 user, 10 %)); 0.95 leaves every sharp case's mean error within
# 0.5 point of the old rules' and saves 0.7-1.2 probes; 1.0 saves 0.4-0.6
CLOSE_SHARE = 0.95
MIN_PROBE_REQUESTS = 50  # a probe is not judged on fewer rows: held until they are in (rows trail the horizon)
MAX_WAIT_S = 30.0  # ... but not longer than this past the end of its hold (then judged on what there is)
# A growth probe may end before its P99 is known once its figures say "scaling" with this margin against
# each saturation rule (scaling_certain): QPS per user >= PER_USER_MIN + it, efficiency >= EFFICIENCY_MIN +
# it.  0.05 keeps USL σ = 0, κ = 0.01's 4-user probe (91 % of 2's QPS per user) held in full.
SCALING_MARGIN = 0.05
# On, gated on EARLY_QPS_CI below.  Ungated it cost: the verdict is certain, the figure is not; the probe's QPS
# is data for every later rule (the bounds' linear rate, plateau_close, the USL fit), and from a third of the
# rows it is ~2x noisier.  bench/search_sim.py --early (200 seeds, 3 % QPS noise at a full hold, noise ∝ 1/√rows),
# within max(1, 10 %) of 200, off -> ungated: K=6 197 -> 188, K=11 197 -> 183, K=24 197 -> 186, USL 0.02/0.002
# 182 -> 173.  One real bench/search.py run each, ungated (quiet 2-core host): knee:24 [25, 26] in 72 s against
# the grid's 99, USL 0.02/0.002 [10, 11] in 114 s against 127.  Off, may_end answers None.
EARLY_END = True
# ... and only once the probe's QPS is measured within this relative 95 % half-width (steady.Verdict's
# qps_half_width, closed_loop_qps_half_width: the users' requests straddling the window's ends, in step at
# worst, users/(rows − users), and the mean latency's own noise), not merely "known within ci" (10 %): the later
# rules need it as precise as a full hold gives it.  0.025 takes 41 cycles of each user (8.2 s at 200 ms).
# (Until 2026-12 the half-width was Student's t on the per-second counts: a cohort of users in step made
# those claim ±0.0 % at 200 ms, so knee:11's probes ended at the first look, and ±4 % at 217 ms, so no
# probe of USL 0.02/0.002 ever ended early; bench/qps_noise.py's real windows fell inside it 26-100 % of the
# time, inside the new one 100 %.)  Measured there (real demo targets, 60 s steps, two runs): within a step
# σ is 1.1-1.8 % at 6 s and 0.1-0.7 % at 15.5 s, run to run the full step's QPS moves <= 0.3 %: (sys, samp) ~
# (0.005, 0.01).  bench/search_sim.py --early (its gate users/(rows − users)), 200 seeds x 7 cases, within
# max(1, 10 %) against off: 0.02, 0.025 and 0.03 all keep 200 of 200 under (0.005, 0.01) and lose at most 2
# under a drift-heavy (0.03, 0.008), which no gate sees; 0.025 saves 5.5 (knee:3) - 25 s (knee:24) of rows
# a search (0.02: 4.5-18, 0.03: 5.5-31).  The gate sees the noise within a probe only; the host's drift
# is the sim's sys.
EARLY_QPS_CI = 0.025
# ... and its P99 at most this share of the P99_RISE limit (P99 from so few rows is rough, so "well below")
P99_CERTAIN_SHARE = 0.5
# ... and, with an [sla] p99_ms, at most this share of it (the SLA bracket reads every probe's P99)
SLA_CERTAIN_SHARE = 0.5
EARLY_RULES = ("start", "growth")  # the rules whose probes may end so (never refinement, confirmation, SLA)


@dataclass
class Probe:
    """One probe as measured (a step of the run)."""

    users: int  # users (open loop: arrival sources of source_rate req/s each)
    qps: float  # successful requests/s over its steady window
    p99_ms: float | None
    error_rate: float = 0.0  # failed share of its requests
    pushback: float = 0.0  # share of 429/503 answers
    valid: bool = True  # steady and known (hold = "auto"), with requests
    offered: float | None = None  # open loop: requests/s offered (qps: the successes completed)
    requests: int = 0
    window_s: float = 0.0  # open loop: the window the completions were counted over


@dataclass
class Settings:
    start: int
    max: int
    growth: float = 2.0
    precision: float = 0.10
    max_duration: float = 1800.0
    sla_p99_ms: float | None = None
    sla_error_rate: float | None = None
    unit: float = 1.0  # open loop: req/s per user (source_rate), for the words
    open_loop: bool = False  # users are arrival sources: brackets are said in req/s (users x unit)

    def span(self, lo: int | None, hi: int | str | None) -> str:
        """A bracket in the user's terms: [lo, hi] users, or in open loop [lo, hi] req/s."""
        if not self.open_loop:
            return f"[{lo}, {hi}]"
        rate = lambda n: f"{n * self.unit:g}" if isinstance(n, int) else str(n)  # noqa: E731
        return f"[{rate(lo)}, {rate(hi)}] req/s"

    @property
    def has_sla(self) -> bool:
        return self.sla_p99_ms is not None or self.sla_error_rate is not None

    def width(self, lo: int) -> int:
        """The bracket width that is precise enough at ``lo``: max(1, precision x lo), whole users."""
        return max(1, int(math.floor(self.precision * lo + 1e-9)))


@dataclass
class Decision:
    users: int | None  # the next probe, or None: stop
    why: str  # why this probe (or why the search stops)
    stopped_because: str | None = None
    knee_bracket: list[int | None] | None = None  # [last scaling, first saturated (or plateau_close's bound)]
    sla_bracket: list[int | None] | None = None  # [most users meeting the SLA, fewest failing it]
    # the rule that chose the probe: "start", "growth" (still scaling), "past" (growth past the first
    # saturated probe), "refinement", "confirm" (a smooth knee's ends), "sla"; None: stop
    rule: str | None = None


def per_user_and_efficiency(p: Probe, ref: Probe) -> tuple[float, float]:
    """(p's QPS per user as a share of ``ref``'s, the scaling efficiency from ``ref``: its QPS gain over
    the ideal linear gain); both need ``ref.qps`` > 0 and ``p.users`` > ``ref.users``."""
    share = (p.qps / p.users) / (ref.qps / ref.users)
    return share, (p.qps - ref.qps) / (ref.qps * (p.users / ref.users - 1.0))


def saturated(p: Probe, ref: Probe | None, best_p99: float | None, s: Settings) -> str | None:
    """Why ``p`` is saturated (one line), or None: it still scales from ``ref`` (the last scaling
    probe below it); ``best_p99``: the best P99 below it."""
    limit = s.sla_error_rate if s.sla_error_rate is not None else ERROR_RATE
    if p.error_rate > limit:
        return f"errors {p.error_rate:.1%} > {limit:.1%}"
    if p.pushback > PUSHBACK_SHARE:
        return f"429/503 pushback {p.pushback:.1%} of answers"
    if p.offered and p.qps < ACHIEVED_MIN * p.offered and _beyond_arrival_noise(p):
        return f"achieved {p.qps:.1f} req/s < {ACHIEVED_MIN:.0%} of the offered {p.offered:.1f}"
    if ref is None:
        return None
    # closed loop only: in open loop a queue left by an overloaded probe inflates the latency of the
    # next ones below capacity, whose completions show that they keep up (the rule above)
    if p.offered is None and best_p99 and p.p99_ms is not None and ref.p99_ms is not None and \
            p.p99_ms > P99_RISE * best_p99 and p.p99_ms > ref.p99_ms:
        return f"P99 {p.p99_ms:.1f} ms > {P99_RISE:g} x the best {best_p99:.1f} ms and rising"
    if p.offered is None and ref.qps > 0 and p.users > ref.users:
        share, eff = per_user_and_efficiency(p, ref)
        if share < PER_USER_MIN:
            return (f"QPS per user {p.qps / p.users:.3g} < {PER_USER_MIN:g} x {ref.qps / ref.users:.3g} at {ref.users} "
                    f"users ({share:.0%})")
        if eff < EFFICIENCY_MIN:
            return f"scaling efficiency {eff:.2f} from {ref.users} users < {EFFICIENCY_MIN:g}"
    return None


def scaling_certain(p: Probe, probes: list[Probe], s: Settings, margin: float = SCALING_MARGIN) -> str | None:
    """Why the growth probe ``p`` (its figures so far, closed loop) scales beyond doubt, or None: no
    errors or pushback, and from the last scaling probe below it (none for the start: the errors only)
    QPS per user >= PER_USER_MIN + ``margin``, efficiency >= EFFICIENCY_MIN + ``margin``, P99 at most
    P99_CERTAIN_SHARE x the P99_RISE limit, and with an [sla] p99_ms at most SLA_CERTAIN_SHARE of it.
    None as well once ``probes`` (the probes judged so far) hold a saturated one: growth is over."""
    if p.offered is not None or p.error_rate > 0 or p.pushback > 0 or p.qps <= 0:
        return None
    ref, first_saturated, _ = knee_bracket(probes, s)
    if first_saturated is not None or (ref is not None and (ref.users >= p.users or ref.qps <= 0)):
        return None
    if s.sla_p99_ms is not None and (p.p99_ms is None or p.p99_ms > SLA_CERTAIN_SHARE * s.sla_p99_ms):
        return None
    if ref is None:
        return "the first probe, no errors or pushback"
    share, eff = per_user_and_efficiency(p, ref)
    if share < PER_USER_MIN + margin or eff < EFFICIENCY_MIN + margin:
        return None
    best = min((q.p99_ms for q in probes if q.valid and q.p99_ms is not None), default=None)
    limit = P99_CERTAIN_SHARE * P99_RISE * best if best is not None else None
    if limit is not None and (p.p99_ms is None or p.p99_ms > limit):
        return None
    p99 = f", P99 {p.p99_ms:.1f} ms <= {limit:.1f}" if limit is not None and p.p99_ms is not None else ""
    return (f"QPS per user {share:.0%} of {ref.users} users' >= {PER_USER_MIN + margin:.0%}, efficiency {eff:.2f} "
            f">= {EFFICIENCY_MIN + margin:.2f}{p99}, no errors or pushback")


def _beyond_arrival_noise(p: Probe) -> bool:
    """Open loop: the shortfall of completions is more than Poisson arrivals explain: a service
    that keeps up completes what arrived, and n Poisson arrivals are offered·W ± √(offered·W);
    beyond ARRIVAL_Z of that, it did not keep up (an unknown window: any shortfall counts)."""
    if not p.offered or p.window_s <= 0:
        return True
    expected = p.offered * p.window_s
    return (p.offered - p.qps) * p.window_s > ARRIVAL_Z * math.sqrt(expected)


def knee_bracket(probes: list[Probe], s: Settings) -> tuple[Probe | None, Probe | None, str | None]:
    """(last scaling probe, first saturated probe, why it is saturated), walking the probes by users."""
    ref: Probe | None = None
    before: Probe | None = None  # the scaling probe before ref
    best: float | None = None
    scaling: list[Probe] = []
    ordered = sorted(probes, key=lambda q: q.users)
    for p in ordered:
        why = saturated(p, ref, best, s)
        if why:
            past = past_bound_knee(ordered, scaling, p)
            if past:
                return past
            plateau = on_plateau(ref, p, before)
            return (before, ref, plateau) if plateau else (ref, p, why)
        before, ref = ref, p
        scaling.append(p)
        if p.p99_ms is not None and p.valid:
            best = p.p99_ms if best is None else min(best, p.p99_ms)
    return ref, None, None


def bound_knee(probes: list[Probe], lo: Probe, hi: int, min_flat: int = 1) -> float | None:
    """The users where the asymptotic bounds of a sharp knee cross (operational analysis, Denning &
    Buzen 1978; Lazowska et al., Quantitative System Performance ch. 5: X(N) <= min(N·X(1), X_max)):
    N_b = X_plateau / the linear region's QPS per user, when those two bounds fit every probe within
    BOUND_TOL; else None.  The linear rate: the mean QPS per user of the probes at or below half of
    ``lo`` (the last scaling probe); the plateau: the mean QPS of the probes at or above ``hi`` users.  A
    smooth curve (USL) bends below both bounds near its knee by more than that, so it gets None; so
    does a plateau of fewer than ``min_flat`` probes."""
    ok = _usable(probes)
    rate, x_max, n_flat = _bounds(ok, lo.users, hi)
    if rate is None or x_max is None or n_flat < min_flat:
        return None
    if any(abs(p.qps / min(rate * p.users, x_max) - 1.0) > BOUND_TOL for p in ok):
        return None
    return x_max / rate


def past_bound_knee(ordered: list[Probe], scaling: list[Probe], first: Probe) -> tuple[Probe | None, Probe, str] | None:
    """(the last scaling probe, the first probe past a sharp knee, why) when scaling probes lie more
    than PAST_MARGIN beyond the bounds' crossing (``bound_knee``): the QPS-per-user rule passes a
    probe up to 12 % past a sharp knee, and the plateau it sits on shows it (``first``: the first
    saturated probe, where the plateau starts).  None otherwise."""
    if not scaling:
        return None
    nb = bound_knee(ordered, scaling[-1], first.users, PLATEAU_PROBES)
    if nb is None or scaling[-1].users <= nb * (1 + PAST_MARGIN):
        return None
    below = [p for p in scaling if p.users <= nb * (1 + PAST_MARGIN)]
    lo = below[-1] if below else None
    hi = next(p for p in ordered if p.users > (lo.users if lo else 0))
    return lo, hi, (f"past the bounds' knee: {hi.users} users serve the plateau (linear rate x users crosses it "
                    f"at {nb:.1f})")


def on_plateau(lo: Probe | None, hi: Probe, before: Probe | None) -> str | None:
    """Why ``lo``, which passed as scaling from ``before``, is past a sharp knee after all: ``hi``
    above it gained (almost) nothing over it, and its own QPS per user is short of ``before``'s.
    Across a wide bracket the rules pass a probe up to 12 % past a sharp knee (27 users from 16
    at a knee of 24: 89 % of the per-user rate, a gain of 0.73: bench/search.py's K = 24 miss); a
    plateau after it shows it (28 serves what 27 does).  A smooth curve still gains there (the USL target's 16 over 8), and a
    probe at the knee keeps its per-user rate, so neither is moved."""
    if lo is None or before is None or lo.offered is not None or before.qps <= 0 or lo.qps <= 0:
        return None
    gain = per_user_and_efficiency(hi, lo)[1]
    per_user = per_user_and_efficiency(lo, before)[0]
    if gain < PLATEAU_GAIN and per_user < PLATEAU_PER_USER:
        return (f"on the plateau: {hi.users} users gain {gain:.2f} over {lo.users}, whose QPS per user is "
                f"{per_user:.0%} of {before.users}'s")
    return None


def meets_sla(p: Probe, s: Settings) -> bool:
    if s.sla_error_rate is not None and p.error_rate > s.sla_error_rate:
        return False
    return s.sla_p99_ms is None or (p.p99_ms is not None and p.p99_ms <= s.sla_p99_ms)


def sla_bracket(probes: list[Probe], s: Settings) -> tuple[int, int | None]:
    """(most users of a probe meeting the SLA below the first failing one, or 0; the fewest
    users of a probe failing it, or None)."""
    lo, hi = 0, None
    for p in sorted(probes, key=lambda q: q.users):
        if not meets_sla(p, s):
            hi = p.users
            break
        lo = p.users
    return lo, hi


def aim(probes: list[Probe], lo_p: Probe | None, hi: int, s: Settings) -> tuple[int, str]:
    """The next probe strictly inside (lo, hi): where the USL fit predicts the first saturated
    probe (the same rules, on the fitted QPS), else its N*, when either lies inside the bracket
    and the fit has enough valid probes and R² >= R2_AIM; otherwise the midpoint."""
    lo = lo_p.users if lo_p else 0
    tried = {p.users for p in probes}
    valid = [p for p in probes if p.valid and p.qps > 0 and p.offered is None]
    mid = (lo + hi) // 2
    if lo_p is None:
        return mid, f"bisection of [{lo}, {hi}]"
    nb = bound_knee(sorted(probes, key=lambda q: q.users), lo_p, hi)  # a sharp knee: where its bounds cross,
    if nb is not None:  # which the USL fit smooths over (it creeps from the bracket's ends)
        for n in (int(round(nb)), int(math.floor(nb)), int(math.ceil(nb))):
            if lo < n < hi and n not in tried:
                return n, f"the bounds' knee: linear rate x users meets the plateau at {nb:.1f} users"
    if len(valid) < MIN_FIT_PROBES:
        return mid, f"bisection of [{lo}, {hi}]"
    fit = fit_usl([p.users for p in valid], [p.qps for p in valid])
    r2, sigma, kappa, lam = fit.get("r2"), fit.get("sigma"), fit.get("kappa"), fit.get("lambda")
    if sigma is None or kappa is None or lam is None or r2 is None or r2 < R2_AIM:
        return mid, f"bisection of [{lo}, {hi}] (USL fit {'none' if r2 is None else f'R² {r2:.2f} < {R2_AIM:g}'})"
    model = [Probe(users=n, qps=float(usl_throughput(n, sigma, kappa, lam)), p99_ms=None)
             for n in range(1, hi + 1)]
    guard = max(1, (hi - lo) // 4)  # a model step stays a quarter of the bracket from its ends (as Brent's
    #                                 method guards its interpolation): a smooth fit of a sharp knee creeps
    for m in model[lo:hi - 1]:  # users lo+1 .. hi-1
        if saturated(m, model[lo - 1], None, s):
            for n in (m.users, m.users - 1):
                n = min(max(n, lo + guard), hi - guard)
                if lo < n < hi and n not in tried:
                    return n, f"USL fit (R² {r2:.2f}) predicts saturation at {m.users} users"
            break
    n_star = fit.get("n_star")
    if n_star is not None and lo < round(n_star) < hi and round(n_star) not in tried:
        return int(round(n_star)), f"USL fit (R² {r2:.2f}): N* = {n_star:.1f} inside [{lo}, {hi}]"
    return mid, f"bisection of [{lo}, {hi}] (the USL fit, R² {r2:.2f}, predicts no saturation inside)"


def _bounds(ok: list[Probe], lo: int, hi: int) -> tuple[float | None, float | None, int]:
    """A sharp knee's two asymptotic bounds from usable probes (``_usable``): (the linear region's mean
    QPS per user, over the probes at or below lo / 2; the plateau's mean QPS, over those at or above
    hi; how many plateau probes), None for a bound with no probe."""
    low = [p.qps / p.users for p in ok if p.users <= lo / 2]
    flat = [p.qps for p in ok if p.users >= hi]
    return (sum(low) / len(low) if low else None, sum(flat) / len(flat) if flat else None, len(flat))


def _usable(probes: list[Probe]) -> list[Probe]:
    """The closed-loop probes a curve is fitted to: valid, serving, no errors or pushback over the limits."""
    return sorted((p for p in probes if p.valid and p.offered is None and p.qps > 0 and p.error_rate <= ERROR_RATE
                   and p.pushback <= PUSHBACK_SHARE), key=lambda q: q.users)


def bounds_rss(ok: list[Probe]) -> float:
    """The least sum of squared log residuals of a sharp knee's bounds over ``ok`` (sorted by users):
    for each split into a linear part (QPS = rate x N) and a plateau (QPS = X_max), at least one probe
    each, the geometric-mean rate and plateau.  The crossing is not forced between the parts, which
    only favours the sharp knee (the rules keep it)."""
    lx = [math.log(p.qps) for p in ok]
    lr = [math.log(p.qps / p.users) for p in ok]
    best = math.inf
    for i in range(1, len(ok)):
        rate, flat = sum(lr[:i]) / i, sum(lx[i:]) / (len(ok) - i)
        best = min(best, sum((v - rate) ** 2 for v in lr[:i]) + sum((v - flat) ** 2 for v in lx[i:]))
    return best


def smooth_knee(probes: list[Probe], hi: int, s: Settings) -> tuple[float, str] | None:
    """(the users where the USL fit's marginal efficiency crosses EFFICIENCY_MIN, why) when the probes
    are a smooth curve: MIN_FIT_PROBES usable probes or more, R² >= R2_KNEE, and the fit's squared log
    residuals at most SMOOTH_RSS_RATIO x a sharp knee's bounds' (``bounds_rss``); the crossing within
    the probes and at most one growth step past ``hi``, the first saturated probe.  Else None."""
    ok = _usable(probes)
    if len(ok) < MIN_FIT_PROBES:
        return None
    fit = fit_usl([p.users for p in ok], [p.qps for p in ok])
    r2, sigma, kappa, lam = fit.get("r2"), fit.get("sigma"), fit.get("kappa"), fit.get("lambda")
    if sigma is None or kappa is None or lam is None or r2 is None or r2 < R2_KNEE:
        return None
    nf = efficiency_users(sigma, kappa, EFFICIENCY_MIN)
    if nf is None or not ok[0].users <= nf <= hi * s.growth:
        return None
    model = usl_throughput([p.users for p in ok], sigma, kappa, lam)
    rss = sum((math.log(p.qps) - math.log(float(m))) ** 2 for p, m in zip(ok, model))
    sharp = bounds_rss(ok)
    if rss > SMOOTH_RSS_RATIO * sharp:
        return None
    return nf, (f"USL fit (R² {r2:.3f}, residuals {rss / sharp if sharp > 0 else 0:.0%} of a sharp knee's): "
                f"marginal efficiency crosses {EFFICIENCY_MIN:g} at {nf:.1f} users")


def _grow(probes: list[Probe], s: Settings, why_scaling: str) -> Decision:
    top = max(p.users for p in probes)
    if top >= s.max:
        return Decision(None, f"max ({s.max}) reached, still scaling", f"max reached ({s.max}): still scaling")
    nxt = min(s.max, max(top + 1, int(math.ceil(top * s.growth - 1e-9))))
    return Decision(nxt, f"growth x{s.growth:g} from {top}: {why_scaling}", rule="growth")


def plateau_close(probes: list[Probe], lo_p: Probe | None, hi_p: Probe, s: Settings) -> tuple[int, str] | None:
    """(the bracket's high end, why) when the last scaling probe ``lo_p`` (n users) already serves the
    plateau, X_max (the mean QPS of the usable probes from the first saturated one ``hi_p`` up), so
    that the knee is within the precision of n without another probe; else None.

    Operational bounds (``bound_knee``'s references): a curve whose QPS per user never rises with N
    meets its plateau no later than n x X_max / X(n), so the knee lies in [n, that]; when that is
    within max(1, precision x n) of n, a probe above n could only confirm it.  Guards, each against
    one probe's noise: X(n) at least CLOSE_SHARE x X_max (the knee read, n, is then at most 5 % below
    the bound); the bound never below the bounds' crossing (X_max over the mean QPS per user of the
    probes at or below n / 2, which is never above n x X_max / X(n) without noise); n not more than
    PAST_MARGIN past that crossing (a probe past a sharp knee that passed the rules: they move it
    once the plateau has PLATEAU_PROBES probes, which a close would forgo).  A smooth curve near its
    knee serves well below the probes past it (USL σ = 0.02, κ = 0.002: 8 users 0.71 of 16's QPS),
    so it is not closed here (and ``smooth_knee`` places it first)."""
    ok = _usable(probes)
    if lo_p is None or lo_p not in ok:
        return None
    rate, x_max, _ = _bounds(ok, lo_p.users, hi_p.users)
    if x_max is None:
        return None
    n = lo_p.users
    crossing = x_max / rate if rate is not None else None
    upper = max(n * x_max / lo_p.qps, crossing or 0.0)
    if lo_p.qps < CLOSE_SHARE * x_max or upper > n + s.width(n) + 1e-9:
        return None
    if crossing is not None and n > crossing * (1 + PAST_MARGIN):
        return None
    hi = max(n + 1, int(math.ceil(upper - 1e-9)))  # below hi_p: upper <= n + width < hi_p.users
    return hi, (f"{n} users serve {lo_p.qps / x_max:.0%} of the plateau ({x_max:.4g} req/s, from {hi_p.users} users "
                f"up): by the operational bounds the knee is at most {upper:.1f} users, within the precision; "
                f"{hi} not probed")


def _smooth_step(probes: list[Probe], s: Settings, knee: list[int | None], head: str,
                 smooth: tuple[float, str]) -> tuple[Decision | None, list[int | None]]:
    """A smooth curve (``smooth_knee``): the fit places the knee and its bracket's ends are probed to
    confirm it.  (the next probe, or None: placed; the knee bracket)."""
    nf, how = smooth
    tried = {p.users for p in probes}
    top = max(p.users for p in _usable(probes))
    # nothing well past the crossing yet: one growth step (the crossing is at most one growth step past
    # the first saturated probe, so this goes at most two past it, where the rules misjudged the curve)
    nxt = min(s.max, max(top + 1, int(math.ceil(top * s.growth - 1e-9))))
    if top < FIT_SPAN * nf and top < s.max and nxt not in tried:  # (tried: not valid, not probed again)
        return Decision(nxt, f"{head}; {how}: growth x{s.growth:g} from {top} to see past it", None, knee,
                        rule="past"), knee
    # the low end (the knee read from a bracket) is the whole user nearest the crossing: the fit is
    # unbiased (3 % noise, bench/search_sim.py's USL cases: -0.1 ± 0.2 and 0.2 ± 0.7 users), and
    # its floor would add half a user of error to that
    width = s.width(max(1, int(nf)))
    a = min(s.max, max(1, int(math.floor(nf - (width - 1) / 2 + 0.5))))
    knee = [a, min(a + width, s.max)]
    for n in knee:
        if n not in tried:
            return Decision(n, f"{head}; {how}: probe {n} to confirm", None, knee, rule="confirm"), knee
    return None, knee


def _sla_step(probes: list[Probe], s: Settings, top_saturated: int) -> Decision | None:
    """With an ``[sla]``, the next probe towards its boundary (one growth step past the first saturated
    probe while the SLA still holds there, then bisection), or None when it is bracketed."""
    sla_lo, sla_hi = sla_bracket(probes, s)
    top = max(p.users for p in probes)
    if sla_hi is None and top == top_saturated and top < s.max:
        nxt = min(s.max, max(top + 1, int(math.ceil(top * s.growth - 1e-9))))
        return Decision(nxt, f"SLA still met at the first saturated probe ({top}): one growth step past it", rule="past")
    if sla_hi is not None and sla_hi - sla_lo > s.width(sla_lo):
        users, why = (sla_lo + sla_hi) // 2, f"bisection of [{sla_lo}, {sla_hi}]"
        if sla_lo == 0:
            users = max(1, sla_hi // 2)
        return Decision(users, f"SLA boundary in [{sla_lo}, {sla_hi}]: {why}", rule="sla")
    return None


def decide(probes: list[Probe], s: Settings, load_s: float) -> Decision:
    """The next probe (and why), or stop (``users`` None, ``stopped_because``)."""
    if not probes:
        return Decision(s.start, "start", rule="start")
    lo_p, hi_p, why_sat = knee_bracket(probes, s)
    lo = lo_p.users if lo_p else 0
    knee: list[int | None] = [lo if lo_p else None, hi_p.users if hi_p else None]
    sla_lo, sla_hi = sla_bracket(probes, s) if s.has_sla else (0, None)
    sla = [sla_lo or None, sla_hi] if s.has_sla else None
    if load_s >= s.max_duration:
        return Decision(None, "max_duration reached", f"max_duration ({s.max_duration:g} s of load) reached", knee, sla)
    if hi_p is None:
        d = _grow(probes, s, "still scaling")
        d.knee_bracket, d.sla_bracket = knee, sla
        return d
    head = f"knee in {s.span(lo, hi_p.users)} ({hi_p.users}: {why_sat})"
    smooth = smooth_knee(probes, hi_p.users, s)
    placed = ""
    if smooth is not None:  # a smooth curve: the fit places the knee; its bracket's ends are probed to confirm it
        confirm, knee = _smooth_step(probes, s, knee, head, smooth)
        if confirm is not None:
            confirm.sla_bracket = sla
            return confirm
        placed = f" ({smooth[1]})"
    elif hi_p.users - lo > s.width(lo):
        close = plateau_close(probes, lo_p, hi_p, s)
        if close is None:
            users, why = aim(probes, lo_p, hi_p.users, s)
            return Decision(users, f"{head}; {why}", None, knee, sla, rule="refinement")
        knee, placed = [lo, close[0]], f" ({close[1]})"
    if s.has_sla:
        towards = _sla_step(probes, s, hi_p.users)
        if towards is not None:
            towards.knee_bracket, towards.sla_bracket = knee, sla
            return towards
    done = f"knee bracketed in {s.span(knee[0], knee[1])}{placed}"
    if s.has_sla:
        done += f", SLA boundary in {s.span(sla_lo, sla_hi if sla_hi is not None else 'beyond')}"
    return Decision(None, done, done, knee, sla)


def settings_of(plan: Plan) -> Settings:
    """The search's settings from a plan (open loop: users are arrival sources of source_rate)."""
    load = plan.load
    unit = load.source_rate if load.arrivals == "open" else 1.0
    return Settings(start=int(round(load.start / unit)), max=int(round(load.max / unit)), growth=load.growth,
                    precision=load.precision, max_duration=load.max_duration, sla_p99_ms=plan.sla.p99_ms,
                    sla_error_rate=plan.sla.error_rate, unit=unit, open_loop=load.arrivals == "open")


@dataclass
class SearchDriver:
    """The master's side: asked by the step schedule when a probe ends; measures it on the rows
    (``meter``: kneeswarm.locustfiles.steady.ProbeMeter) that started in its window, from its cut (or settle)
    up to ``horizon(now)`` (every row before it is in), decides, and records generator/search.json:
    each probe's why, and once measured its figures, ``window`` [start, horizon) and ``t_judged``."""

    settings: Settings
    meter: Any  # .figures(t_lo, horizon) -> dict; .forget_before(t)
    run: RunDir | None = None
    settle: float = 0.0
    lag_s: float = 0.0  # without ``horizon``: rows are judged up to now - lag_s (a fixed guess of their delay)
    open_loop: bool = False
    auto_hold: bool = False
    horizon: Any = None  # horizon(now): the time before which every row is in (kneeswarm.locustfiles.watermark.Horizon)
    ci: float = 0.10  # [load] ci: the precision a P99 is held for (for may_end's words)
    min_rows: int = MIN_PROBE_REQUESTS  # may_end: rows a probe needs (the analysis's min_requests keeps it valid)
    probes: list[Probe] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    last: Decision | None = None
    _asked: dict[int, float] = field(default_factory=dict)  # step index -> when its end was first asked

    def first(self) -> int:
        self.last = decide([], self.settings, 0.0)
        self.records.append({"index": 0, "users": self.last.users, "why": self.last.why, "rule": self.last.rule})
        self._write()
        return self.settings.start  # decide's first answer: the start

    def __call__(self, step: Any, now: float, load_s: float) -> int | None:
        """The step ``step`` (steps.StepRecord) ends at ``now``: the next probe's users, or None."""
        t_lo = step.t_cut if step.t_cut is not None else (step.t_steady or step.t_ramp) + self.settle
        horizon = self._horizon(now)
        fig = self.meter.figures(t_lo, horizon)
        self._asked.setdefault(step.index, now)
        if fig["requests"] < MIN_PROBE_REQUESTS and now - self._asked[step.index] < MAX_WAIT_S:
            return WAIT
        self.meter.forget_before(now)
        offered, qps = None, fig["qps"]
        if self.open_loop:  # what the service completed against what was offered (steady.ProbeMeter): the
            #  arrivals still in flight are not rows yet, so the offered rate is the plan's
            offered, qps = step.users * self.settings.unit, fig["completed_qps"]
        # steady: no warm-up still running (hold = "auto" found a cut); a P99 not yet known within
        # the asked CI still leaves the QPS the search compares
        steady = not self.auto_hold or step.t_cut is not None
        self.probes.append(Probe(users=step.users, qps=qps, p99_ms=fig["p99_ms"], error_rate=fig["error_rate"],
                                 pushback=fig["pushback"], valid=fig["requests"] > 0 and steady,
                                 offered=offered, requests=fig["requests"], window_s=max(0.0, horizon - t_lo)))
        self.records[-1].update(measured={k: fig[k] for k in ("qps", "p99_ms", "error_rate", "pushback", "requests",
                                                             "arrival_rate", "completed_qps") if k in fig},
                                steady=steady, window=[t_lo, horizon], t_judged=now)
        self.last = decide(self.probes, self.settings, load_s)
        if self.last.users is not None:
            self.records.append({"index": step.index + 1, "users": self.last.users, "why": self.last.why,
                                 "rule": self.last.rule})
        logger.info("kneeswarm search: %s", self.last.why)
        self._write()
        return self.last.users

    def may_end(self, step: Any, verdict: Any, now: float) -> str | None:
        """The step schedule asks, while ``step`` is held (``verdict``: steady.Verdict, steady with its
        QPS known), whether it may end before its P99 is known: a reason (steps.csv's hold_reason) when
        its probe was chosen by growth (or is the start), closed loop, ``hold = "auto"``, with at least
        ``min_rows`` rows from the cut up to the horizon, and ``scaling_certain`` says so; else None.
        Never for refinement, confirmation, SLA probes or a grid: their figures are what is compared."""
        if not EARLY_END or not self.auto_hold or self.open_loop or self.last is None or self.last.rule not in EARLY_RULES \
                or self.last.users != step.users or verdict.t_cut is None:
            return None
        if not verdict.qps_half_width <= EARLY_QPS_CI:  # (inf, nan: unknown) the later rules need it precise
            return None
        horizon = self._horizon(now)
        fig = self.meter.figures(verdict.t_cut, horizon)
        rows = fig["requests"]
        if rows < max(MIN_PROBE_REQUESTS, self.min_rows):
            return None
        p = Probe(users=step.users, qps=fig["qps"], p99_ms=fig["p99_ms"], error_rate=fig["error_rate"],
                  pushback=fig["pushback"], requests=rows)
        why = scaling_certain(p, self.probes, self.settings)
        if why is None:
            return None
        return (f"{SCALING_CERTAIN} ({why}, QPS ±{verdict.qps_half_width:.1%} <= ±{EARLY_QPS_CI:.1%}): its P99 is "
                f"from {rows} rows, not known within ±{self.ci:.0%}")

    def _horizon(self, now: float) -> float:
        """The time before which every row is in: the sources' watermark, else now - lag_s."""
        return min(now, self.horizon(now)) if self.horizon is not None else now - self.lag_s

    @property
    def stopped_because(self) -> str | None:
        return self.last.stopped_because if self.last else None

    def _write(self) -> None:
        if self.run is None:
            return
        d = self.last or Decision(None, "")
        doc = {"probes": self.records, "stopped_because": d.stopped_because, "knee_bracket": d.knee_bracket,
               "sla_bracket": d.sla_bracket, "settings": asdict(self.settings), "t": time.time(),
               "rules": {"efficiency_min": EFFICIENCY_MIN, "per_user_min": PER_USER_MIN, "plateau_gain": PLATEAU_GAIN,
                         "plateau_per_user": PLATEAU_PER_USER, "bound_tol": BOUND_TOL, "past_margin": PAST_MARGIN,
                         "p99_rise": P99_RISE, "error_rate": ERROR_RATE,
                         "pushback_share": PUSHBACK_SHARE, "achieved_min": ACHIEVED_MIN, "arrival_z": ARRIVAL_Z, "r2_aim": R2_AIM,
                         "r2_knee": R2_KNEE, "smooth_rss_ratio": SMOOTH_RSS_RATIO, "fit_span": FIT_SPAN}}
        try:
            write_json(self.run.generator_dir / SEARCH_FILE, doc)
        except OSError as e:  # the load goes on; the conductor sees the file missing
            logger.error("kneeswarm: could not write generator/%s: %s", SEARCH_FILE, e)
