"""The SLA check, the capacity plan and the SLA's junit.xml.

Independent truth: the digest's own worked numbers (../shared/seed/DIGEST.md "From measurements to
settings"): 150 -> 105 safe QPS; 1000 QPS peak -> 10 instances, deploy 12-13; 50 ms inference and
1 s tolerance -> 20 x threads.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from kneeswarm.analysis.models.capacity import capacity_plan, sla_check
from kneeswarm.analysis.reports.junit import junit_xml
from kneeswarm.contracts.outcome import EXIT_SLA_FAILED


def step(users, qps, p99, mean=None, error_rate=0.0, valid=True, **extra):
    return {"users": users, "qps": qps, "p99_ms": p99, "p50_ms": p99 / 2, "mean_ms": mean if mean is not None else p99 / 2,
            "error_rate": error_rate, "valid": valid, "requests": 1000, **extra}


def digest_summary():
    """Linear to 8 users, where QPS reaches the digest's 150 within a P99 of 200 ms; 16 users is past it.
    The 1-user step's mean latency is the digest's 50 ms single inference."""
    return {"steps": [step(1, 20.0, 60.0, mean=50.0), step(2, 40.0, 70.0), step(4, 80.0, 90.0),
                      step(8, 150.0, 180.0), step(16, 155.0, 420.0)]}


# -- SLA --------------------------------------------------------------------------------------------
def test_sla_highest_step_meeting_every_limit():
    r = sla_check(digest_summary(), {"p99_ms": 200, "error_rate": 0.01})
    assert r["passed"] is True
    assert r["best"] == {"users": 8, "qps": 150.0}
    assert [s["users"] for s in r["steps"] if s["meets"]] == [1, 2, 4, 8]
    by = {c["name"]: c for c in r["checks"]}
    assert by["p99_ms"] == {"name": "p99_ms", "limit": 200.0, "value": 180.0, "passed": True, "users": 8,
                            "highest_users_alone": 8}
    assert by["error_rate"]["value"] == 0.0 and by["error_rate"]["highest_users_alone"] == 16
    assert r["skipped"] == [] and r["problems"] == []
    assert "8 users" in r["text"] and "150" in r["text"]


def test_sla_error_rate_limits_the_best_step_and_invalid_steps_do_not_count():
    s = digest_summary()
    s["steps"][3]["error_rate"] = 0.05  # 8 users now fails the error budget
    s["steps"].append(step(32, 300.0, 10.0, valid=False))  # would meet everything, but is not trusted
    r = sla_check(s, {"p99_ms": 200, "error_rate": 0.01})
    assert r["best"] == {"users": 4, "qps": 80.0} and r["passed"]
    assert 32 not in [x["users"] for x in r["steps"]]


def test_sla_fails_when_no_step_meets_it_and_reports_the_lowest_step():
    r = sla_check(digest_summary(), {"p99_ms": 50})
    assert r["passed"] is False and r["best"] is None
    (c,) = r["checks"]
    assert c["users"] == 1 and c["value"] == 60.0 and c["passed"] is False
    assert r["text"].startswith("SLA FAILED")


def test_sla_min_qps_gate():
    assert sla_check(digest_summary(), {"p99_ms": 200, "min_qps": 100})["passed"] is True
    r = sla_check(digest_summary(), {"p99_ms": 200, "min_qps": 200})
    assert r["passed"] is False and r["best"]["users"] == 8
    assert {c["name"]: c["passed"] for c in r["checks"]} == {"p99_ms": True, "min_qps": False}


def test_streaming_limits_are_checked_only_when_steps_carry_them():
    r = sla_check(digest_summary(), {"p99_ms": 200, "ttft_ms": 100})
    assert r["skipped"] == ["ttft_ms"] and [c["name"] for c in r["checks"]] == ["p99_ms"]
    s = digest_summary()
    for st, ttft in zip(s["steps"], (40, 45, 60, 130, 300)):
        st["ttft_p99_ms"] = ttft
    r = sla_check(s, {"p99_ms": 200, "ttft_ms": 100})
    assert r["skipped"] == [] and r["best"]["users"] == 4  # TTFT 130 ms at 8 users breaks the limit
    # the nested spelling is read too
    for st in s["steps"]:
        st["itl"] = {"p99_ms": 10.0 if st["users"] <= 2 else 30.0}
    assert sla_check(s, {"itl_ms": 20})["best"]["users"] == 2


@pytest.mark.parametrize("summary", [{}, {"steps": None}, {"steps": [None, 3, {"users": "x"}]}, None, []])
def test_sla_on_malformed_summaries_fails_without_raising(summary):
    r = sla_check(summary, {"p99_ms": 200})
    assert r["passed"] is False and r["best"] is None and r["text"] == "SLA not checked: no valid step"


def test_sla_bad_keys_are_reported_not_raised():
    r = sla_check(digest_summary(), {"p99_ms": "fast", "p95": 100, "error_rate": 0.01})
    assert len(r["problems"]) == 2 and any("p95" in p for p in r["problems"])
    assert [c["name"] for c in r["checks"]] == ["error_rate"]


# -- capacity plan: the digest's worked numbers ----------------------------------------------------------
def test_capacity_plan_reproduces_the_digests_numbers():
    s = digest_summary()
    sla = sla_check(s, {"p99_ms": 200})
    plan = capacity_plan(s, sla, {"peak_qps": 1000, "spare": 2, "queue_tolerance_ms": 1000})
    assert plan["max_stable_qps"]["value"] == 150.0  # 16 users did 155 QPS but broke the SLA
    assert plan["safe_qps"]["value"] == pytest.approx(105.0)  # digest: 150 -> 105
    assert plan["instances"]["value"] == 10  # digest: 1000 QPS peak -> 10 instances
    assert plan["replicas"]["value"] == 12  # digest: deploy 12-13
    assert capacity_plan(s, sla, {"peak_qps": 1000, "spare": 3})["replicas"]["value"] == 13
    # 50 ms inference, 1 s tolerance -> 20 x threads
    q = plan["queue_length"]
    assert q["inputs"]["per_thread"] == pytest.approx(20.0)
    assert q["value"] == 20 * plan["core_threads"]["value"]
    assert plan["single_inference_ms"]["value"] == 50.0
    # the formula and its inputs are beside each figure
    assert "0.7 × 150 = 105" in plan["safe_qps"]["computed"]
    assert plan["instances"]["inputs"] == {"peak_qps": 1000, "safe_qps": pytest.approx(105.0)}
    assert all(isinstance(line, str) for line in plan["text"]) and len(plan["text"]) == 9


def test_recommended_concurrency_keeps_thirty_percent_headroom():
    s = digest_summary()
    plan = capacity_plan(s, sla_check(s, {"p99_ms": 200}), {})
    rec = plan["recommended_users"]
    # 8 users runs at 150/150 (no headroom); 4 users at 80/150 = 53 % -> 47 % headroom >= 30 %
    assert rec["value"] == 4
    assert rec["inputs"]["headroom"] == pytest.approx(1 - 80 / 150)
    # core 70-80 % of 4 = 2.8-3.2 -> 3; max 1.5-2 x 4 = 6-8
    assert plan["core_threads"]["value"] == 3 and plan["core_threads"]["inputs"]["range"] == [3, 3]
    assert plan["max_threads"]["value"] == 6 and plan["max_threads"]["inputs"]["range"] == [6, 8]
    assert plan["queue_length"]["value"] == 60  # 1000 ms / 50 ms x 3 threads
    assert plan["replicas"]["value"] is None  # no peak given: no replica count, and it says why
    assert "peak_qps" in plan["replicas"]["computed"]


def test_headroom_boundary_and_pool_sizes_for_sixteen():
    # QPS 70 % of the max stable exactly: headroom 30 % is enough
    s = {"steps": [step(1, 10.0, 20.0, mean=10.0), step(16, 70.0, 30.0), step(32, 100.0, 40.0)]}
    plan = capacity_plan(s, sla_check(s, {"p99_ms": 100}), {"peak_qps": 700, "spare": 1})
    assert plan["recommended_users"]["value"] == 16
    assert plan["core_threads"]["value"] == 12 and plan["core_threads"]["inputs"]["range"] == [11, 13]  # 11.2-12.8
    assert plan["max_threads"]["value"] == 24 and plan["max_threads"]["inputs"]["range"] == [24, 32]
    assert plan["safe_qps"]["value"] == pytest.approx(70.0)
    assert plan["instances"]["value"] == 10 and plan["replicas"]["value"] == 11  # ceil(700/70) + 1
    assert plan["queue_length"]["value"] == math.floor(1000 / 10 * 12)


def test_capacity_without_sla_plans_over_all_valid_steps_and_flags_bad_settings():
    s = digest_summary()
    plan = capacity_plan(s, None, {"peak_qps": 1000, "spare": 1.5, "colour": "red"})
    assert plan["max_stable_qps"]["value"] == 155.0
    assert plan["settings"]["spare"] == 2 and len(plan["problems"]) == 2
    assert plan["safe_qps"]["value"] == pytest.approx(0.7 * 155)


def test_capacity_when_nothing_meets_the_sla_gives_no_figures_and_does_not_raise():
    s = digest_summary()
    plan = capacity_plan(s, sla_check(s, {"p99_ms": 10}), {"peak_qps": 1000})
    for key in ("max_stable_qps", "recommended_users", "core_threads", "max_threads", "queue_length", "safe_qps",
                "instances", "replicas"):
        assert plan[key]["value"] is None, key
    assert capacity_plan({}, None, None)["recommended_users"]["value"] is None


# -- junit.xml ------------------------------------------------------------------------------------------
def test_junit_lists_each_sla_check_as_a_test_case():
    s = digest_summary()
    r = sla_check(s, {"p99_ms": 200, "error_rate": 0.01, "min_qps": 200, "ttft_ms": 100})
    root = ET.fromstring(junit_xml(r))
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "sla"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"p99_ms <= 200", "error_rate <= 0.01", "min_qps >= 200", "ttft_ms <= 100"}
    assert all(c.get("classname") == "kneeswarm.sla" and c.get("time") == "0" for c in cases.values())
    assert cases["p99_ms <= 200"].find("failure") is None
    fail = cases["min_qps >= 200"].find("failure")
    assert fail is not None and "150" in fail.get("message") and "8 users" in fail.get("message")
    assert cases["ttft_ms <= 100"].find("skipped") is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    assert (root.get("tests"), root.get("failures")) == ("4", "1")


def test_junit_of_a_passing_sla_has_no_failure():
    root = ET.fromstring(junit_xml(sla_check(digest_summary(), {"p99_ms": 200})))
    assert root.get("failures") == "0" and root.find(".//failure") is None


def test_sla_exit_code_is_distinct_from_the_others():
    from kneeswarm.contracts.outcome import EXIT_REGRESSION

    assert EXIT_SLA_FAILED not in (0, 1, 2, 130, EXIT_REGRESSION)
