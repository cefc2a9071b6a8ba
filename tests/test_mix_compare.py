"""Two mixes compared class by class: each class's point figures at the steps valid in both."""

from __future__ import annotations

import pytest

from kneeswarm.analysis.reports.mix_report import classes_lines
from kneeswarm.analysis.runs.compare_classes import classes_change


def summary(slow_p99: list[float], took_off: int | None) -> dict:
    steps = lambda p99s, valid=(True, True, True): [  # noqa: E731
        {"users": u, "qps": 10.0 * u, "p99_ms": p, "valid": v} for u, p, v in zip((1, 2, 4), p99s, valid)]
    return {"mix": {"classes": [
        {"name": "cheap", "steps": steps([5.0, 5.0, 6.0]), "latency_knee": {"took_off_users": None}, "knee": {"users": 4}},
        {"name": "slow", "steps": steps(slow_p99, (True, True, False)), "latency_knee": {"took_off_users": took_off},
         "knee": {"users": 2}}]}}


def test_each_class_s_change_at_the_steps_valid_in_both():
    got = classes_change(summary([40.0, 50.0, 90.0], 4), summary([40.0, 100.0, 300.0], 2))
    assert [c["name"] for c in got] == ["cheap", "slow"]
    slow = got[1]
    assert [s["users"] for s in slow["steps"]] == [1, 2]  # 4 users is not valid
    assert slow["steps"][1]["p99_ms"] == [50.0, 100.0] and slow["steps"][1]["p99_rel"] == pytest.approx(1.0)
    assert slow["latency_knee"] == [4, 2]
    text = "\n".join(classes_lines(got))
    assert "| slow | 2 | 20.0 | 20.0 | +0.0% | 50.0 | 100.0 | +100.0% |" in text


def test_no_mix_on_either_side_no_classes():
    assert classes_change({}, summary([1.0, 1.0, 1.0], None)) == []
