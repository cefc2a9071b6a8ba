"""The findings of a traffic mix: a class starved by the others (``class_starved``).

A class is starved where the server serves the others before it: a priority scheduler, a batch
that prefers short requests, an adapter that waits for its turn to be loaded.  Two signs, each
at a valid step beyond the first:

* **latency**: its tail took off (above ``LATENCY_KNEE_FACTOR`` x its own at the first step where
  every class has ``MIN_ROWS``, the knee's own factor) while the others' held: it rose by
  ``STARVED_RISE`` x more milliseconds than the most any other class's rose.  The tail is read
  at the P90, not the P99: a P99 of a few hundred rows is its third-largest row, and one stall of
  the loaded test host moved one class's P99 by 100-200 ms on a fair server and at a base step
  (a starved class's P99 that "did not take off" from an inflated base); the P90's ten percent
  are steadier.  Milliseconds, not ratios: on shared slots
  served in arrival order every class waits the same, so their P99s rise by the same
  milliseconds (a cheap class's relatively more) and the rule stays silent; it speaks when one
  class's waiting is its own.
* **answers**: its share of the step's answered requests fell below ``1 - SHARE_DROP`` of its
  share of the step's requests (its requests time out or fail while the others' are answered).

Judged against the run's noise like the other findings: the rows of each class in each step are
drawn again with replacement ``RESAMPLES`` times and the rule run on each draw (``starved_support``);
kneeswarm.analysis.summary.classes splits confirmed from marginal by confidence.py's CONFIRM and NOTICE.  A class that waits
on instances of its own (a model with its own slots, saturated) shows the same latency sign: the
text says both readings.
"""

from __future__ import annotations

import logging

import numpy as np

from kneeswarm.analysis.measure.classes import ClassRows
from kneeswarm.analysis.models.knee import LATENCY_KNEE_FACTOR
from kneeswarm.analysis.schema.summary import ClassStep, Finding

logger = logging.getLogger(__name__)

STARVED_RISE = 2.0  # its P90 rose this many times the most any other class's (ms over each's base step); on
#                    shared FIFO slots the rises are equal (1 x), a priority queue's starved class rose 4-5 x
RISE_FLOOR_MS = 1.0  # the others' rise counts as at least this (a flat class is not a zero divisor)
SHARE_DROP = 0.20  # answered share below (1 - this) x the share sent: its answers are being lost
RESAMPLES = 200  # draws of each class's rows per step (a 95 % support is then known within ~3 %)
MIN_ROWS = 100  # a class-step with fewer answered rows is not judged (its P99 is its largest row or so: the
#                whole's own floor, [analysis] min_requests' default)


def _starved(p99: dict[str, list[float | None]], p90: dict[str, list[float | None]],
             sent: dict[str, list[float | None]], answered: dict[str, list[float | None]],
             judged: list[int]) -> dict[str, list[int]]:
    """{class: the steps (positions) where it was starved} on one set of per-class figures."""
    out: dict[str, list[int]] = {}
    if len(p99) < 2 or len(judged) < 2:
        return out
    known = [i for i in judged if all(p99[c][i] is not None and p90[c][i] is not None for c in p99)]
    if len(known) < 2:
        return out
    base = known[0]  # the first step where every class has its figures (enough rows): each class's own base
    for c in p99:
        for i in known[1:]:
            mine, first = p99[c][i], p99[c][base]
            rise, rise_base = p90[c][i], p90[c][base]
            others = [(p90[o][i], p90[o][base]) for o in p90 if o != c]
            latency = (mine is not None and first is not None and rise is not None and rise_base is not None
                       and all(a is not None and b is not None for a, b in others)
                       and rise > LATENCY_KNEE_FACTOR * rise_base
                       and rise - rise_base >= STARVED_RISE * max([RISE_FLOOR_MS] + [a - b for a, b in others]))  # type: ignore[operator]
            s, a = sent[c][i], answered[c][i]
            share = s is not None and a is not None and s > 0 and a < (1 - SHARE_DROP) * s
            if latency or share:
                out.setdefault(c, []).append(i)
    return out


Series = dict[str, list[float | None]]


def _figures(by_class: dict[str, list[ClassRows]], draw: np.random.Generator | None
             ) -> tuple[Series, Series, Series, Series]:
    """(P99, P90, share sent, share answered) per class and step; with ``draw``, of resampled rows."""
    p99: Series = {}
    p90: Series = {}
    oks: dict[str, list[np.ndarray]] = {}
    for c, steps in by_class.items():
        p99[c], p90[c], oks[c] = [], [], []
        for r in steps:
            lat, ok = r.latency_ok, r.ok
            if draw is not None:
                lat = lat[draw.integers(0, len(lat), len(lat))] if len(lat) else lat
                ok = ok[draw.integers(0, len(ok), len(ok))] if len(ok) else ok
            p99[c].append(float(np.percentile(lat, 99)) if len(lat) >= MIN_ROWS else None)
            p90[c].append(float(np.percentile(lat, 90)) if len(lat) >= MIN_ROWS else None)
            oks[c].append(ok)
    n_steps = len(next(iter(by_class.values()))) if by_class else 0
    sent: dict[str, list[float | None]] = {c: [] for c in by_class}
    answered: dict[str, list[float | None]] = {c: [] for c in by_class}
    for i in range(n_steps):
        n = sum(len(oks[c][i]) for c in by_class)
        n_ok = sum(int(oks[c][i].sum()) for c in by_class)
        for c in by_class:
            enough = n >= MIN_ROWS and n_ok >= MIN_ROWS
            sent[c].append(len(oks[c][i]) / n if enough else None)
            answered[c].append(int(oks[c][i].sum()) / n_ok if enough else None)
    return p99, p90, sent, answered


def starved_support(by_class: dict[str, list[ClassRows]], valid: list[bool],
                    seed: int = 0) -> dict[str, tuple[float, list[int]]]:
    """{class: (share of the RESAMPLES draws in which it was starved, the steps (positions) it was
    starved at on the measured figures)} for every class starved in either."""
    judged = [i for i, ok in enumerate(valid) if ok]
    point = _starved(*_figures(by_class, None), judged)
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for _ in range(RESAMPLES):
        for c in _starved(*_figures(by_class, rng), judged):
            counts[c] = counts.get(c, 0) + 1
    return {c: (counts.get(c, 0) / RESAMPLES, point.get(c, [])) for c in sorted(set(point) | set(counts))}


def finding(c: str, at: list[int], steps_of: dict[str, list[ClassStep]], support: float) -> Finding:
    """The ``class_starved`` finding of class ``c``, starved at step positions ``at``."""
    return _finding(c, at, steps_of.get(c, []), steps_of, support)


def _finding(c: str, at: list[int], steps: list[ClassStep], steps_of: dict[str, list[ClassStep]],
             support: float) -> Finding:
    users = [steps[i]["users"] for i in at if i < len(steps)]
    i = at[-1] if at else None
    evidence: dict[str, object] = {"class": c}
    if i is not None:
        evidence.update({f"p99_ms.{name}": [s[0].get("p99_ms"), s[i].get("p99_ms")] for name, s in steps_of.items()})
        evidence.update(share_sent=steps[i].get("share_sent"), share_answered=steps[i].get("share_answered"))
    return {
        "id": "class_starved", "severity": "warning", "steps": users, "evidence": evidence,
        "support": round(support, 3),
        "text": (f"class {c!r} is starved: its P99 took off while the other classes' held, or its share of the "
                 f"answers fell below its share of the requests (at {users or 'the resampled steps'} users)"),
        "advice": (f"the server serves the other classes before {c!r} (a priority or batching policy, an adapter "
                   "waiting to be loaded), or its own instances are saturated: give it capacity of its own, "
                   "or a fair share of the queue"),
    }
