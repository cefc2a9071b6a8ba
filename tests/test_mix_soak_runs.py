"""A soak of a traffic mix run for real (`kneeswarm run`, a Locust master and worker in their own
processes) against the demo target serving two models (cheap 5 ms, slow 40 ms, an instance each of
their own) whose every request it holds longer as the soak goes on (``--drift-ms-per-min``).

The truth is the target's: at one user nothing queues, so each class's latency is its model's
service time plus the target's drift, and the P50 of each class's windows rises by the drift's
rate (120 ms a minute: 2 ms a second).  The history indexes each class as the soak's whole: one
step of its windows' medians, no knee, and its windows' trends.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from conftest import read_summary, runs_against_targets, two_model_classes
from kneeswarm.analysis.runs.history import run_history

pytestmark = pytest.mark.long

DRIFT_MS_PER_MIN = 120.0  # 2 ms a second: the windows keep 30-40 requests a class
PLAN = """name = "{name}"
target = "{url}"
protocol = "kserve"
[load]
mode = "soak"
users = 1
duration = 14
window = 2
ramp = 1
settle = 1
workers = 1
[analysis]
min_requests = 20
[request]
shape = [1, 4]
""" + two_model_classes(1, 1)


def test_a_soak_s_classes_have_no_knee_and_their_windows_trend_at_the_target_s_drift(tmp_path):
    flags = {"soak": ["--mode", "knee", "--models", "cheap:5:1,slow:40:1", "--drift-ms-per-min", str(DRIFT_MS_PER_MIN)]}
    with runs_against_targets(tmp_path, flags, lambda n, url: PLAN.format(name=n, url=url)) as done:
        run_dir, _target = done["soak"]
    summary = read_summary(run_dir)
    assert isinstance(summary.get("soak"), dict) and "a soak holds one load" in summary["mix"]["text"]
    result, _ = run_history([run_dir], out=str(tmp_path / "history"))
    (g,) = result["groups"]
    assert g["soak"] is True
    t = summary["soak"]["series"]["t"]
    for c in summary["mix"]["classes"]:
        assert c["knee"]["users"] is None and c["latency_knee"]["took_off_users"] is None
        got = next(x for x in g["classes"] if x["name"] == c["name"])
        valid = [s for s in c["steps"] if s["valid"]]
        assert len(valid) >= 6, c["steps"]
        p50 = next(s for s in got["series"] if s["figure"] == "p50_ms at 1 users (windows' median)")
        assert p50["values"] == [pytest.approx(float(np.median([s["p50_ms"] for s in valid])))]
        (trends,) = got["trends"]
        x = [t[s["index"]] for s in valid]
        slope = stats.theilslopes([s["p50_ms"] for s in valid], x)[0]
        print(c["name"], "p50 slope ms/s", trends["p50_ms"]["slope"], "scipy", slope, "p", trends["p50_ms"]["p"])
        assert trends["p50_ms"]["slope"] == pytest.approx(slope)
        assert trends["p50_ms"]["slope"] == pytest.approx(DRIFT_MS_PER_MIN / 60.0, rel=0.3)  # the target's drift
        assert trends["p50_ms"]["drifting"] and trends["p50_ms"]["direction"] == "worse"
    md = (tmp_path / "history" / "history.md").read_text()
    assert "### class slow" in md and f"- `{json.loads((run_dir / 'meta.json').read_text())['run_id']}` windows: qps" in md
