"""The findings of a traffic mix on rows built in the test, whose truth is how they were drawn:
classes that wait the same (one queue in arrival order) are not starved; a class whose waiting is
its own is; a class whose answers are lost is; and a run without classes has no mix."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kneeswarm.analysis.measure.classes import ClassRows, class_figures, read_class_rows
from kneeswarm.analysis.summary.classes import first_latency_knee, judged, mix_section
from kneeswarm.contracts.rundir import RunDir

USERS = [1, 2, 4, 8]
ROWS = 400  # per class and step


def rows(latency: np.ndarray, ok: np.ndarray | None = None) -> ClassRows:
    ok = np.ones(len(latency), dtype=bool) if ok is None else ok
    return ClassRows(latency_ok=latency[ok], ok=ok, ttft_ok=np.full(int(ok.sum()), np.nan),
                     tokens_ok=np.full(int(ok.sum()), np.nan), itl=np.empty(0))


def stats() -> pd.DataFrame:
    return pd.DataFrame({"index": range(len(USERS)), "users": USERS, "t_lo": [10.0 * i for i in range(len(USERS))],
                         "t_hi": [10.0 * i + 8 for i in range(len(USERS))], "valid": True})


def verdict(by_class: dict[str, list[ClassRows]]) -> tuple[list[str], list[str], str | None]:
    mix = mix_section(class_figures(by_class, stats(), {"cheap": 0.5, "slow": 0.5}, {}))
    confirmed, marginal = judged(by_class, mix, [True] * len(USERS))
    return ([f["evidence"]["class"] for f in confirmed], [f["evidence"]["class"] for f in marginal],
            first_latency_knee(mix["classes"]))


def waits(rng: np.random.Generator, users: int, scale: float) -> np.ndarray:
    """Queueing time: none below 2 users, then exponential of a mean growing with the users."""
    return np.zeros(ROWS) if users <= 2 else rng.exponential(scale * (users - 2), ROWS)


def test_classes_waiting_the_same_are_not_starved():
    rng = np.random.default_rng(1)
    by = {"cheap": [rows(5 + waits(rng, u, 20)) for u in USERS], "slow": [rows(40 + waits(rng, u, 20)) for u in USERS]}
    confirmed, marginal, first = verdict(by)
    assert confirmed == [] and marginal == []
    assert first is None  # both P99s took off at 4 users: no class first


def test_a_class_whose_waiting_is_its_own_is_starved():
    rng = np.random.default_rng(2)
    by = {"cheap": [rows(5 + rng.uniform(0, 2, ROWS)) for _ in USERS],
          "slow": [rows(40 + waits(rng, u, 60)) for u in USERS]}
    confirmed, marginal, first = verdict(by)
    assert confirmed == ["slow"] and marginal == []
    assert first == "slow"


def test_a_class_whose_answers_are_lost_is_starved():
    rng = np.random.default_rng(3)
    lost = [np.ones(ROWS, dtype=bool) if u < 8 else rng.random(ROWS) > 0.5 for u in USERS]  # half time out at 8
    by = {"cheap": [rows(5 + rng.uniform(0, 2, ROWS)) for _ in USERS],
          "slow": [rows(40 + rng.uniform(0, 2, ROWS), ok) for ok in lost]}
    confirmed, _marginal, _first = verdict(by)
    assert confirmed == ["slow"]


def test_a_run_without_classes_has_no_mix(tmp_path):
    run = RunDir.create(tmp_path, "plain")
    run.write_request_part({"t_start": [1.0, 2.0], "latency_ms": [5.0, 6.0], "ok": [True, True]}, 0)
    assert read_class_rows(run) is None


def test_each_class_is_gated_by_its_own_sla():
    """The whole's limit met at every step; the slow class's own P99 limit met at 1-2 users only."""
    from kneeswarm.analysis.summary.gates import evaluate

    rng = np.random.default_rng(4)
    by = {"cheap": [rows(5 + rng.uniform(0, 2, ROWS)) for _ in USERS],
          "slow": [rows(40 + waits(rng, u, 60)) for u in USERS]}
    mix = mix_section(class_figures(by, stats(), {}, {}))
    summary = {"mix": mix, "steps": [{"users": u, "qps": 10.0 * u, "p99_ms": 50.0, "error_rate": 0.0, "valid": True}
                                     for u in USERS]}
    slow_p99 = [s["p99_ms"] for s in mix["classes"][1]["steps"]]
    assert slow_p99[1] < 100 < slow_p99[2]  # numpy's percentiles of the drawn rows: the truth the gate reads
    sla, _capacity = evaluate(summary, {"sla": {"p99_ms": 100.0, "classes": {"slow": {"p99_ms": 100.0},
                                                                              "cheap": {"p99_ms": 100.0}}}})
    assert sla["set"] and sla["passed"] is True  # a step met every limit: the best one is 2 users for slow
    assert sla["classes"]["slow"]["best"]["users"] == 2 and sla["classes"]["cheap"]["best"]["users"] == 8
    sla, _ = evaluate(summary, {"sla": {"classes": {"slow": {"p99_ms": 100.0, "min_qps": 1e6}}}})
    assert sla["set"] and sla["passed"] is False and "class slow: FAILED" in sla["text"]


def test_a_class_s_server_rate_is_its_model_s_counter_over_the_window():
    from kneeswarm.analysis.measure.classes import server_rates

    t = np.arange(0.0, 40.0)
    prom = pd.DataFrame({"t": t, 'nv_inference_request_success{model="slow",version="1"}': 3.0 * t,
                         'nv_inference_request_success{model="cheap",version="1"}': 9.0 * t,
                         'kneeswarm_target_requests_total{code="200"}': 12.0 * t})
    rates = server_rates(prom, {"slow": "slow", "fast": "cheap", "other": "absent"}, stats())
    assert rates["slow"] == [3.0] * len(USERS) and rates["fast"] == [9.0] * len(USERS)
    assert "other" not in rates


def test_tf_serving_s_count_per_model_is_read_on_its_answered_status_only():
    """TF Serving counts requests per model and status (`:tensorflow:serving:request_count{model_name,status}`):
    a class's server rate is its model's status="OK" count; the failed statuses are not answers."""
    from kneeswarm.analysis.measure.classes import server_rates

    t = np.arange(0.0, 40.0)
    prom = pd.DataFrame({"t": t, ':tensorflow:serving:request_count{model_name="slow",status="OK"}': 2.0 * t,
                         ':tensorflow:serving:request_count{model_name="slow",status="NOT_FOUND"}': 5.0 * t,
                         ':tensorflow:serving:request_count{model_name="cheap",status="OK"}': 7.0 * t})
    rates = server_rates(prom, {"slow": "slow", "cheap": "cheap"}, stats())
    assert rates["slow"] == [2.0] * len(USERS) and rates["cheap"] == [7.0] * len(USERS)


def test_kserve_s_predict_count_per_model_is_a_class_s_server_rate():
    """KServe's model server times each predict per model (kserve/metrics.py: the histogram
    request_predict_seconds, label model_name): its _count is the model's requests; its _sum is not."""
    from kneeswarm.analysis.measure.classes import server_rates

    t = np.arange(0.0, 40.0)
    prom = pd.DataFrame({"t": t, 'request_predict_seconds_count{model_name="slow"}': 4.0 * t,
                         'request_predict_seconds_sum{model_name="slow"}': 0.2 * t,
                         'request_predict_seconds_count{model_name="cheap"}': 11.0 * t})
    rates = server_rates(prom, {"slow": "slow", "cheap": "cheap"}, stats())
    assert rates["slow"] == [4.0] * len(USERS) and rates["cheap"] == [11.0] * len(USERS)
