"""kneeswarm.analysis.measure.workers.lost_worker_reasons: which steps a worker lost mid-run affected (pure data;
the real kill -9 run is tests/test_distributed.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kneeswarm.analysis.measure.workers import lost_worker_reasons

# three steps: ramp at 0/10/20 s, steady windows [2, 10), [12, 20), [22, 30)
STATS = pd.DataFrame({"index": [0, 1, 2], "t_ramp": [0.0, 10.0, 20.0], "t_lo": [2.0, 12.0, 22.0],
                      "t_hi": [10.0, 20.0, 30.0]})


def flagged(last_heard: float, missing: float) -> list[int]:
    meta = {"workers_lost": [{"worker": "worker-1", "t": missing, "t_last_heard": last_heard, "workers_before": 3}]}
    reasons = lost_worker_reasons(STATS, meta, t0=0.0)
    return [i for i, r in enumerate(reasons) if r]


def test_a_loss_inside_a_step_flags_that_step_only():
    assert flagged(14.0, 18.0) == [1]


def test_a_loss_declared_after_the_next_ramp_flags_both_steps():
    # quiet from 19 s, declared missing at 23 s: step 2's users were dispatched to it too
    assert flagged(19.0, 23.0) == [1, 2]


def test_a_loss_declared_before_a_ramp_leaves_that_step_to_the_others():
    assert flagged(5.0, 9.5) == [0]
    assert flagged(10.5, 11.0) == [1]  # during step 1's ramp, before its window: step 1 ran with fewer


def test_the_reason_names_the_worker_the_time_and_the_workers_left():
    meta = {"workers_lost": [{"worker": "worker-1", "t": 1_800_000_018.0, "t_last_heard": 1_800_000_014.0,
                              "workers_before": 3}]}
    stats = STATS.assign(t_ramp=STATS["t_ramp"] + 1.8e9, t_lo=STATS["t_lo"] + 1.8e9, t_hi=STATS["t_hi"] + 1.8e9)
    (reason,) = lost_worker_reasons(stats, meta, t0=1.8e9)[1]
    assert reason.startswith("worker worker-1 lost at 08:00:14Z (t+14s)")
    assert "declared missing at 08:00:18Z" in reason and "2 of 3 workers" in reason
    assert "last report" not in reason  # not said when the master did not note it
    meta["workers_lost"][0]["t_last_report"] = 1_800_000_013.0  # its rows ride on its reports
    (reason,) = lost_worker_reasons(stats, meta, t0=1.8e9)[1]
    assert "what it sent after its last report (08:00:13Z) never reached the master" in reason


def test_no_loss_no_reason_and_bad_entries_are_ignored():
    assert lost_worker_reasons(STATS, {}, 0.0) == [[], [], []]
    bad = {"workers_lost": [{"worker": "w"}, "x", {"t": 3.0}]}
    assert lost_worker_reasons(STATS, bad, np.nan) == [[], [], []]


def test_rows_per_worker_and_step_match_numpy(tmp_path):
    """Rows of three workers over three windows in two parts, with rows stamped with another step
    inside a window (left out, as in the step's own statistics) and rows between windows."""
    from kneeswarm.analysis.measure.workers import count_rows
    from kneeswarm.contracts.rundir import RunDir

    rd = RunDir.create(tmp_path, "w")
    rng = np.random.default_rng(1)
    n = 20_000
    t = rng.uniform(0, 32, n)
    step = np.clip(np.floor(t / 10), 0, 2).astype(np.int32)
    step[rng.random(n) < 0.05] = 1  # some rows stamped with step 1 wherever they are
    worker = rng.choice(["worker-0", "worker-1", "worker-2"], n)
    for k, part in enumerate(np.array_split(np.arange(n), 2)):
        rd.write_request_part({"t_start": t[part], "step": step[part], "worker": worker[part].tolist()}, k)
    total, per_step = count_rows(rd, STATS)
    assert dict(total) == {w: int((worker == w).sum()) for w in np.unique(worker)}
    for i, row in STATS.iterrows():
        inside = (t >= row["t_lo"]) & (t < row["t_hi"]) & (step == row["index"])
        assert dict(per_step[i]) == {w: int((inside & (worker == w)).sum()) for w in np.unique(worker[inside])}


def test_a_worker_that_answered_again_says_when():
    meta = {"workers_lost": [{"worker": "worker-1", "t": 18.0, "t_last_heard": 14.0, "workers_before": 2,
                              "t_back": 25.0}]}
    (reason,) = lost_worker_reasons(STATS, meta, t0=0.0)[1]
    assert reason.endswith("(it answered again at 00:00:25Z)") and "1 of 2 workers" in reason
