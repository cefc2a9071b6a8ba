"""Traffic mixes, run for real: `kneeswarm run` (a Locust master and worker in their own
processes) against the demo target serving two models of different cost (``--models``).

The truth is the target's own: its per-model counters (Triton's ``nv_inference_request_success``
by model), how it was built (which model has fewer instances; which one its queue serves first),
and the plan's weights."""

from __future__ import annotations

import pytest

from conftest import mix_plan, read_summary, runs_against_targets, Target
from kneeswarm.analysis.schema.summary import ClassFigures, ClassStep, MixSummary
from kneeswarm.contracts.rundir import RunDir

pytestmark = pytest.mark.long


def plan(name: str, url: str, steps: str, weights: tuple[int, int] = (1, 1), hold: float = 6.0) -> str:
    return mix_plan(name, url, steps, hold, weights)


def success(t: Target, model: str) -> float:
    return t.metrics()[f'nv_inference_request_success{{model="{model}",version="1"}}']


def test_two_models_each_class_its_weights_share_the_targets_count_and_the_slow_knee_first(tmp_path):
    """cheap (5 ms, 4 instances of its own) and slow (40 ms, one instance), weights 3 : 1: the slow
    model's one instance is full from 2 users on, the cheap model's four never are."""
    flags = {"mix": ["--mode", "knee", "--models", "cheap:5:4,slow:40:1"]}
    with runs_against_targets(tmp_path, flags, lambda n, url: plan(n, url, "[1, 2, 4, 8]", (3, 1))) as done:
        run_dir, target = done["mix"]
        rows = RunDir(run_dir).read_requests()
        summary = read_summary(run_dir)
        unrecorded = 0
        for name, weight_share in (("cheap", 0.75), ("slow", 0.25)):
            mine = rows.loc[rows["class"] == name]
            assert abs(len(mine) / len(rows) - weight_share) <= 0.03, (name, len(mine), len(rows))
            served = success(target, name)  # the server's own count, model by model
            assert served >= int(mine["ok"].sum()), (name, served, int(mine["ok"].sum()))
            unrecorded += served - int(mine["ok"].sum())
        # as for the whole (test_e2e.py): requests in flight when the load stopped were served but never
        # recorded, at most one per user of the last step
        assert unrecorded <= 8, unrecorded
    assert rows["class"].notna().all()
    for c in summary["mix"]["classes"]:  # the server's own per-model rate beside the class's QPS, step by step
        for s in c["steps"]:
            assert s["server_rps"] == pytest.approx(s["qps"], rel=0.10), (c["name"], s)
    assert set(summary["mix"]) <= MixSummary.__optional_keys__
    assert all(set(c) <= ClassFigures.__optional_keys__ and all(set(s) <= ClassStep.__optional_keys__ for s in c["steps"])
               for c in summary["mix"]["classes"])  # every key written is declared
    mix = summary["mix"]
    assert mix["first_latency_knee"] == "slow", mix
    # the report names it, as first only where its took-off interval lies below cheap's (on the loaded
    # 2-CPU test host a stall at 1 user put cheap's 5-ms P99 at 54 ms, and the intervals overlapped)
    said = ("the P99 of class slow took off first" if mix["first_latency_knee_apart"]
            else "the P99 of class slow took off at the fewest users")
    assert said in (run_dir / "report" / "summary.md").read_text(), mix["text"]
    assert said in (run_dir / "report" / "index.html").read_text()


def test_a_class_starved_by_a_priority_queue_is_found_and_not_on_the_fair_one(tmp_path):
    """Two slots shared by both models: served in arrival order (fair), or cheap first (--priority
    cheap: slow waits while any cheap request does)."""
    shared = ["--mode", "knee", "--models", "cheap:5,slow:40", "--slots", "2"]
    flags = {"fair": shared, "priority": [*shared, "--priority", "cheap"]}
    # 8 users at most: at 16, two runs side by side on a loaded 2-CPU host stalled both targets alike
    # (P99 2.5 s for every class, fair or not) and left ~100 rows a class, the rule's floor
    with runs_against_targets(tmp_path, flags, lambda n, url: plan(n, url, "[1, 2, 4, 8]", hold=8.0)) as done:
        summaries = {name: read_summary(run_dir) for name, (run_dir, _t) in done.items()}
    starved = {name: [(f["evidence"]["class"], f.get("support")) for f in s.get("findings") or []
                      if f["id"] == "class_starved"] for name, s in summaries.items()}
    marginal = {name: [(f["evidence"]["class"], f.get("support"), f.get("at_point"))
                       for f in s.get("findings_marginal") or [] if f["id"] == "class_starved"] for name, s in summaries.items()}
    assert [c for c, _ in starved["priority"]] == ["slow"], (starved, marginal)
    # the fair target: not found -- not confirmed, not at the measured figures; a draw of the noise may
    # reach it now and then (a marginal of low support, said apart in the report)
    assert starved["fair"] == [] and all(not at and support < 0.5 for _c, support, at in marginal["fair"]), marginal
