"""The knee's interval at the run's own noise reaches every reader: summary.md's verdict, compare's
knee line and the run history's list of runs."""

from __future__ import annotations

from kneeswarm.analysis.reports.compare_report import shift_line
from kneeswarm.analysis.reports.history_report import group_markdown
from kneeswarm.analysis.reports.sections import noise_text, verdict
from kneeswarm.analysis.runs.compare import shift_of


def test_the_verdict_says_the_knee_with_its_interval():
    steps = [{"users": u, "qps": q, "p99_ms": 50.0, "valid": True} for u, q in ((1, 10.0), (2, 19.0), (4, 30.0))]
    summary = {"steps": steps, "knee": {"users": 2, "qps": 19.0, "interval": [1, 4], "stability": 0.6},
               "peak": {"users": 4, "qps": 30.0}}
    assert "stopped scaling at 2 users (1–4 users at this run's noise)" in verdict(summary)
    assert noise_text({"users": 2, "interval": [2, 2], "stability": 0.97}) == \
        " (the same knee in 97% of resamples of its steps)"
    assert noise_text({"users": 2, "interval": [2, None]}) == " (2 users or past the tested range at this run's noise)"
    assert noise_text({"users": 2}) == ""  # a summary written before the interval existed


def test_compare_names_each_runs_knee_with_its_interval():
    line = shift_line("Knee", shift_of({"users": 2, "qps": 19.0, "interval": [1, 4]},
                                       {"users": 4, "qps": 30.0, "interval": [4, None]}))
    assert "2 users (1-4 at its noise)" in line and "4 users (4-past the range at its noise)" in line
    assert "at its noise" not in shift_line("Knee", shift_of({"users": 2, "qps": 19.0}, {"users": 4, "qps": 30.0}))


def test_the_history_lists_each_runs_knee_with_its_interval():
    runs = [{"run_id": "a", "started": 1.0, "knee_users": 4.0, "knee_interval": [2, 8]},
            {"run_id": "b", "started": 2.0, "knee_users": None, "knee_interval": [8, None]},
            {"run_id": "c", "started": 3.0, "knee_users": 4.0}]
    text = "\n".join(group_markdown({"plan": "p", "target": "t", "runs": runs, "left_out": [], "series": []}))
    assert "- `a`: 4 [2-8]" in text and "- `b`: none [8-past the range]" in text and "`c`:" not in text
