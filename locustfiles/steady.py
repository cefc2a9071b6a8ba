"""``hold = "auto"``: is a step steady, and are its QPS and P99 known?  Judged on the rows.

Free of Locust (numpy; scipy for a t quantile, imported on first use), so it can be tested alone; the master feeds it the request rows as
they arrive (plugin.Recording) and the step schedule (steps.py) asks it once a tick.

Steady: MSER-5 truncation of the warm-up (White 1997, "An effective truncation heuristic for bias
reduction in simulation output", Simulation 69(6); White, Cobb & Spratt 2000, "A comparison of
five steady-state truncation heuristics for simulation", Proc. Winter Simulation Conference).  For
a series Y₁..Yₙ the cut d minimises MSER(d) = Σ_{i>d}(Yᵢ − Ȳ_d)² / (n − d)²; a minimum in the
second half of the series means the warm-up is not over (the rule's own test of steadiness).  It
is run on two series: the median latency of consecutive batches of 5 successful requests (MSER-5,
with batch medians rather than means so one stalled request does not pass for a trend), and the
successful requests of each second (QPS).  The step's steady data begin at the later of the two
cuts (``t_cut``).  A "warm-up" whose level is within ``ci`` of the rest is not one (no cut): on a
busy host the median moves by a few per cent, significant to MSER, not to a user who asked ±10 %.
What is kept must then have no trend: the median of the last third of each kept series may differ
from that of its first third by at most ``ci`` of the series' median (a trend test of magnitude,
robust to a stall near either end; MSER alone passes a steady climb whose points sit near its mean).

Known: after the cut, QPS within ``ci`` (relative half-width of a 95 % interval; closed loop from
the count's ends and the mean latency's noise, below; else from the mean and spread of the
per-second counts, batch means of one second), and P99 within ``ci`` from the
binomial order-statistic interval: the ranks n·p ∓ 1.96·√(n·p·(1 − p)) of the sorted latencies
bound the p-quantile with 95 % confidence whatever the distribution (Conover, Practical
Nonparametric Statistics, 3rd ed., §3.2); its relative half-width is (x_(u) − x_(l)) / 2 / P99.
Closed loop with the step's users given (the step schedule does), QPS's half-width is not the
per-second counts'.  N users without think time start their requests in cohorts (a server that serves
its requests alike, or batches them, answers them together, and each answer starts the next request),
so a second holds a whole number of cohorts: at 4 users and 200 ms every second holds 20 and the
counts claim ±0.0 %, at 217 ms they jump 16/20/24 and claim ±4 % where the window's QPS is within
±1.5 %.  On bench/qps_noise.py's real runs (demo targets, 60-s steps) their interval held the error
of 26-89 % of the windows of 3-6 s.  What the count of a window [a, b) misses is its two ends: each
user's requests in it number (b − a)/cycle rounded up or down, an error under one row, and N users
in step err together, by under N rows, so N/(rows − N) bounds the relative error whatever the phase.
(For uniform phases at both ends its 95 % point would be 0.78·N/rows, σ ≈ 0.41·N/rows, 0.4-0.45
measured; but the window starts at t_cut, often a row's start, and the count then errs one way by up
to N rows, uniformly: 0.95·N/rows.)  The rest is the cycle's own noise: by Little's law (X = N/(R + Z))
QPS is known as well as the mean latency, whose half-width comes from the per-second mean latencies
(Student's t₀.₉₇₅ with k − 1 degrees of freedom).  ``closed_loop_qps_half_width`` adds the two in
quadrature; it held the error of every window of 3-15.5 s of the same runs.  ``known`` and the
verdict's ``qps_half_width`` (what a search probe ending on its QPS alone is gated on,
kneeswarm.launch.search.EARLY_QPS_CI) use it.  Without the users the per-second counts' batch means stand:
z for ``known``, Student's t (2.78 at 5 s, 2.26 at 10 s) for ``qps_half_width``.

Open loop (``t_sent``: every row's intended send time, failed ones too) is judged on the share of
the arrivals that succeeded, not on the count of successes.  Rows start at their intended time, so
the count of a second is the generator's own Poisson draw whatever the server does: n arrivals of
an offered rate are Poisson, relative half-width 1.96/√n (at 32 req/s, ±11 % after 10 s, ±10 %
only after 12 s; Garwood 1936, Biometrika 28), and its swings from second to second (±18 % at 32
req/s) read as a trend or a warm-up to the tests above, which held such steps to ``max_hold`` while
the server was steady.  That noise is the generator's, known in advance, and no hold teaches
anything about the server.  What the server decides is which arrivals succeed: the achieved rate
is the offered rate (the plan's, exact) times that share, so "QPS known within ci" means the
share's 95 % interval (Wilson score, a binomial proportion: Brown, Cai & DasGupta 2001, "Interval
Estimation for a Binomial Proportion", Statist. Sci. 16(2)) has a relative half-width within
``ci``, and "steady" means no warm-up or trend in the share of each second.  This is the same
split as the search's open-loop rule (kneeswarm.launch.search: completions short of the offered rate
count only beyond the arrivals' Poisson noise).  A server falling behind shows in the latency
series (the queue grows: its requests wait longer) and in the share (timeouts, dropped arrivals).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kneeswarm.contracts.rundir import QPS_KNOWN_AT_MAX_HOLD

Z95 = 1.959964  # two-sided 95 % normal quantile
P99 = 0.99
MSER_BATCH = 5  # MSER-5: batches of 5 observations (White, Cobb & Spratt 2000)
MSER_END_SHARE = 4  # the last 1/4 of the series is never a truncation point (end effect)
MIN_BATCHES = 10  # fewer latency batches than this: too little to judge a trend
# the walk back over a flat tail looks at the median of the last max(5, n/10) points before the cut,
# so a stall shorter than half of that (a busy host's hiccup) does not stop it; a warm-up does
MIN_SPAN, ROBUST_SPAN_SHARE = 5, 10
MIN_SECONDS = 4  # fewer whole seconds than this: too little to judge a trend in QPS
MIN_CI_SECONDS = 3  # fewer whole seconds after the cut than this: QPS spread unknown


@dataclass
class Verdict:
    steady: bool
    known: bool
    t_cut: float | None  # where the steady data begin (epoch s); None until steady
    why: str  # one line: what is missing, or what was found
    # the parts of ``known``, apart: a search probe may end on its QPS alone (kneeswarm.launch.search.scaling_certain)
    qps_known: bool = False  # QPS within ci
    # QPS's relative 95 % half-width: closed loop with the users, closed_loop_qps_half_width; without them,
    # qps_half_width_t; open loop, the share's Wilson half-width; inf: unknown.  What a probe ending on its
    # QPS alone is gated on (kneeswarm.launch.search.EARLY_QPS_CI)
    qps_half_width: float = math.inf
    p99_half_width: float = math.inf  # P99's relative 95 % half-width (inf: too few rows for its interval)
    rows: int = 0  # successful rows after the cut

    @property
    def done(self) -> bool:
        return self.steady and self.known


def mser_cut(y: np.ndarray, tolerance: float = 0.0) -> int | None:
    """The MSER truncation index d of ``y``, or None when the minimum lies in the second half of the
    series (not steady yet).  The last quarter is not searched: there MSER(d) is the variance of a
    handful of points and dips by chance (the end effect; Hoad, Robinson & Davies 2010,
    "Automating warm-up length estimation", J. Oper. Res. Soc. 61(9)).  A cut whose truncated part's
    mean is within ``tolerance`` (relative) of the rest's is no warm-up: 0 (a shift smaller than the
    precision asked for is not worth the data it would throw away, nor a longer hold), and the cut
    is moved back while the median of the points just before it (max(5, n/10) of them) is already
    within ``tolerance`` of that level: past the warm-up MSER's minimum wanders over a flat tail,
    and lands just after a one-off stall (a busy host's hiccup is no warm-up)."""
    y = np.asarray(y, dtype=float)
    n = len(y)
    if n < 2:
        return None
    # suffix sums: tail d holds y[d:], of length n - d
    s1 = np.cumsum(y[::-1])[::-1]
    s2 = np.cumsum((y * y)[::-1])[::-1]
    m = n - np.arange(n)
    sse = s2 - s1 * s1 / m  # Σ (y - mean)² over y[d:]
    last = max(1, n - n // MSER_END_SHARE)  # d < last: the tail keeps at least a quarter
    mser = sse[:last] / (m[:last] ** 2)
    d = int(np.argmin(mser))
    level = float(np.mean(y[d:]))
    if d > 0 and abs(float(np.mean(y[:d])) - level) <= tolerance * abs(level):
        return 0
    # MSER's minimum wanders over a flat tail, and lands just after a one-off stall of a busy host:
    # move the cut back while the median of the points just before it is already at the level
    k = max(MIN_SPAN, n // ROBUST_SPAN_SHARE)
    while d > 0 and abs(float(np.median(y[max(0, d - k):d])) - level) <= tolerance * abs(level):
        d -= 1
    return d if d <= n // 2 else None


def qps_half_width(counts: np.ndarray) -> float:
    """Relative half-width of the 95 % interval of the mean per-second count (inf when unknown)."""
    k = len(counts)
    mean = float(np.mean(counts)) if k else 0.0
    if k < MIN_CI_SECONDS or mean <= 0:
        return math.inf
    return Z95 * float(np.std(counts, ddof=1)) / math.sqrt(k) / mean


def qps_half_width_t(counts: np.ndarray) -> float:
    """qps_half_width with Student's t quantile t₀.₉₇₅(k − 1) for the k counts, not z: the spread is
    estimated from the same few seconds, and z under-covers (inf when unknown)."""
    hw = qps_half_width(counts)
    return hw if not math.isfinite(hw) else hw * _t975(len(counts) - 1) / Z95


def closed_loop_qps_half_width(users: int, t: np.ndarray, latency_ms: np.ndarray, t_cut: float,
                               horizon: float) -> float:
    """Relative 95 % half-width of a closed loop's QPS over [t_cut, horizon) from its successful rows
    (``t`` start, epoch s): the count's ends, users/(rows − users) (each user's requests straddling
    either end err by under one row, all in step at worst), and the cycle's noise, Student's t on the
    mean latency of each whole second (Little's law), in quadrature (the module's docstring; inf when
    unknown)."""
    keep = (t >= t_cut) & (t < horizon)
    rows = int(keep.sum())
    k = int(math.floor(horizon - t_cut))
    if users < 1 or rows <= users or k < MIN_CI_SECONDS:
        return math.inf
    sec = ((t[keep] - t_cut) // 1.0).astype(int)
    lat = latency_ms[keep]
    n = np.bincount(sec, minlength=k)[:k]
    sums = np.bincount(sec, weights=lat, minlength=k)[:k]
    means = sums[n > 0] / n[n > 0]
    mean = float(np.mean(lat))
    if len(means) < MIN_CI_SECONDS or mean <= 0:
        return math.inf
    cycle = _t975(len(means) - 1) * float(np.std(means, ddof=1)) / math.sqrt(len(means)) / mean
    return math.hypot(users / (rows - users), cycle)


@functools.lru_cache(maxsize=None)
def _t975(df: int) -> float:
    """Student's t quantile 0.975 with ``df`` degrees of freedom.  scipy.stats is imported here, on the
    master's first verdict, not with the module: it costs ~0.5 s of import in every worker process."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.975, df))


def _ranks(n: int, p: float) -> tuple[int, int]:
    """The 1-based ranks n·p ∓ 1.96·√(n·p·(1 − p)) that bound the p-quantile of n rows (95 %)."""
    spread = Z95 * math.sqrt(n * p * (1 - p))
    return math.floor(n * p - spread), math.ceil(n * p + spread) + 1


def p99_half_width(latency: np.ndarray, p: float = P99) -> float:
    """Relative half-width of the binomial order-statistic 95 % interval of the p-quantile (inf
    when there are too few rows for the interval's upper rank to exist)."""
    x = np.sort(np.asarray(latency, dtype=float))
    n = len(x)
    lo, hi = _ranks(n, p)
    if lo < 1 or hi > n:
        return math.inf
    q = float(np.quantile(x, p))
    if q <= 0:
        return math.inf
    return (x[hi - 1] - x[lo - 1]) / 2.0 / q


def _min_rows(p: float) -> int:
    """The fewest rows whose p-quantile has an order-statistic interval (p99_half_width's ranks)."""
    n = 1
    while not (_ranks(n, p)[0] >= 1 and _ranks(n, p)[1] <= n):
        n += 1
    return n


P99_MIN_ROWS = _min_rows(P99)  # 563: below it P99 is unknown however steady the step (a slow step's max_hold reason)


def judge(t_start: np.ndarray, latency_ms: np.ndarray, t_lo: float, horizon: float, ci: float,
          t_sent: np.ndarray | None = None, users: int | None = None) -> Verdict:
    """The verdict on a step's successful rows (``t_start`` epoch s, ``latency_ms``) that started in
    [t_lo, horizon): the window after the settle, up to the time the rows are known complete.
    ``t_sent`` (open loop): the start of every row, failed ones too -- QPS is then judged as the
    share of the arrivals that succeeded (the module's docstring).  ``users`` (closed loop): the
    step's users, for closed_loop_qps_half_width."""
    t = np.asarray(t_start, dtype=float)
    lat = np.asarray(latency_ms, dtype=float)
    keep = (t >= t_lo) & (t < horizon) & np.isfinite(lat)
    order = np.argsort(t[keep], kind="stable")
    t, lat = t[keep][order], lat[keep][order]
    seconds = int(math.floor(horizon - t_lo))
    if seconds < MIN_SECONDS or len(t) < MSER_BATCH * MIN_BATCHES:
        return Verdict(False, False, None, f"too little data yet ({len(t)} requests over {max(seconds, 0)} s)")
    sent = None if t_sent is None else np.asarray(t_sent, dtype=float)
    if sent is not None:
        sent = sent[(sent >= t_lo) & (sent < horizon)]
    counts = _per_second(t, sent, t_lo, seconds)
    d_qps = mser_cut(counts, ci)
    nb = len(lat) // MSER_BATCH
    batches = np.median(lat[: nb * MSER_BATCH].reshape(nb, MSER_BATCH), axis=1)
    d_lat = mser_cut(batches, ci)
    if d_qps is None or d_lat is None:
        what = " and ".join(w for w, d in (("QPS", d_qps), ("median latency", d_lat)) if d is None)
        return Verdict(False, False, None, f"not steady: {what} still trending (MSER-5 cut in the second half)")
    drifts = [(w, c) for w, c in (("QPS", _drift(counts[d_qps:])), ("median latency", _drift(batches[d_lat:])))
              if c > ci]
    if drifts:
        what = " and ".join(f"{w} by {c:.0%}" for w, c in drifts)
        return Verdict(False, False, None, f"not steady: {what} over the kept window (median of its last third against its first, > ±{ci:.0%})")
    t_cut = max(t_lo + d_qps, float(t[d_lat * MSER_BATCH]))
    after = t >= t_cut
    if sent is None and users is not None:
        hw_qps = hw_t = closed_loop_qps_half_width(users, t, lat, t_cut, horizon)
        what = "QPS"
    elif sent is None:
        whole = int(math.floor(horizon - t_cut))
        per_s = np.bincount(((t[after] - t_cut) // 1.0).astype(int), minlength=whole)[:whole].astype(float)
        hw_qps, hw_t, what = qps_half_width(per_s), qps_half_width_t(per_s), "QPS"
    else:
        hw_qps, what = share_half_width(int(after.sum()), int((sent >= t_cut).sum())), "QPS (share of the offered)"
        hw_t = hw_qps
    hw_p99 = p99_half_width(lat[after])
    known = hw_qps <= ci and hw_p99 <= ci
    n_after = int(after.sum())
    rate = float(after.sum()) / max(horizon - t_cut, 1e-9)  # a slow step: how long P99 needs at its rate
    p99 = (_pct(hw_p99) if math.isfinite(hw_p99) else
           f"unknown (its interval needs {P99_MIN_ROWS} requests, {P99_MIN_ROWS / max(rate, 1e-9):.0f} s at this rate)")
    why = (f"{what} ±{_pct(hw_qps)}, P99 ±{p99} (95 % CI, want ±{ci:.0%}) over {int(after.sum())} requests "
           f"after a {t_cut - t_lo:.1f} s warm-up cut")
    return Verdict(True, known, t_cut, why, qps_known=hw_qps <= ci, p99_half_width=hw_p99, rows=n_after,
                   qps_half_width=hw_t)


def _per_second(t: np.ndarray, sent: np.ndarray | None, t_lo: float, seconds: int) -> np.ndarray:
    """The QPS series judged for steadiness: the successes of each whole second from ``t_lo``; open
    loop (``sent``), the share of that second's arrivals that succeeded (a second without arrivals,
    which a low rate has, takes the window's share: it says nothing either way)."""
    ok = np.bincount(((t - t_lo) // 1.0).astype(int), minlength=seconds)[:seconds].astype(float)
    if sent is None:
        return ok
    n = np.bincount(((sent - t_lo) // 1.0).astype(int), minlength=seconds)[:seconds].astype(float)
    overall = float(ok.sum() / n.sum()) if n.sum() > 0 else 0.0
    return np.divide(ok, n, out=np.full(seconds, overall), where=n > 0)


def share_half_width(ok: int, n: int) -> float:
    """Relative half-width of the Wilson score 95 % interval of the share ok/n (inf when no
    success): the interval keeps inside [0, 1] and stays honest at a share of 1, where the normal
    approximation's width is 0 (Brown, Cai & DasGupta 2001)."""
    if n <= 0 or ok <= 0:
        return math.inf
    p, z2 = ok / n, Z95 * Z95
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return half / p


def _drift(y: np.ndarray) -> float:
    """How much the kept series moves: the median of its last third against its first third,
    relative to its median (0 for fewer than 6 points or a median of 0).  Medians, not a
    least-squares line: one stall near an end of the window tilts a line, not a median."""
    n = len(y) // 3
    mid = float(np.median(y)) if len(y) else 0.0
    if n < 2 or mid == 0:
        return 0.0
    return abs(float(np.median(y[-n:])) - float(np.median(y[:n]))) / abs(mid)


def _pct(x: float) -> str:
    return "unknown" if not math.isfinite(x) else f"{x:.0%}"


class AutoHold:
    """The master's side of ``hold = "auto"``: keeps the successful rows of the current step as
    they arrive and says, once a tick, whether the step may end.

    Rows reach the master with the workers' reports, clock-corrected there, so a step is judged on
    the rows that started before ``horizon(now)``, the time before which every row is in
    (kneeswarm.locustfiles.watermark.Horizon: the sources' watermarks); later ones may still be on their way.
    Without a ``horizon``, ``now − lag_s``: a fixed guess of how late rows arrive.
    """

    def __init__(self, min_hold: float, max_hold: float, settle: float, ci: float, lag_s: float,
                 open_loop: bool = False, horizon: Callable[[float], float] | None = None) -> None:
        self.min_hold, self.max_hold, self.settle, self.ci, self.lag_s = min_hold, max_hold, settle, ci, lag_s
        self.horizon = horizon
        self.open_loop = open_loop  # judged on the share of the arrivals that succeeded (judge's t_sent)
        self._t: list[np.ndarray] = []
        self._lat: list[np.ndarray] = []
        self._sent: list[np.ndarray] = []  # open loop: the start of every row, failed ones too
        self.last: Verdict | None = None

    def add(self, cols: dict | None) -> None:
        """A batch of rows (column lists, t_start on the master's clock); failures are left out of
        the judged rows (open loop: they count among the arrivals)."""
        if not cols or not cols.get("t_start"):
            return
        ok = np.asarray([v is True for v in cols.get("ok", [])], dtype=bool)
        lat = np.asarray([np.nan if v is None else v for v in cols.get("latency_ms", [])], dtype=float)
        t = np.asarray(cols["t_start"], dtype=float)
        if len(ok) != len(t) or len(lat) != len(t):
            return
        self._t.append(t[ok])
        self._lat.append(lat[ok])
        if self.open_loop:
            self._sent.append(t)

    def forget_before(self, t: float) -> None:
        """Drop rows that started before ``t`` (a new step began)."""
        self.last = None
        if not self._t:
            return
        t_all, lat_all = np.concatenate(self._t), np.concatenate(self._lat)
        keep = t_all >= t
        self._t, self._lat = [t_all[keep]], [lat_all[keep]]
        if self._sent:
            sent = np.concatenate(self._sent)
            self._sent = [sent[sent >= t]]

    def decide(self, t_steady: float, now: float, users: int | None = None) -> tuple[bool, float | None, str | None]:
        """(end the step, t_cut, reason it ended unsettled or None); ``users``: the step's (closed loop:
        its QPS half-width counts the users' requests straddling the window's ends, judge's ``users``)."""
        held = now - t_steady
        if held < self.min_hold:
            self.last = None  # no verdict on this step yet (the one before's is not this one's)
            return False, None, None
        t = np.concatenate(self._t) if self._t else np.empty(0)
        lat = np.concatenate(self._lat) if self._lat else np.empty(0)
        sent = (np.concatenate(self._sent) if self._sent else np.empty(0)) if self.open_loop else None
        horizon = min(now, self.horizon(now)) if self.horizon is not None else now - self.lag_s
        v = judge(t, lat, t_steady + self.settle, horizon, self.ci, t_sent=sent,
                  users=None if self.open_loop else users)
        self.last = v
        if v.done:
            return True, v.t_cut, None
        if held >= self.max_hold:
            if v.steady and v.qps_known:  # only P99 is short of rows: a note, the step stays valid
                return True, v.t_cut, (f"{QPS_KNOWN_AT_MAX_HOLD} (held {self.max_hold:g} s, max_hold; QPS "
                                       f"±{v.qps_half_width:.1%}): its P99 is from {v.rows} rows, not known "
                                       f"within ±{self.ci:.0%}: {v.why}")
            return True, v.t_cut, f"held {self.max_hold:g} s (max_hold) without being {_missing(v)}: {v.why}"
        return False, None, None


def _missing(v: Verdict) -> str:
    return "steady" if not v.steady else "known within the asked CI"


class ProbeMeter:
    """``mode = "search"``: the master's figures of the current step, from every row as it arrives
    (not Locust's rounded statistics): successful requests/s, P99 of the successful ones, the
    failed share and the share of 429/503 answers (pushback) over a window.

    Open loop also needs what was served against what was offered: the successes by completion
    time (``completed_qps``) count what the service got through in the window.  A saturated
    service completes its capacity and queues the rest; one that keeps up completes what arrived
    a latency earlier, and one that drains a queue left by an earlier probe completes more.  The
    rows by start time (``arrival_rate``) count the arrivals only once they are done: those still
    queued are not rows yet, so it reads low exactly when the service falls behind."""

    def __init__(self) -> None:
        self._cols: list[tuple[np.ndarray, ...]] = []

    def add(self, cols: dict | None) -> None:
        if not cols or not cols.get("t_start"):
            return
        t = np.asarray(cols["t_start"], dtype=float)
        ok = np.asarray([v is not None and bool(v) for v in cols.get("ok", [])], dtype=bool)
        lat = np.asarray([np.nan if v is None else v for v in cols.get("latency_ms", [])], dtype=float)
        status = np.asarray([0 if v is None else int(v) for v in cols.get("status", [0] * len(t))], dtype=int)
        if not (len(ok) == len(lat) == len(status) == len(t)):
            return
        self._cols.append((t, ok, lat, status))

    def forget_before(self, t: float) -> None:
        """Drop the rows done before ``t`` (a request still running at ``t`` completes in the next window)."""
        self._cols = [tuple(c[keep] for c in cols) for cols in self._cols
                      if (keep := _done(cols[0], cols[2]) >= t).any()]

    def figures(self, t_lo: float, horizon: float) -> dict:
        """{requests, qps, p99_ms, error_rate, pushback, arrival_rate} of the rows that started in
        [t_lo, horizon), and completed_qps: the successes done in it."""
        if not self._cols:
            return {"requests": 0, "qps": 0.0, "p99_ms": None, "error_rate": 0.0, "pushback": 0.0,
                    "arrival_rate": 0.0, "completed_qps": 0.0}
        t, ok, lat, status = (np.concatenate([c[i] for c in self._cols]) for i in range(4))
        w = (t >= t_lo) & (t < horizon)
        n = int(w.sum())
        good = lat[w & ok & np.isfinite(lat)]
        span = max(horizon - t_lo, 1e-9)
        done = _done(t, lat)
        return {"requests": n, "qps": float((w & ok).sum()) / span, "arrival_rate": n / span,
                "completed_qps": float((ok & (done >= t_lo) & (done < horizon)).sum()) / span,
                "p99_ms": float(np.quantile(good, P99)) if len(good) else None,
                "error_rate": float((w & ~ok).sum()) / n if n else 0.0,
                "pushback": float((w & np.isin(status, (429, 503))).sum()) / n if n else 0.0}


def _done(t_start: np.ndarray, latency_ms: np.ndarray) -> np.ndarray:
    """When each request was done (its start where the latency is unknown)."""
    return t_start + np.where(np.isfinite(latency_ms), latency_ms, 0.0) / 1000.0
