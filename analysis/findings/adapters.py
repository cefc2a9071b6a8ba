"""An adapter set larger than the server keeps loaded (``adapters_over_capacity``).

An LLM server keeps at most K LoRA adapters loaded (vLLM ``--max-loras``: the adapters one batch
may run; SGLang and TGI have their own).  A mix that names more adapters makes the server swap
them: a request whose adapter is not loaded waits for a slot and for its load, and a load stalls
the engine step, so every adapter gets slower.  Two readings, each at a valid step:

* **the server's gauge**, where it exports vLLM's ``vllm:lora_requests_info{max_lora,
  running_lora_adapters, waiting_lora_adapters}`` (vllm/v1/metrics/loggers.py: one label set per
  state, its value the time it was last current, earlier states left in the exposition with older
  times).  Between two scrapes every label set whose time moved was a state of that interval.  At
  a step the server **ran more distinct adapters than its max_lora** (it cannot have kept them all
  loaded) and the cost shows: in at least ``WAIT_SHARE`` of the step's scrape intervals an adapter
  **waited while max_lora others ran** (a request of an adapter not running, the running set
  full: the wait vLLM's scheduler makes for the adapter limit, not for the KV cache), or the
  client's reading below holds there.  A server whose gauge says it ran no more adapters than its
  max_lora at a step is not over capacity there, whatever the client saw.
* **the client alone** (no such gauge): the requests whose adapter was **not recently used**
  are slower.  Each request's reuse distance is the number of other adapters asked for since its
  adapter was last asked for (requests in start order; an LRU of K slots misses exactly the
  requests of distance >= K).  At a step, per class (one adapter, one cost), the mean latency
  (``TRIM`` trimmed: a host's stall is not a swap) of its requests of distance >= m against those
  of distance < m; over the classes with
  ``MIN_GROUP`` of each, weighted by the smaller group: over capacity where the far requests took
  ``COLD_FACTOR`` x the near ones' and at least ``JUMP_FLOOR_MS`` more.  m is the distance in 1 ..
  (adapters - 1) at which latency jumps most from the distance below it, at the fewest users
  (:func:`loaded_estimate`): the run's estimate of how many adapters the server keeps, held fixed in the resamples; where the
  gauge says max_lora, m is that.

Judged against the run's noise as ``class_starved`` is: each step's rows (per class, far and near
apart) and its scrape intervals drawn again with replacement ``RESAMPLES`` times, the rule run on
each draw; kneeswarm.analysis.summary.classes splits confirmed from marginal.  ``misses`` in the
evidence replays the requests, in start order, through an LRU of max_lora (else the estimate)
slots, an adapter in use by a request in flight never the one out and never loaded again: an
estimate of the server's swaps (exact while no request waits for a slot; 6-12 % under the demo
target's count over 1-8 users on two slots, where requests wait and are let in out of their order).

Only for a mix of the ``openai`` protocol (the LLM servers' adapters) whose classes name at least
two adapters (models, or llama.cpp's per-request ``lora`` lists).
"""

from __future__ import annotations

import heapq
import json
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import trim_mean

from kneeswarm.analysis.findings.context import users_text
from kneeswarm.analysis.schema.summary import Finding

logger = logging.getLogger(__name__)

WAIT_SHARE = 0.25  # an adapter waited for a slot in at least this share of a step's scrape intervals
COLD_FACTOR = 1.25  # far requests' mean latency at least this many times the near ones' (a swap of
#                     30 ms on 26 ms requests: 2.1 x at one user; without swaps: 1.0 x)
TRIM = 0.10  # the means cut this share of each group's rows at either end: a mean, not a median, since a
#              swap's stall makes the near requests' latencies two-moded (stalled or not), where a median
#              jumps from one mode to the other between resamples
JUMP_FLOOR_MS = 2.0  # ... and at least this many ms more (sub-ms requests' noise is not a swap)
MIN_GROUP = 10  # rows of a class, far and near each, at a step for it to count
RESAMPLES = 200
PROTOCOLS = ("openai",)
LORA_INFO = re.compile(r"^vllm:lora_requests_info\{(?P<labels>.*)\}$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class LoraState:
    """One label set of ``vllm:lora_requests_info``."""

    max_lora: int
    running: frozenset[str]
    waiting: frozenset[str]

    @property
    def waits_for_slot(self) -> bool:
        """An adapter waited that could not run: not running, the running set full."""
        return bool(self.waiting - self.running) and len(self.running) >= self.max_lora


@dataclass
class GaugeSteps:
    """The gauge read over each step's window."""

    max_lora: int
    in_use: list[set[str]]  # adapters the server ran or queued in the step
    waited: list[np.ndarray]  # per scrape interval in the step: an adapter waited for a slot


@dataclass
class Evidence:
    adapters: int  # distinct adapters the mix's classes name
    classes: dict[str, str]  # class -> its adapter
    max_lora: int | None = None
    loaded_estimate: int | None = None
    misses: int | None = None
    per_step: list[dict[str, object]] = field(default_factory=list)


def class_adapters(plan: dict[str, object]) -> dict[str, str]:
    """{class: its adapter} (the class's model, with its llama.cpp ``lora`` list where it has one), or
    {} where the plan is not an openai mix."""
    request = plan.get("request")
    if plan.get("protocol") not in PROTOCOLS or not isinstance(request, dict) or not isinstance(request.get("classes"), list):
        return {}
    out = {}
    for t in request["classes"]:
        if isinstance(t, dict):
            model = str(t.get("model", request.get("model", "")))
            lora = t.get("lora", request.get("lora"))
            out[str(t.get("name"))] = model + (f" lora={json.dumps(lora, sort_keys=True)}" if lora is not None else "")
    return out


def _labels(text: str) -> dict[str, str]:
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(text)}


def _names(text: str) -> frozenset[str]:
    return frozenset(n for n in text.split(",") if n)


def gauge_columns(prometheus: pd.DataFrame | None) -> dict[str, LoraState]:
    """{column: its state} of the scraped ``vllm:lora_requests_info`` label sets; a label set that is
    not one (no max_lora, or not a number) is left out with one warning."""
    out: dict[str, LoraState] = {}
    bad: list[str] = []
    for col in prometheus.columns if prometheus is not None else []:
        m = LORA_INFO.match(str(col))
        if m is None:
            continue
        labels = _labels(m.group("labels"))
        try:
            k = int(labels["max_lora"])
            if k < 1:
                raise ValueError(k)
        except (KeyError, ValueError):
            bad.append(str(col))
            continue
        out[str(col)] = LoraState(k, _names(labels.get("running_lora_adapters", "")),
                                  _names(labels.get("waiting_lora_adapters", "")))
    if bad:
        logger.warning("adapters: %d vllm:lora_requests_info label set(s) without a max_lora >= 1 left out (%s)",
                       len(bad), bad[0][:200])
    return out


def read_gauge(prometheus: pd.DataFrame | None, stats: pd.DataFrame) -> GaugeSteps | None:
    """The gauge over each step's steady window, or None where the server exports none."""
    states = gauge_columns(prometheus)
    if not states or prometheus is None or "t" not in prometheus.columns:
        return None
    t = pd.to_numeric(prometheus["t"], errors="coerce").to_numpy(dtype=float)
    cols = list(states)
    values = prometheus[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float, copy=True)
    values[~np.isfinite(values)] = np.nan
    if np.isnan(values).all():
        logger.warning("adapters: vllm:lora_requests_info holds no number (%d label sets); the gauge is not read",
                       len(cols))
        return None
    seen: list[list[LoraState]] = []  # per scrape: the states of the interval before it
    prev = np.full(len(cols), np.nan)
    for row in values:
        with np.errstate(invalid="ignore"):
            moved = np.isfinite(row) & ~(row <= prev)  # new, or its time moved on (a NaN prev: new)
        now = [states[cols[j]] for j in np.flatnonzero(moved)]
        if np.isfinite(row).any():
            now.append(states[cols[int(np.nanargmax(row))]])  # the state current at the scrape
        seen.append(now)
        prev = np.where(np.isfinite(row), row, prev)
    max_lora = max(s.max_lora for s in states.values())
    in_use: list[set[str]] = []
    waited: list[np.ndarray] = []
    for lo, hi in zip(stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)):
        inside = [i for i in range(1, len(t)) if np.isfinite(t[i]) and lo < t[i] <= hi]
        in_use.append({a for i in inside for s in seen[i] for a in s.running | s.waiting})
        waited.append(np.array([any(s.waits_for_slot for s in seen[i]) for i in inside], dtype=bool))
    return GaugeSteps(max_lora, in_use, waited)


def reuse_distance(keys: list[str]) -> np.ndarray:
    """Per request (start order), the adapters asked for since its adapter last was; a first request
    gets the number of distinct adapters (farther than any)."""
    recent: list[str] = []  # most recent first
    total = len(set(keys))
    out = np.empty(len(keys), dtype=float)
    for i, k in enumerate(keys):
        if k in recent:
            out[i] = recent.index(k)
            recent.remove(k)
        else:
            out[i] = total
        recent.insert(0, k)
    return out


def lru_misses(keys: list[str], slots: int, start: np.ndarray | None = None, end: np.ndarray | None = None) -> int:
    """Requests (start order) that an LRU of ``slots`` adapters would have had to load.  With their
    ``start`` and ``end`` times, as a server must: a request whose adapter another request in flight
    holds loads nothing (it joins it, or waits with it and is let in with it), and the adapter out
    is the least recently used that no request in flight holds (else the least recently used)."""
    kept: OrderedDict[str, None] = OrderedDict()
    flight: list[tuple[float, str]] = []  # (end, adapter) of the requests started, a heap
    held: dict[str, int] = {}
    misses = 0
    for i, k in enumerate(keys):
        busy = False
        if start is not None and end is not None:
            while flight and flight[0][0] <= start[i]:
                _, done = heapq.heappop(flight)
                held[done] -= 1
            busy = held.get(k, 0) > 0
            heapq.heappush(flight, (float(end[i]), k))
            held[k] = held.get(k, 0) + 1
        if k in kept:
            kept.move_to_end(k)
            continue
        if busy:
            continue
        misses += 1
        if len(kept) >= slots:
            victim = next((n for n in kept if not held.get(n)), next(iter(kept)))
            del kept[victim]
        kept[k] = None
    return misses


Groups = list[dict[str, tuple[np.ndarray, np.ndarray]]]  # per step: {class: (far latencies, near latencies)}


def _groups(rows: pd.DataFrame, stats: pd.DataFrame, distance: np.ndarray, m: int) -> Groups:
    t = rows["t_start"].to_numpy(dtype=float)
    ok = rows["ok"].fillna(False).to_numpy(dtype=bool)
    lat = rows["latency_ms"].to_numpy(dtype=float)
    cls = rows["class"].to_numpy()
    out: Groups = []
    for lo, hi in zip(stats["t_lo"].to_numpy(dtype=float), stats["t_hi"].to_numpy(dtype=float)):
        inside = (t >= lo) & (t < hi) & ok & np.isfinite(lat)
        step = {}
        for c in sorted(set(cls[inside])):
            mine = inside & (cls == c)
            step[str(c)] = (lat[mine & (distance >= m)], lat[mine & (distance < m)])
        out.append(step)
    return out


def _jump(step: dict[str, tuple[np.ndarray, np.ndarray]], draw: np.random.Generator | None
          ) -> tuple[float, float, list[str]] | None:
    """(far mean, near mean, the classes weighed), weighted over the classes with enough of both."""
    far_sum = near_sum = weight = 0.0
    used = []
    for c, (far, near) in step.items():
        if len(far) < MIN_GROUP or len(near) < MIN_GROUP:
            continue
        if draw is not None:
            far, near = far[draw.integers(0, len(far), len(far))], near[draw.integers(0, len(near), len(near))]
        w = float(min(len(far), len(near)))
        far_sum += w * float(trim_mean(far, TRIM))
        near_sum += w * float(trim_mean(near, TRIM))
        weight += w
        used.append(c)
    return (far_sum / weight, near_sum / weight, used) if weight else None


def loaded_estimate(rows: pd.DataFrame, stats: pd.DataFrame, distance: np.ndarray, judged: list[int], n: int) -> int | None:
    """The adapters the server seems to keep: the reuse distance m at which latency jumps most, the
    requests at distance m against those at m - 1 (at n - 1: m or more), each request's latency over
    its class's own in the step (a trimmed mean), at the first judged step (the fewest users) where
    some split has ``MIN_GROUP`` requests on both sides; None where none has.  Adjacent distances,
    not all below against all above: every swap stalls the running requests too, so the near
    side's latency rises with the swaps around it, and a split below K can show the larger ratio.
    The fewest users: where requests wait for a slot, the longer an adapter was unused the longer
    it waits, and the jump past K is no longer the largest."""
    t = rows["t_start"].to_numpy(dtype=float)
    ok = rows["ok"].fillna(False).to_numpy(dtype=bool)
    lat = rows["latency_ms"].to_numpy(dtype=float)
    cls = rows["class"].to_numpy()
    for i in sorted(judged, key=lambda i: float(stats["users"].iloc[i])):
        lo, hi = float(stats["t_lo"].iloc[i]), float(stats["t_hi"].iloc[i])
        inside = (t >= lo) & (t < hi) & ok & np.isfinite(lat)
        rel = np.full(len(rows), np.nan)
        for c in set(cls[inside]):
            mine = inside & (cls == c)
            if mine.sum() >= MIN_GROUP and (base := float(trim_mean(lat[mine], TRIM))) > 0:
                rel[mine] = lat[mine] / base
        known = np.isfinite(rel)
        best, best_m = -np.inf, None
        for m in range(1, n):
            far = rel[known & ((distance == m) if m < n - 1 else (distance >= m))]
            near = rel[known & (distance == m - 1)]
            if len(far) >= MIN_GROUP and len(near) >= MIN_GROUP and (jump := float(trim_mean(far, TRIM) - trim_mean(near, TRIM))) > best:
                best, best_m = jump, m
        if best_m is not None:
            return best_m
    return None


def _client_found(j: tuple[float, float, list[str]] | None) -> bool:
    return j is not None and j[1] > 0 and j[0] >= COLD_FACTOR * j[1] and j[0] - j[1] >= JUMP_FLOOR_MS


def _found(groups: Groups, gauge: GaugeSteps | None, judged: list[int], draw: np.random.Generator | None) -> list[int]:
    """The judged step positions where the rule holds (on resampled rows and intervals with ``draw``)."""
    out = []
    for i in judged:
        if gauge is not None and len(gauge.in_use[i]) <= gauge.max_lora:
            continue  # the server ran no more adapters than it keeps loaded
        cost = _client_found(_jump(groups[i], draw))
        if not cost and gauge is not None and len(w := gauge.waited[i]):
            if draw is not None:
                w = w[draw.integers(0, len(w), len(w))]
            cost = float(w.mean()) >= WAIT_SHARE
        if cost:
            out.append(i)
    return out


def over_capacity_support(rows: pd.DataFrame | None, stats: pd.DataFrame, plan: dict[str, object],
                          prometheus: pd.DataFrame | None, seed: int = 0
                          ) -> tuple[float, list[int], Evidence] | None:
    """(share of the RESAMPLES draws in which the rule held at some judged step, the step positions it
    held at on the measured figures, its evidence), or None where the rule does not apply (not an
    openai mix of two adapters or more, no rows)."""
    adapters = class_adapters(plan)
    if len(set(adapters.values())) < 2 or rows is None or rows.empty:
        return None
    rows = rows.loc[rows["class"].isin(list(adapters))].sort_values("t_start", kind="stable").reset_index(drop=True)
    if rows.empty:
        return None
    keys = [adapters[c] for c in rows["class"]]
    distance = reuse_distance(keys)
    judged = [i for i, v in enumerate(stats["valid"]) if bool(v)]
    gauge = read_gauge(prometheus, stats)
    n = len(set(adapters.values()))
    estimate = loaded_estimate(rows, stats, distance, judged, n)
    best_m = estimate or 1
    m = gauge.max_lora if gauge is not None and gauge.max_lora < n else best_m  # the server's own K where it says it
    groups = _groups(rows, stats, distance, m)
    point = _found(groups, gauge, judged, None)
    rng = np.random.default_rng(seed)
    hits = sum(bool(_found(groups, gauge, judged, rng)) for _ in range(RESAMPLES))
    ev = Evidence(adapters=n, classes=dict(sorted(adapters.items())), loaded_estimate=estimate)
    ev.max_lora = gauge.max_lora if gauge is not None else None
    start = rows["t_start"].to_numpy(dtype=float)
    end = start + pd.to_numeric(rows["latency_ms"], errors="coerce").fillna(0.0).to_numpy(dtype=float) / 1000.0
    ev.misses = lru_misses(keys, ev.max_lora or best_m, start, end)
    for i in range(len(stats)):
        j = _jump(groups[i], None)
        step: dict[str, object] = {"users": _users(stats["users"].iloc[i]), "far_ms": _r(j[0]) if j else None,
                                   "near_ms": _r(j[1]) if j else None, "far_share": _far_share(groups[i])}
        if gauge is not None:
            step["adapters_in_use"] = len(gauge.in_use[i])
            step["wait_share"] = _r(float(gauge.waited[i].mean())) if len(gauge.waited[i]) else None
        ev.per_step.append(step)
    return hits / RESAMPLES, point, ev


def _users(u: object) -> int | float:
    f = float(u)  # type: ignore[arg-type]
    return int(f) if f.is_integer() else f


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")


def _far_share(step: dict[str, tuple[np.ndarray, np.ndarray]]) -> float | None:
    far = sum(len(f) for f, _ in step.values())
    total = far + sum(len(n) for _, n in step.values())
    return _r(far / total) if total else None


def finding(support: float, at: list[int], ev: Evidence) -> Finding:
    """The ``adapters_over_capacity`` finding, held at step positions ``at``."""
    users: list[int | float] = [u for i in at if i < len(ev.per_step) and isinstance(u := ev.per_step[i]["users"], (int, float))]
    first = ev.per_step[at[0]] if at else {}
    kept = ev.max_lora if ev.max_lora is not None else ev.loaded_estimate
    told = (f"the server runs at most {ev.max_lora} at once (vllm:lora_requests_info max_lora)" if ev.max_lora is not None
            else f"the server seems to keep about {ev.loaded_estimate} loaded (the requests whose adapter was not among "
                 f"the last {ev.loaded_estimate} asked for are the slow ones)")
    seen = []
    if first.get("far_ms") is not None:
        seen.append(f"from {users_text(first['users'])} on, requests whose adapter was not recently used took "
                    f"{first['far_ms']} ms (trimmed mean) against {first['near_ms']} ms")
    waited = next((s for i, s in enumerate(ev.per_step) if i in at and float(s.get("wait_share") or 0) >= WAIT_SHARE), None)  # type: ignore[arg-type]
    if waited is not None:
        seen.append(f"from {users_text(waited['users'])} on, an adapter waited for a slot while {ev.max_lora} others ran "
                    f"in {100 * float(waited['wait_share']):.0f} % of the scrapes")  # type: ignore[arg-type]
    evidence: dict[str, object] = {"adapters": ev.adapters, "max_lora": ev.max_lora, "loaded_estimate": ev.loaded_estimate,
                                   "misses": ev.misses, "from_users": users[0] if users else None}
    for key in ("far_ms", "near_ms", "far_share", "adapters_in_use", "wait_share"):  # {users: value} per step
        per = {str(s["users"]): s[key] for s in ev.per_step if s.get(key) is not None}
        evidence[key] = per or None
    return {
        "id": "adapters_over_capacity", "severity": "warning", "steps": users,
        "evidence": {k: v for k, v in evidence.items() if v is not None},
        "support": round(support, 3),
        "text": (f"the mix asks for {ev.adapters} adapters and {told}: adapters are swapped in and out"
                 + ("; " + "; ".join(seen) if seen else "") + "."),
        "advice": (f"keep every adapter of the mix loaded: raise the server's adapter slots to {ev.adapters} or more "
                   f"(vLLM --max-loras, and --max-cpu-loras so none is read from disk again; "
                   f"{kept if kept is not None else 'fewer'} now), or serve fewer adapters per replica, or route each "
                   "adapter to the replicas that keep it loaded"),
    }
