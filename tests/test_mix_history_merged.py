"""The history per class of a repeated run and of a soak: each indexed as its whole is.

The runs are tests/test_mix_history.py's copies of the real fixture run, their ``mix`` written by
the test; a repeated run is merged by the real merge (kneeswarm.analysis.runs.repeat.write_repeat,
which reads the copies' request rows).  Expected values come from the summaries as written, read
back here: the runs' mean and Student's t interval (numpy, scipy) for a repeated run's point, the
windows' median and Theil–Sen slope (numpy, scipy) for a soak's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from tests.test_mix_history import SLOW_P99_AT_2, _class_of, _figure, _group, _with_mix, make_runs

from kneeswarm.analysis.runs.history import run_history
from kneeswarm.analysis.runs.repeat import write_repeat
from kneeswarm.contracts.rundir import REPEAT_JSON


def _summaries(runs: list[Path]) -> list[dict[str, Any]]:
    return [json.loads((d / "report" / "summary.json").read_text()) for d in runs]


def _with_intervals(summary: dict[str, Any], i: int) -> None:
    """The mix of test_mix_history, each class's knees given intervals as an analysis writes them."""
    _with_mix(summary, i)
    for c in summary["mix"]["classes"]:
        c["knee"]["interval"] = [1, 2 + i % 2]
        c["latency_knee"]["took_off_interval"] = [2, None] if c["latency_knee"]["took_off_users"] else None


def t_interval(values: list[float]) -> list[float]:
    n = len(values)
    half = stats.t.ppf(0.975, n - 1) * np.std(values, ddof=1) / math.sqrt(n)
    return [max(0.0, float(np.mean(values) - half)), float(np.mean(values) + half)]


def test_a_repeated_run_s_classes_are_one_point_with_the_interval_between_its_runs(tmp_path):
    root = tmp_path / "runs"
    singles = make_runs(root / "single", 2, _with_intervals)
    def member(s: dict[str, Any], i: int) -> None:
        _with_intervals(s, i + 2)
        s["knee"]["interval"] = [1, 9 + i]  # each run's own: none of them is the series' interval

    members = make_runs(root / "series", 4, member)
    for k, d in enumerate(members):  # the series after the single runs
        meta = json.loads((d / "meta.json").read_text())
        (d / "meta.json").write_text(json.dumps({**meta, "started": meta["started"] + 3600 + 60 * k}))
    folder = root / "series" / "20260101T000000Z-fixture-repeat"
    write_repeat(folder, "fixture", members)
    rep = json.loads((folder / REPEAT_JSON).read_text())
    written = [{c["name"]: c for c in s["mix"]["classes"]} for s in _summaries(members)]
    slow = next(c for c in rep["classes"] if c["name"] == "slow")
    assert slow["runs"] == 4
    at_2 = next(s for s in slow["steps"] if s["users"] == 2)
    truth = [next(st["p99_ms"] for st in w["slow"]["steps"] if st["users"] == 2) for w in written]
    assert at_2["p99_ms"]["values"] == truth and at_2["p99_ms"]["mean"] == pytest.approx(np.mean(truth))
    assert at_2["p99_ms"]["between"] == pytest.approx(t_interval(truth))
    # its knees per repetition and their spread: the QPS knee 2 in every run, its P99 took off in one
    assert slow["knee"]["users"] == [w["slow"]["knee"]["users"] for w in written] == [2, 2, 2, 2]
    assert slow["knee"]["intervals"] == [w["slow"]["knee"]["interval"] for w in written]
    assert slow["knee"]["overlap"] == [1, 2]  # [1, 2] and [1, 3] both hold 1-2
    assert slow["latency_knee"]["users"] == [w["slow"]["latency_knee"]["took_off_users"] for w in written]
    assert slow["latency_knee"]["text"] == "P99 took off at 2 users in 3 of 4 runs; 1 found none"
    md = (folder / "repeat.md").read_text()
    assert "### Each class over the runs" in md and "**class slow** (4 runs): knee 2 users in 4 of 4 runs" in md

    result, _ = run_history([root], out=str(tmp_path / "out"))
    g = _group(result)
    assert [r["run_id"] for r in g["runs"]] == [d.name for d in singles] + [folder.name]  # one point, not four
    # the whole's knee of the series: its spread over the runs (repeat.knee), not its first run's own interval
    assert "knee_interval" not in g["runs"][-1] and g["runs"][-1]["repeat"]["knee"]["lo"] == rep["knee"]["lo"]
    c = _class_of(g, "slow")
    assert c["gaps"] == []
    p99 = _figure(c, "p99_ms at 2 users")
    single_truth = [next(st["p99_ms"] for st in w["slow"]["steps"] if st["users"] == 2)
                    for w in ({x["name"]: x for x in s["mix"]["classes"]} for s in _summaries(singles))]
    assert p99["values"] == pytest.approx(single_truth + [np.mean(truth)])
    assert p99["intervals"][:2] == [None, None] and p99["intervals"][2] == pytest.approx(t_interval(truth))
    peaks = [max(st["qps"] for st in w["slow"]["steps"] if st["valid"]) for w in written]
    assert _figure(c, "peak QPS")["values"][2] == pytest.approx(np.mean(peaks))
    assert _figure(c, "peak QPS")["intervals"][2] == pytest.approx(t_interval(peaks))
    assert c["knee_users"] == [2, 2, 2] and c["knee_interval"] == [[1, 2], [1, 3], [2, 2]]
    assert c["latency_knee_users"][2] == 2 and c["latency_knee_interval"][2] == [2, None]  # one run found none
    md = (tmp_path / "out" / "history.md").read_text()
    assert f"| `{folder.name}` |" in md and "| 2 (–) [2-2] | 2 [2-past the range] |" in md
    # a repeated run merged before its classes were (its repeat.json without them): a gap, said
    (folder / REPEAT_JSON).write_text(json.dumps({k: v for k, v in rep.items() if k != "classes"}))
    result, _ = run_history([root], out=str(tmp_path / "out2"))
    c = _class_of(_group(result), "slow")
    assert c["gaps"] == [{"run": folder.name, "reason": "a repeated run merged before its classes were "
                                                        "(`kneeswarm analyze` on its folder merges them)"}]
    assert _figure(c, "p99_ms at 2 users")["values"][2] is None


WINDOWS = 8
WINDOW_S = 30.0


def _soak(summary: dict[str, Any], i: int) -> None:
    """A soak of 8 windows at 2 users; class slow's P99 creeping 5 % a window, cheap's flat; the
    sixth window not valid."""
    first = summary["steps"][1]
    summary["steps"] = [{**first, "index": w, "users": 2, "valid": w != 5} for w in range(WINDOWS)]
    summary["soak"] = {"users": 2, "windows": WINDOWS, "window_s": WINDOW_S, "duration_s": WINDOWS * WINDOW_S,
                       "series": {"t": [WINDOW_S * (w + 0.5) for w in range(WINDOWS)]}, "trends": {"client": {}}}
    rng = np.random.default_rng(i)

    def steps(p99: list[float]) -> list[dict[str, Any]]:
        return [{"index": w, "users": 2, "valid": w != 5, "requests": 3000, "ok": 3000, "qps": 50.0 + rng.normal(),
                 "p50_ms": 10.0, "p95_ms": 15.0, "p99_ms": p} for w, p in enumerate(p99)]

    summary["mix"] = {"classes": [
        {"name": "cheap", "share": 0.5, "steps": steps(list(20.0 + rng.normal(0, 0.3, WINDOWS)))},
        {"name": "slow", "share": 0.5, "steps": steps([80.0 * 1.05 ** w for w in range(WINDOWS)])}]}


def test_a_soak_s_classes_are_its_windows_medians_and_their_trends(tmp_path):
    runs = make_runs(tmp_path / "runs", 1, _soak, lambda text, i: text.replace('mode = "grid"', 'mode = "soak"'))
    result, _ = run_history([tmp_path / "runs"], out=str(tmp_path / "out"))
    g = _group(result)
    assert g["soak"] is True
    (summary,) = _summaries(runs)
    for c in summary["mix"]["classes"]:
        got = _class_of(g, c["name"])
        valid = [s for s in c["steps"] if s["valid"]]
        assert _figure(got, "p99_ms at 2 users (windows' median)")["values"] == [float(np.median([s["p99_ms"] for s in valid]))]
        assert _figure(got, "QPS (windows' median)")["values"] == [float(np.median([s["qps"] for s in valid]))]
        assert got["knee_users"] == [None] and got["gaps"] == []
        (trends,) = got["trends"]
        t = [summary["soak"]["series"]["t"][s["index"]] for s in valid]
        slope = stats.theilslopes([s["p99_ms"] for s in valid], t)[0]
        assert trends["p99_ms"]["slope"] == pytest.approx(slope)
        assert trends["p99_ms"]["drifting"] is (c["name"] == "slow")  # slow crept 5 % a window, cheap held
    md = (tmp_path / "out" / "history.md").read_text()
    assert "### class slow" in md and f"- `{runs[0].name}` windows: qps" in md and "drifting worse" in md
