"""explain(): synthetic summaries built from known stories each produce exactly their findings.

Each story is written here as the per-step numbers a run of that kind shows (the keys of
analysis/steps.py ``server_metrics`` and analysis/measure/hostfacts.py); the expected ids come from the
story, not from the rules.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from kneeswarm.analysis.findings import FINDING_IDS, explain, littles_law_reason, step_littles_law

HOST = "srv"
USERS = [1, 2, 4, 8, 16, 32]
CPU_FINDINGS = {"cpu_saturated", "run_queue_over_cores", "threads_over_cores", "single_thread_bound",
                "kernel_time_high", "switch_storm", "migrations_high"}


def step(users, qps, p99, *, valid=True, reasons=(), gen=30.0, errors=None, window=20.0, **server):
    return {"index": USERS.index(users) if users in USERS else 0, "users": users, "requests": int(qps * window),
            "qps": qps, "rps": qps, "p50_ms": p99 / 2, "p99_ms": p99, "mean_ms": p99 / 2, "valid": valid,
            "reasons": list(reasons), "errors": errors or {}, "error_rate": 0.0, "window_s": window,
            "generator": {"cpu_pct": {"worker-0": gen}}, "server": {HOST: server} if server else {}}


def summary(steps, knee=None, logical=8, physical=8, cmdline=None, gpus=None):
    facts = {"cpu": {"logical_cpus": logical, "physical_cores": physical, "threads_per_core": 1, "sockets": 1}}
    if cmdline:
        facts["process"] = {"pid": 4242, "cmdline": cmdline, "by": "pid"}
    if gpus is not None:
        facts["gpus"] = gpus
    return {"run_id": "synthetic", "complete": True, "steps": steps, "analysis": {"generator_cpu_max": 90.0},
            "knee": {"users": knee, "qps": None, "method": "saturation" if knee else "none"},
            "peak": {}, "hosts": {HOST: facts}}


def healthy_server(u, **override):
    """A host of 64 logical / 32 physical CPUs far from any limit; every resource linear in the load."""
    m = {"us": 1.5 * u, "sy": 0.1 * u, "wa": 0.0, "cs": 200.0 * u, "r": 0.5 * u, "cpu_pct": 90.0 * u,
         "usr_pct": 87.0 * u, "sys_pct": 3.0 * u, "sy_share": 3 / 90, "rss_mb": 500.0, "threads": 40.0,
         "active_threads": float(u), "top_thread_cpu_pct": 30.0, "migrations_s": 5.0, "cswch_s": 50.0 * u,
         "nvcswch_s": 5.0 * u}
    m.update(override)
    return m


def healthy_steps(**per_user):
    return [step(u, 50.0 * u, 20.0, **healthy_server(u, **{k: f(u) for k, f in per_user.items()})) for u in USERS]


def ids(result):
    return {f["id"] for f in result["findings"]}


def only(result, fid):
    [f] = [f for f in result["findings"] if f["id"] == fid]
    return f


# -- the stories -------------------------------------------------------------------------------------
def story_contention():
    """(a) past the knee at 8 users %sy and cs/s climb and the run queue passes the 8 CPUs."""
    qps = [50, 100, 200, 380, 390, 385]
    p99 = [20, 20, 21, 40, 80, 150]
    us = [10, 20, 40, 75, 70, 62]
    sy = [2, 3, 5, 12, 22, 30]
    r = [1, 2, 4, 9, 20, 40]
    cs = [1000, 2000, 4000, 8000, 20000, 40000]
    share = [0.05, 0.05, 0.06, 0.14, 0.30, 0.45]
    steps = [step(u, q, p, us=a, sy=b, wa=0.0, r=rr, cs=c, cpu_pct=8 * (a + b), sy_share=sh, active_threads=8.0,
                  top_thread_cpu_pct=60.0, migrations_s=10.0, rss_mb=800.0)
             for u, q, p, a, b, rr, c, sh in zip(USERS, qps, p99, us, sy, r, cs, share)]
    return summary(steps, knee=8)


def story_model_copies():
    """(b) healthy scaling, but RSS = 300 MB + 120 MB per user."""
    return summary(healthy_steps(rss_mb=lambda u: 300.0 + 120.0 * u), logical=64, physical=32)


def story_kv_cache_growth():
    """healthy scaling; RSS grows with users as llama-server's did in the conformance suite (a KV
    and prompt cache filling, 76 -> 181 MB from 1 to 6 users: ~20 MB per user), not a model copy."""
    return summary(healthy_steps(rss_mb=lambda u: 56.0 + 20.0 * u), logical=64, physical=32)


def story_gpu_serialized():
    """(c) QPS flat from 4 users, GPU utilisation 42-43 % throughout, CPU idle."""
    qps = [100, 190, 300, 305, 300, 302]
    p99 = [10, 11, 14, 28, 55, 110]
    sm = [30, 38, 42, 43, 42, 43]
    steps = [step(u, q, p, us=10.0, sy=2.0, r=1.0, cs=3000.0, cpu_pct=100.0, sy_share=0.02, active_threads=2.0,
                  top_thread_cpu_pct=50.0, rss_mb=2000.0, sm_pct=s, mem_pct=20.0, fb_used_mb=6000.0, power_w=150.0)
             for u, q, p, s in zip(USERS, qps, p99, sm)]
    return summary(steps, knee=4, gpus=[{"index": 0, "name": "NVIDIA H200"}])


def story_generator_bound():
    """(d) healthy server; the generator's worker at 95 % CPU at 32 users made that step invalid."""
    steps = healthy_steps()
    steps[-1].update(valid=False, reasons=["load generator CPU 95% > 90% (worker worker-0): ..."],
                     generator={"cpu_pct": {"worker-0": 95.0, "worker-1": 60.0}})
    return summary(steps, logical=64, physical=32)


def story_single_thread():
    """(e) QPS flat from 2 users; the busiest thread at 99-100 % while 7 of 8 CPUs idle."""
    users = USERS[:5]
    qps = [95, 180, 185, 182, 184]
    p99 = [11, 12, 22, 45, 90]
    steps = [step(u, q, p, us=13.0, sy=1.0, r=1.2, cs=2500.0, cpu_pct=105.0, sy_share=0.04, active_threads=1.5,
                  top_thread_cpu_pct=100.0 if u >= 8 else 99.0, migrations_s=2.0, rss_mb=300.0)
             for u, q, p in zip(users, qps, p99)]
    return summary(steps, knee=2)


def story_healthy():
    """(f) linear: 50 QPS per user up to 32 users, flat P99, every resource far from a limit."""
    return summary(healthy_steps(), logical=64, physical=32)


@pytest.mark.parametrize("make,expected", [
    (story_contention, {"cpu_saturated", "run_queue_over_cores", "kernel_time_high", "switch_storm"}),
    (story_model_copies, {"model_copies"}),
    (story_kv_cache_growth, set()),
    (story_gpu_serialized, {"gpu_serialized"}),
    (story_generator_bound, {"generator_bound"}),
    (story_single_thread, {"single_thread_bound"}),
    (story_healthy, set()),
], ids=["a-contention", "b-model-copies", "b2-kv-cache-growth", "c-gpu-serialized", "d-generator", "e-single-thread", "f-healthy"])
def test_story_yields_exactly_its_findings(make, expected):
    result = explain(make())
    assert ids(result) == expected
    assert result["rule_errors"] == []
    for f in result["findings"]:
        assert f["id"] in FINDING_IDS and f["severity"] in ("critical", "warning", "info")
        assert f["evidence"] and f["text"] and f["advice"]
        assert all(v is not None for v in f["evidence"].values())
    json.dumps(result, allow_nan=False)


def test_evidence_carries_the_triggering_numbers():
    result = explain(story_contention())
    rq = only(result, "run_queue_over_cores")
    assert rq["evidence"]["r"] == 40 and rq["evidence"]["logical_cpus"] == 8
    # vmstat counts itself: 39 tasks besides it; at 8 users r = 9 is 8 besides the sampler (not above
    # the 8 CPUs) and the CPUs were 87 % busy, not full
    assert rq["evidence"]["runnable"] == 39 and rq["steps"] == [16, 32]
    cs = only(result, "switch_storm")["evidence"]
    assert (cs["cs_from"], cs["cs_to"], cs["from_users"], cs["to_users"]) == (4000, 40000, 4, 32)
    assert math.isclose(cs["growth"], 10.0)
    assert only(result, "cpu_saturated")["steps"] == [16, 32]
    k = only(result, "kernel_time_high")["evidence"]
    assert k["sy_share"] == 0.45 and k["of"] == "process"
    mc = only(explain(story_model_copies()), "model_copies")["evidence"]
    assert math.isclose(mc["mb_per_user"], 120.0) and mc["r2"] == 1.0
    st = only(explain(story_single_thread()), "single_thread_bound")["evidence"]
    assert st["top_thread_cpu_pct"] == 100.0 and math.isclose(st["idle_cpus"], 8 * 0.86)
    gen = only(explain(story_generator_bound()), "generator_bound")
    assert gen["evidence"]["cpu_pct"] == 95.0 and gen["evidence"]["worker"] == "worker-0" and gen["steps"] == [32]


def test_retrograde_on_the_articles_curve():
    # the article: QPS at 32 threads 23 % below 16 threads, P99 104 -> 173 -> >300 ms
    qps = [100, 195, 380, 700, 860, 662]
    p99 = [60, 62, 70, 104, 173, 310]
    steps = [step(u, q, p) for u, q, p in zip(USERS, qps, p99)]
    f = only(explain(summary(steps, knee=8)), "retrograde")
    assert f["evidence"]["peak_users"] == 16 and f["evidence"]["users"] == 32
    assert math.isclose(f["evidence"]["drop"], 1 - 662 / 860, rel_tol=1e-3)
    assert f["severity"] == "critical"
    # a 4 % dip is noise, not retrograde
    steps[-1]["qps"] = 0.96 * 860
    assert "retrograde" not in ids(explain(summary(steps, knee=8)))


def test_bounded_queue_pushes_back_and_unbounded_latency_explodes():
    p99 = [20, 20, 22, 45, 400, 900]
    qps = [50, 100, 190, 200, 200, 200]
    bounded = [step(u, q, p, errors=({"http_5xx": 40 * u} if u >= 16 else {})) for u, q, p in zip(USERS, qps, p99)]
    assert {"queue_pushback"} <= ids(explain(summary(bounded, knee=4)))
    assert "unbounded_queue" not in ids(explain(summary(bounded, knee=4)))
    unbounded = [step(u, q, p) for u, q, p in zip(USERS, qps, p99)]
    result = explain(summary(unbounded, knee=4))
    assert "unbounded_queue" in ids(result) and "queue_pushback" not in ids(result)
    assert math.isclose(only(result, "unbounded_queue")["evidence"]["growth"], 900 / 22, rel_tol=1e-3)
    # the target's own rejection counter wins over the error categories
    for s in unbounded:
        s["server"] = {HOST: {"target": {"rejected_s": 0.0 if s["users"] < 16 else 5.0 * s["users"]}}}
    assert "queue_pushback" in ids(explain(summary(unbounded, knee=4)))


def test_waiting_not_computing_when_cpu_idle_and_nothing_else_explains():
    # the knee-mode target: 4 slots of 50 ms, so QPS = min(users, 4) x 20 and P99 grows with the queue
    qps = [20, 40, 80, 80, 80, 80]
    p99 = [51, 52, 53, 101, 201, 402]
    steps = [step(u, q, p, us=8.0, sy=3.0, r=0.5, cs=900.0, cpu_pct=6.0, sy_share=0.3, active_threads=1.0,
                  top_thread_cpu_pct=5.0) for u, q, p in zip(USERS, qps, p99)]
    result = explain(summary(steps, knee=4))
    assert ids(result) == {"waiting_not_computing"}
    ev = only(result, "waiting_not_computing")["evidence"]
    assert ev["cpu_busy_pct_max"] == 11.0 and ev["host_busy_pct_max"] == 11.0 and ev["service_busy_pct_max"] == 0.75
    assert not CPU_FINDINGS & ids(result)  # sy_share 30 % of 6 % CPU is no contention


def test_io_wait_threads_over_cores_and_migrations():
    steps = healthy_steps(wa=lambda u: 15.0 if u >= 16 else 1.0, active_threads=lambda u: 2.0 * u,
                          migrations_s=lambda u: 100.0 * u)
    result = explain(summary(steps, knee=16, logical=64, physical=32))
    assert {"io_wait", "threads_over_cores", "migrations_high"} <= ids(result)
    assert only(result, "threads_over_cores")["evidence"]["active_threads"] == 64.0
    assert only(result, "migrations_high")["steps"] == [16, 32]
    # 100 x u migrations/s at 90 x u % CPU: 111 per second of CPU the service used
    per_cpu_s = only(result, "migrations_high")["evidence"]["per_cpu_s"]
    assert per_cpu_s == pytest.approx(100.0 / 0.9, abs=0.1)  # evidence is rounded
    # this summary has no per-process IO (a run directory from before pidstat -d): the host's wa
    # alone, and the finding says what it could not check
    assert only(result, "io_wait")["evidence"]["service_io_recorded"] is False
    assert "not recorded" in only(result, "io_wait")["text"]


@pytest.mark.parametrize("own_kb,host_kb,delay_pct,wa,fires", [
    (0.0, 30000.0, 0.0, 15.0, False),  # the host waited on others' IO; the service did none
    (5000.0, 30000.0, 0.0, 15.0, False),  # 17 % of the traffic: below IO_SHARE_MIN
    (10000.0, 30000.0, 0.0, 15.0, True),  # 33 %
    (10000.0, 30000.0, 0.0, 9.0, False),  # the host did not wait (wa <= 10 %), no delay measured
    (10000.0, 30000.0, 0.30 * 8 * 100, 0.0, True),  # its threads blocked 30 % of the requests' time: wa 0 (CPUs full)
    (10000.0, 30000.0, 0.05 * 8 * 100, 0.0, False),  # 5 %
])
def test_io_wait_reads_the_services_own_io(own_kb, host_kb, delay_pct, wa, fires):
    # at 16 users: 800 QPS x 10 ms mean latency = 8 requests in flight (request-seconds per second)
    steps = healthy_steps(wa=lambda u: wa if u >= 16 else 0.0, bi=lambda u: 0.0, bo=lambda u: host_kb,
                          io_read_kb_s=lambda u: 0.0, io_write_kb_s=lambda u: own_kb,
                          io_delay_pct=lambda u: delay_pct if u == 16 else 0.0)
    result = explain(summary(steps, knee=16, logical=64, physical=32))
    assert ("io_wait" in ids(result)) is fires, result["findings"]
    if fires:
        ev = only(result, "io_wait")["evidence"]
        assert ev["service_io_recorded"] is True and ev["io_share"] == pytest.approx(own_kb / host_kb, rel=1e-3)


@pytest.mark.parametrize("cmdline,plan,logical,expect", [
    ("python -m kneeswarm.target --port 0 --mode onnx --request-threads 8 --intra-op-threads 2", None, 2, 16),
    ("python -m kneeswarm.target --port 0 --mode onnx --request-threads 4", None, 2, 4),  # default intra-op 1
    ("python -m kneeswarm.target --request-threads=2 --intra-op-threads=0", None, 8, 16),  # 0: one per core
    ("python -m kneeswarm.target --port 0 --mode knee --slots 4", None, 2, None),
    ("python -m kneeswarm.target --request-threads 2 --intra-op-threads 1", None, 2, None),
    (None, {"target_options": {"request_threads": 16, "intra_op_threads": 4}}, 16, 64),
    (None, {"request_threads": 2, "intra_op_threads": 2}, 16, None),
    (None, None, 2, None),
])
def test_engine_oversubscribed_from_plan_or_command_line(cmdline, plan, logical, expect):
    result = explain(summary(healthy_steps(), logical=logical, physical=logical, cmdline=cmdline), plan)
    if expect is None:
        assert "engine_oversubscribed" not in ids(result)
    else:
        assert only(result, "engine_oversubscribed")["evidence"]["threads"] == expect


@pytest.mark.parametrize("broken", [
    None, {}, {"steps": None}, {"steps": "abc"}, {"steps": [None, 1, "x"]},
    {"steps": [{"users": "eight", "qps": "x", "valid": "yes", "server": "nope"}]},
    {"steps": [{"users": 1, "qps": float("nan"), "valid": True, "server": {"h": {"us": "high", "r": None}}}],
     "hosts": {"h": {"cpu": {"logical_cpus": "two"}}}, "knee": {"users": "x"}},
    {"steps": [step(u, 10.0 * u, 5.0, us=float("nan"), r=float("inf")) for u in USERS], "hosts": [], "knee": 3},
])
def test_malformed_summaries_give_no_finding_and_no_exception(broken):
    result = explain(broken)
    assert result["findings"] == [] and result["rule_errors"] == []
    json.dumps(result, allow_nan=False)


def test_usl_section_fits_the_valid_steps():
    usl = explain(story_healthy())["usl"]
    assert usl["points"] == 6 and usl["sigma"] < 1e-6 and math.isclose(usl["lambda"], 50.0, rel_tol=1e-4)
    assert usl["curve"]["users"][0] == 1.0 and usl["curve"]["users"][-1] == 32.0
    # the generator-bound step is left out of the fit
    assert explain(story_generator_bound())["usl"]["points"] == 5


# -- Little's law --------------------------------------------------------------------------------------
@pytest.mark.parametrize("users,x,r_ms,z_ms,ok", [
    (8, 400.0, 20.0, 0.0, True),      # 400/s x 0.020 s = 8
    (8, 370.0, 20.0, 0.0, True),      # 7.4 = 92.5 %: within 10 %
    (8, 200.0, 20.0, 0.0, False),     # 4 of 8 users busy: the generator did not hold the load
    (10, 100.0, 50.0, 50.0, True),    # with think time: 100/s x (0.05 + 0.05) s = 10
    (10, 100.0, 50.0, 0.0, False),    # the same without it: 5
    (4, 100.0, 50.0, 0.0, False),     # 5 > 4 x 1.1: more in flight than users
])
def test_littles_law_within_ten_percent(users, x, r_ms, z_ms, ok):
    reason = littles_law_reason(users, x, r_ms, z_ms)
    assert (reason is None) == ok
    if not ok:
        assert reason.startswith("Little's law:") and "\n" not in reason


def test_littles_law_on_steps_and_missing_inputs():
    assert littles_law_reason(None, 10, 10) is None and littles_law_reason(4, "x", 10) is None
    # a negative in-flight count is no measurement: the mean latency is used, or nothing is checked
    assert littles_law_reason(8, 200.0, None, in_flight=-1.0) is None  # (raised TypeError before)
    assert "50%" in littles_law_reason(8, 200.0, 20.0, in_flight=-1.0)  # 200/s x 20 ms = 4 of 8
    s = step(8, 200.0, 40.0)  # mean 20 ms -> 4 users busy of 8
    assert "50%" in step_littles_law(s)
    s["rps"] = 400.0  # every request, failed or not, keeps its user busy
    assert step_littles_law(s) is None
    result = explain(summary([s, step(16, 100.0, 40.0)]), {"load": {"wait_ms": 0.0}})
    assert [x["users"] for x in result["littles_law"]] == [16]


# -- against real processes: the conductor, Locust, the demo target, pidstat and vmstat --------------
def run_against(start_demo_target, tmp_path, name, target_args, steps):
    from kneeswarm.launch.conductor import Conductor
    from kneeswarm.contracts.plan import HostPlan
    from kneeswarm.contracts.planfile import load_plan

    # Held 4 s, a steady window of 3 s (3 samples of vmstat and pidstat each): measured on this
    # machine, the oversubscribed target made 75-99 req/s (225 rows or more, over min_requests 100)
    # and vmstat's r read 7.2 against the 2 CPUs that run_queue_over_cores compares it with.
    target = start_demo_target(*target_args)
    plan = load_plan(None, {"name": name, "target": target.url, "load.steps": steps, "load.hold": 4.0,
                            "load.ramp": 1.0, "load.settle": 1.0, "load.workers": 1,
                            "metrics_url": target.url + "/metrics"})
    plan.hosts = [HostPlan(name="local", pid=target.pid)]
    result = Conductor(plan, tmp_path, quiet=True).run()
    assert result.ended == "completed" and result.summary is not None
    return result.summary, plan.to_dict()


@pytest.mark.long
@pytest.mark.slow
def test_real_oversubscribed_onnx_target_is_diagnosed(start_demo_target, tmp_path):
    # 4 request threads x 2 intra-op threads per CPU the target may use (8 x 2 = 16 on 2 CPUs), and
    # up to 2 users per CPU: read from the machine, so that it is oversubscribed on any machine
    cpus = len(os.sched_getaffinity(0))
    summary, plan = run_against(start_demo_target, tmp_path, "oversubscribed",
                                ["--mode", "onnx", "--request-threads", str(4 * cpus), "--intra-op-threads", "2"],
                                [max(1, cpus // 2), cpus, 2 * cpus])
    result = explain(summary, plan)
    found = ids(result)
    assert {"run_queue_over_cores", "threads_over_cores", "engine_oversubscribed"} <= found, result["findings"]
    assert only(result, "engine_oversubscribed")["evidence"]["threads"] == 8 * cpus
    rq = only(result, "run_queue_over_cores")["evidence"]
    assert rq["r"] > rq["logical_cpus"]
    assert result["rule_errors"] == []
    # summary.json carries the same findings, confirmed or (at this run's noise) marginal
    assert {f["id"] for f in summary["findings"]} | {
        f["id"] for f in summary["findings_marginal"] if f["at_point"]} == found
    # the cause first: the thread oversubscription leads, the switches and the run queue follow from it
    assert summary["verdict"]["causes"][0] == "engine_oversubscribed", (summary["verdict"], summary["findings"])


@pytest.mark.slow
def test_real_knee_target_gets_no_cpu_finding(knee_run):
    # 4 slots of 50 ms and no CPU work: throughput stops at 80/s because of the slots, not the CPU
    # (the session's shared real run, tests/conftest.py: steps 1-16 users, its /metrics scraped)
    from conftest import KNEE_STEPS, read_summary
    from kneeswarm.contracts.planfile import load_plan

    summary = read_summary(knee_run.run_dir)
    plan = load_plan(knee_run.run_dir / "plan.toml").to_dict()
    assert summary["complete"] is True  # the load ran all its steps, the analysis wrote the summary
    result = explain(summary, plan)
    assert not CPU_FINDINGS & ids(result), result["findings"]  # host_contended may show: other tests share the host
    assert "engine_oversubscribed" not in ids(result)
    assert result["rule_errors"] == []
    # closed loop, no think time: users = QPS x mean latency on every steady step, within 10 %
    assert len(summary["steps"]) == len(KNEE_STEPS) and result["littles_law"] == [], result["littles_law"]
    for s in summary["steps"]:
        assert step_littles_law(s) is None
        assert not any(r.startswith("Little's law") for r in s["reasons"])  # kneeswarm.analysis.measure.trust agrees
    assert summary["usl"]["points"] == sum(s["valid"] for s in summary["steps"])


def test_a_host_busy_with_other_work_is_not_a_full_run_queue():
    # a false alarm measured on this shared machine: the knee target used ~4 % of 2 CPUs while other tests
    # kept the host 46-77 % busy and vmstat's r read 2.3-2.7 (the summary of a real run, rounded).  r
    # counts vmstat itself and the CPUs had idle time: no run queue over the cores, no full host; the
    # slots are the cause.
    qps, p99 = [18.8, 36.6, 73.7, 80.0], [63.7, 62.6, 62.5, 119.6]
    host = [(38.5, 7.8, 2.5, 2.8), (62.0, 11.3, 2.3, 4.0), (69.8, 7.2, 2.7, 8.0), (57.7, 6.8, 2.3, 6.7)]
    steps = [step(u, q, p, us=us, sy=sy, r=r, cpu_pct=c, sy_share=0.08, active_threads=1.0, top_thread_cpu_pct=c,
                  cs=900.0, migrations_s=0.5, threads=2.0) for u, q, p, (us, sy, r, c) in zip([1, 2, 4, 8], qps, p99, host)]
    assert ids(explain(summary(steps, knee=4, logical=2, physical=2))) == {"waiting_not_computing"}
    # threads that waited for a CPU 300 % of the time still find no queue on CPUs that sat idle (and
    # a service that waited for CPUs is not "waiting on something else" either)
    for s in steps:
        s["server"][HOST]["wait_pct"] = 300.0
    assert ids(explain(summary(steps, knee=4, logical=2, physical=2))) == set()


def full_host_steps():
    # measured here while six other helpers' tests ran: the knee target at 1.9-3.6 % of 2 CPUs, the
    # host 99.5-100.6 % busy (us + sy) with r = 8.5-10.4 (the summary of a real run, rounded)
    rows = [(1, 18.3, 93, 81.1, 18.4, 9.1, 1.9), (2, 35.9, 76, 86.0, 13.9, 9.0, 2.3), (4, 70.8, 68, 73.4, 26.7, 9.4, 3.4),
            (8, 80.2, 308, 79.9, 20.6, 10.4, 3.6), (16, 78.9, 220, 86.5, 13.7, 8.5, 3.5)]
    return [step(u, q, p, us=us, sy=sy, r=r, cpu_pct=c, sy_share=0.2, active_threads=0.0, top_thread_cpu_pct=c,
                 cs=1500.0, migrations_s=0.2, threads=2.0) for u, q, p, us, sy, r, c in rows]


def test_a_full_host_that_kept_no_cpu_from_the_service_does_not_hide_its_cause():
    # the same run with the target's run delay as pidstat measured it (%wait summed over its threads,
    # 5-12 % of a CPU): 0.4-5 % of its requests' time in flight, so the full host did not disturb it
    steps = full_host_steps()
    for s, wait in zip(steps, [5.0, 8.0, 10.0, 12.0, 7.0]):
        s["server"][HOST]["wait_pct"] = wait
    result = explain(summary(steps, knee=4, logical=2, physical=2))
    assert ids(result) == {"waiting_not_computing"}
    assert only(result, "waiting_not_computing")["evidence"]["host_busy_pct_max"] == pytest.approx(100.5)  # at 8 users
    # had its threads waited a tenth of that time for a CPU, the host would have disturbed it
    for s in steps:
        s["server"][HOST]["wait_pct"] = 0.1 * s["users"] * 100.0
    assert ids(explain(summary(steps, knee=4, logical=2, physical=2))) == {"host_contended"}


def test_a_host_full_of_other_work_is_contention_not_the_service():
    steps = full_host_steps()
    result = explain(summary(steps, knee=4, logical=2, physical=2))
    assert ids(result) == {"host_contended"}
    ev = only(result, "host_contended")["evidence"]
    # at or after the knee, the step where the others did most: 1 - 3.4 / 2 / 100.1
    assert ev["users"] == 4 and ev["r"] == 9.4
    assert math.isclose(ev["process_share"], 3.4 / 2 / 100.1, rel_tol=1e-3)
    # 20 threads, but running or waiting for a CPU 0.5 of them on average: the queue is the others'
    for s in steps:
        s["server"][HOST].update(threads=20.0, wait_pct=50.0 - s["server"][HOST]["cpu_pct"])
    assert ids(explain(summary(steps, knee=4, logical=2, physical=2))) == {"host_contended"}
    # a process whose own threads wanted more than the 2 CPUs (%CPU + %wait = 3 CPUs) adds to the
    # run queue whatever CPU share it got
    for s in steps:
        s["server"][HOST]["wait_pct"] = 300.0 - s["server"][HOST]["cpu_pct"]
    result = explain(summary(steps, knee=4, logical=2, physical=2))
    assert ids(result) == {"host_contended", "run_queue_over_cores"}
    ev = only(result, "run_queue_over_cores")["evidence"]
    assert ev["runnable"] == 9.4 and ev["service_demand"] == 3.0  # r 10.4 less the sampler, at 8 users
    # the same host numbers with the process doing the work: the service filled the host
    for s in steps:
        s["server"][HOST].update(threads=2.0, wait_pct=5.0)
        s["server"][HOST]["cpu_pct"] = 2 * (s["server"][HOST]["us"] + s["server"][HOST]["sy"])
    assert ids(explain(summary(steps, knee=4, logical=2, physical=2))) >= {"run_queue_over_cores", "cpu_saturated"}


@pytest.mark.parametrize("share,starved,expect", [
    (0.30, True, {"host_contended"}),  # seen: 25-35 % of a host others filled is not "the CPU is the bottleneck"
    (0.30, False, set()),  # ... nor contention where its threads did not wait for a CPU
    (0.45, True, {"host_contended"}),
    (0.55, False, {"cpu_saturated"}),  # most of the busy CPU was the service's
])
def test_cpu_saturated_only_where_the_service_did_most_of_the_busy_cpu(share, starved, expect):
    steps = full_host_steps()
    for s in steps:  # the host ~100 % busy (us + sy) on 2 CPUs; the service's part of it: share
        m = s["server"][HOST]
        m["cpu_pct"] = share * 2 * (m["us"] + m["sy"])
        m["wait_pct"] = (0.2 if starved else 0.01) * s["users"] * 100.0  # of its request-seconds in flight
        m["top_thread_cpu_pct"] = 0.0
    result = explain(summary(steps, knee=4, logical=2, physical=2))
    assert ids(result) & {"cpu_saturated", "host_contended"} == expect, result["findings"]
    if "cpu_saturated" in expect:
        assert only(result, "cpu_saturated")["evidence"]["process_share"] >= 0.5
    if "host_contended" in expect:
        ev = only(result, "host_contended")["evidence"]
        assert ev["process_share"] == pytest.approx(share, rel=1e-3) and ev["threshold"] == 0.5


def test_plan_object_and_its_dict_are_both_read():
    from kneeswarm.contracts.planfile import load_plan

    plan = load_plan(None, {"name": "x", "load.wait_ms": 100.0})
    s = step(10, 100.0, 1.0)
    s["mean_ms"] = 0.0  # 100/s x (0 + 100 ms think time) = 10 users: holds only with the plan's wait_ms
    assert explain(summary([s]), plan)["littles_law"] == []
    assert explain(summary([s]), plan.to_dict())["littles_law"] == []
    assert [x["users"] for x in explain(summary([s]))["littles_law"]] == [10]


# -- each signal read with the condition that makes it mean something (no false alarm) ------------------
def test_a_one_process_python_server_is_single_thread_bound_only():
    # a real case that misfired: one-process Python model server, host half idle, one thread at 98 %,
    # vmstat r = 2.2 on 2 CPUs (vmstat itself is one of them)
    qps, p99 = [40, 75, 78, 77, 78], [26, 27, 52, 104, 207]
    steps = [step(u, q, p, us=48.0, sy=3.0, r=2.2, cs=1200.0, cpu_pct=99.0, usr_pct=96.0, sys_pct=3.0,
                  sy_share=0.03, active_threads=1.0, top_thread_cpu_pct=98.0, migrations_s=1.0, threads=3.0)
             for u, q, p in zip([1, 2, 4, 8, 16], qps, p99)]
    assert ids(explain(summary(steps, knee=2, logical=2, physical=2))) == {"single_thread_bound"}


def test_busy_threads_over_cores_only_when_they_fill_the_cores():
    # 64 threads at >= 5 % each on 32 cores: 640 % of 3200 %, the cores are not contended
    steps = healthy_steps(active_threads=lambda u: 2.0 * u, cpu_pct=lambda u: 20.0 * u)
    assert "threads_over_cores" not in ids(explain(summary(steps, knee=16, logical=64, physical=32)))
    # the same threads using 90 % of the cores' time compete for them
    steps = healthy_steps(active_threads=lambda u: 2.0 * u, cpu_pct=lambda u: 90.0 * u)
    assert "threads_over_cores" in ids(explain(summary(steps, knee=16, logical=64, physical=32)))


def test_engine_threads_that_never_compete_are_not_oversubscribed():
    # the demo target's defaults, 4 request x 1 engine threads on 2 CPUs, serving 2 users: never full
    cmd = "python -m kneeswarm.target --port 0 --mode onnx --request-threads 4"
    idle = healthy_steps(cpu_pct=lambda u: 2.0 * u, us=lambda u: 3.0, sy=lambda u: 1.0)
    assert "engine_oversubscribed" not in ids(explain(summary(idle, logical=2, physical=2, cmdline=cmd)))
    # the same configuration with the CPUs full of its work
    busy = healthy_steps(cpu_pct=lambda u: 190.0, us=lambda u: 90.0, sy=lambda u: 6.0)
    assert "engine_oversubscribed" in ids(explain(summary(busy, logical=2, physical=2, cmdline=cmd)))


def test_migrations_of_a_near_idle_process_cost_nothing():
    steps = healthy_steps(migrations_s=lambda u: 20.0 * u, cpu_pct=lambda u: 1.0 * u)
    assert "migrations_high" not in ids(explain(summary(steps, knee=16, logical=64, physical=32)))


def test_migrations_are_read_per_second_of_cpu_the_service_used():
    # the same 1,000 migrations/s: a harm to a process computing on one CPU (1,000 per CPU-second),
    # none to one spread over 32 (31 per CPU-second: a migration every 32 ms of compute)
    one = healthy_steps(migrations_s=lambda u: 1000.0, cpu_pct=lambda u: 100.0)
    many = healthy_steps(migrations_s=lambda u: 1000.0, cpu_pct=lambda u: 3200.0)
    found = explain(summary(one, knee=16, logical=64, physical=32))
    assert only(found, "migrations_high")["evidence"]["per_cpu_s"] == 1000.0
    assert "migrations_high" not in ids(explain(summary(many, knee=16, logical=64, physical=32)))


# -- the method's remaining rules (the digest's, beyond the first specified ids) -----------------------
def wall_steps(qps, cpu_pct, users=USERS, **over):
    """16 physical cores, 32 logical CPUs; the host's us + sy are the service's CPU, switches follow QPS."""
    out = []
    for u, q, c in zip(users, qps, cpu_pct):
        m = dict(us=c / 32 * 0.95, sy=c / 32 * 0.05, wa=0.0, r=c / 100 / 2, cs=5.0 * q, cpu_pct=c, sy_share=0.05,
                 active_threads=min(u, 8), top_thread_cpu_pct=min(c, 50.0), migrations_s=5.0, rss_mb=900.0)
        m.update(over)
        out.append(step(u, q, 20.0 * max(1, u / 8), **m))
    return out


def test_efficiency_falling_past_half_the_cores():
    # the memory-bandwidth wall on 16 physical cores: QPS per CPU-second 100 up to 4 users, then
    # 87.5, 57.1 and 39.0 while the service's CPU climbs from 8 to 20 CPUs
    qps, cpu = [100, 200, 400, 700, 800, 780], [100, 200, 400, 800, 1400, 2000]
    result = explain(summary(wall_steps(qps, cpu), knee=16, logical=32, physical=16))
    f = only(result, "efficiency_falling")
    assert f["steps"] == [1, 32] and f["evidence"]["qps_per_cpu_s_from"] == 100.0
    assert math.isclose(f["evidence"]["drop"], 1 - (780 / 20) / 100, rel_tol=1e-3)
    assert ids(result) == {"efficiency_falling"}


@pytest.mark.parametrize("qps,cpu,why", [
    ([100, 200, 400, 800, 1600, 3200], [100, 200, 400, 800, 1600, 3200], "linear: the same work per CPU-second"),
    ([10, 20, 40, 70, 80, 78], [2, 4, 8, 16, 28, 40], "a near-idle process: fixed costs, no wall below half the cores"),
    ([100, 200, 400, 700, 600, 500], [100, 200, 400, 800, 800, 800], "efficiency fell but the CPU did not rise"),
])
def test_efficiency_falling_stays_silent(qps, cpu, why):
    assert "efficiency_falling" not in ids(explain(summary(wall_steps(qps, cpu), knee=16, logical=32, physical=16))), why


def swing_steps(p50, p99, busy, cpu_share=1.0):
    return [step(u, q, p, us=b * 0.9, sy=b * 0.1, r=1.0, cs=900.0 * u, cpu_pct=8 * b * cpu_share, sy_share=0.05,
                 active_threads=4.0, top_thread_cpu_pct=60.0, migrations_s=5.0, rss_mb=900.0) | {"p50_ms": m}
            for u, q, m, p, b in zip(USERS, [100, 200, 380, 400, 400, 400], p50, p99, busy)]


def test_latency_swinging_with_the_cpu_full():
    # the CPUs full from 8 users; P99/P50 1.2 at 4 users, then 2.5 and 5.0: the scheduler, not a queue
    steps = swing_steps(p50=[10, 10, 10, 20, 40, 80], p99=[12, 12, 12, 50, 200, 400], busy=[12, 25, 60, 95, 97, 97])
    f = only(explain(summary(steps, knee=8)), "latency_swinging")
    assert f["steps"] == [8, 16, 32] and f["evidence"]["spread"] == 5.0 and f["evidence"]["users"] == 16
    assert f["evidence"]["spread_from"] == 1.2 and f["evidence"]["from_users"] == 4


@pytest.mark.parametrize("p50,p99,busy,share,why", [
    ([10, 10, 10, 20, 40, 80], [12, 12, 12, 22, 44, 88], [12, 25, 60, 95, 97, 97], 1.0, "a steady queue: P99/P50 1.1"),
    ([10, 10, 10, 20, 40, 80], [12, 12, 12, 50, 200, 400], [12, 25, 40, 50, 50, 50], 1.0, "the CPUs half idle"),
    ([10, 10, 10, 20, 40, 80], [12, 12, 12, 50, 200, 400], [12, 25, 60, 95, 97, 97], 0.1, "the CPUs full of others' work"),
])
def test_latency_swinging_stays_silent(p50, p99, busy, share, why):
    steps = swing_steps(p50, p99, busy, share)
    assert "latency_swinging" not in ids(explain(summary(steps, knee=8))), why


@pytest.mark.parametrize("share,full", [(0.35, False), (0.6, True)])
def test_latency_swinging_and_cpu_saturated_read_one_full_cpu(share, full):
    # "the CPUs full with the service's own work" is one definition (cpu.cpu_full_by_service): the
    # service did 35 % of a full host (over PROCESS_SHARE_MIN, under SATURATED_SHARE_MIN) -> neither
    # rule calls the CPU full; 60 % -> both do (latency_swinging once read the 25 % share alone)
    steps = swing_steps([10, 10, 10, 20, 40, 80], [12, 12, 12, 50, 200, 400], [12, 25, 60, 95, 97, 97], share)
    found = ids(explain(summary(steps, knee=8)))
    assert ("cpu_saturated" in found) is full and ("latency_swinging" in found) is full, found


def h200_gpu_samples(t0, seconds, creep_mb_per_s=0.0):
    """The H200 recording (tests/fixtures/gpu, nvidia-smi dmon while a bf16 matmul loop ran 3 s busy,
    3 s idle, 1011 MB held) from its loaded part on, repeated to cover ``seconds`` at 1 s from t0;
    ``creep_mb_per_s`` adds a known growth of the memory used, as fragmentation would."""
    from pathlib import Path

    from kneeswarm.collectors import parse_raw

    gpu = parse_raw("dmon", (Path(__file__).parent / "fixtures/gpu/dmon-pucvmet-DT.txt").read_text()).frames["gpu"]
    loaded = gpu[gpu["fb_used_mb"] > 0].reset_index(drop=True)
    reps = -(-int(seconds) // len(loaded)) + 1
    out = pd.concat([loaded] * reps, ignore_index=True).iloc[:int(seconds)].copy()
    out["t"] = t0 + np.arange(len(out), dtype=float)
    out["fb_used_mb"] += creep_mb_per_s * (out["t"] - t0)
    return out


@pytest.mark.parametrize("creep", [0.0, 16.0], ids=["recorded", "recorded-plus-creep"])
def test_gpu_memory_creep_from_the_h200_recording(tmp_path, creep):
    from kneeswarm import analysis
    from synthetic_run import HOLD, RAMP, T0, closed_loop, make_run

    users = (1, 2, 4, 8, 16)
    rd = make_run(tmp_path, closed_loop(k=4), users=users)  # the knee at 4 users, QPS flat after it
    h200_gpu_samples(T0, len(users) * (RAMP + HOLD), creep).to_csv(rd.host_dir("server-1") / "gpu.csv", index=False)
    summary = analysis.analyze(rd.path)
    peaks = [s["server"]["server-1"]["fb_peak_mb"] for s in summary["steps"]]
    result = explain(summary)
    if creep == 0.0:
        assert peaks == [1011.0] * 5  # the model loaded once and held
        # no GPU finding: busy half the time, memory held (synthetic_run's host model has its
        # own switch storm: cs/s = 1000 x users)
        assert not ids(result) & {"gpu_memory_creep", "gpu_serialized", "model_copies"}, result["findings"]
        return
    f = only(result, "gpu_memory_creep")
    assert summary["knee"]["users"] == 4 and f["steps"] == [4, 8, 16]
    # each window's last sample is (RAMP + HOLD) s after the previous step's: 16 MB/s x 2 steps x 14 s
    assert f["evidence"]["rise_mb"] == pytest.approx(creep * 2 * (RAMP + HOLD))
    assert "model_copies" not in ids(result)


# -- real runs where every rule but one must stay silent (a wrong finding costs more than none) -----------
def start_knee_run(start_demo_target, out, slots, steps, hold):
    """A real `kneeswarm run` (its own process: Locust master and a worker, local pidstat and vmstat)
    against a fresh knee-mode target with ``slots`` slots of 50 ms, started and not waited for.  A
    ramp of 0.5 s: each hold is timed from when all users run (locustfiles/steps.py), so a short
    ramp costs the steady window nothing."""
    from conftest import KNEE_SERVICE_MS, start_cli

    target = start_demo_target("--mode", "knee", "--slots", str(slots), "--service-ms", str(KNEE_SERVICE_MS))
    return start_cli("run", "--target", target.url, "--steps", ",".join(map(str, steps)), "--hold", str(hold),
                     "--ramp", "0.5", "--settle", "1", "--workers", "1", "--pid", str(target.pid),
                     "--metrics-url", target.url + "/metrics", "--out", str(out), "--name", out.name, "-q")


def load_ended(proc, out, n_steps) -> bool:
    """Whether a run started by start_knee_run has sent all its load: its steps.csv holds every
    step's end (the run then only shuts Locust down and analyses), or it has exited already."""
    from kneeswarm.contracts.rundir import RunDir

    if proc.poll() is not None:
        return True
    dirs = [p for p in out.iterdir() if (p / "steps.csv").is_file()] if out.exists() else []
    if not dirs:
        return False
    try:
        steps = RunDir(dirs[0]).read_steps()
    except Exception:  # read while being rewritten: ask again
        return False
    return len(steps) == n_steps and bool(steps["t_end"].notna().all())


def finished_summary(proc, out):
    from conftest import read_summary

    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    [run_dir] = [p for p in out.iterdir() if p.is_dir()]
    return read_summary(run_dir), run_dir


def assert_exactly_waiting_not_computing(n: object, s: dict) -> None:
    """At and after the knee (4 slots: 4 users) exactly one finding, waiting_not_computing."""
    from conftest import KNEE_SLOTS, KNEE_STEPS

    assert s["knee"]["users"] == KNEE_SLOTS, (n, s["knee"])
    assert s["verdict"]["causes"] == ["waiting_not_computing"], (n, s["verdict"])  # the cause that leads
    # at and after the knee: every valid step from 4 users on (a step the analysis did not trust,
    # e.g. Little's law off by 13 % on a host others kept full, is left out of every rule)
    late = [x["users"] for x in s["steps"] if x["valid"] and x["users"] >= KNEE_SLOTS]
    assert late[0] == KNEE_SLOTS and late[-1] == KNEE_STEPS[-1], (n, s["steps"])
    # exactly this one: io_wait too stays silent though the runs beside it write to the shared
    # disk (it once fired at wa 29 % when it read the host's wa alone): the target does no IO
    assert [(f["id"], f["steps"]) for f in s["findings"]] == [("waiting_not_computing", late)], (n, s["findings"])
    # the summary carries what explain() says, with what the noise and the causal chain add
    added = ("support", "explained_by", "consequences", "rule_severity")
    assert explain(s)["findings"] == [{k: v for k, v in f.items() if k not in added} for f in s["findings"]]


@pytest.mark.slow
def test_real_knee_target_gives_exactly_waiting_not_computing(knee_run):
    # The session's shared run (steps 1-16, 7 s held, 2 workers): built for the other tests anyway,
    # so `make test` checks it; the long test below checks two more runs, one after the other.
    from conftest import read_summary

    assert_exactly_waiting_not_computing("knee_run", read_summary(knee_run.run_dir))


@pytest.mark.long
@pytest.mark.slow
def test_real_knee_target_gives_exactly_waiting_not_computing_run_after_run(start_demo_target, tmp_path):
    # Two knee-mode runs in a row on this 2-CPU machine (3 s held), the load generator on the same
    # host: at and after the knee exactly one finding, waiting_not_computing, whatever else the host
    # ran.  Beside them an idle target (16 slots, at most 4 users: never full) gets no finding.  (The
    # session's shared run, a third of its kind, is checked by the test above, in `make test`.)
    from conftest import KNEE_SLOTS, KNEE_STEPS, side_by_side, wait_for

    # The second knee run starts as soon as the first one's load has ended (every step's end in its
    # steps.csv): its start-up (imports, Locust, agents) overlaps the first one's shutdown and
    # analysis, while the two loads still run one after the other.
    summaries = []
    with side_by_side() as started:
        started["idle"] = start_knee_run(start_demo_target, tmp_path / "idle", 16, (1, 2, 4), 3)
        for i in (1, 2):
            started[f"knee{i}"] = start_knee_run(start_demo_target, tmp_path / f"knee{i}", KNEE_SLOTS, KNEE_STEPS, 3)
            wait_for(lambda: load_ended(started[f"knee{i}"], tmp_path / f"knee{i}", len(KNEE_STEPS)), 240,
                     f"knee{i}'s load to end")
        for i in (1, 2):
            summaries.append(finished_summary(started[f"knee{i}"], tmp_path / f"knee{i}")[0])
        idle, _ = finished_summary(started["idle"], tmp_path / "idle")
    for n, s in enumerate(summaries, start=1):
        assert_exactly_waiting_not_computing(n, s)
    assert idle["complete"] is True and idle["findings"] == [], idle["findings"]
    assert idle["knee"]["users"] is None and [x["users"] for x in idle["steps"]] == [1, 2, 4]


def test_waiting_not_computing_reads_the_median_when_one_stall_holds_p99():
    # the knee-mode target on a full host, measured (4, 8, 16 users): P50 59 -> 108 -> 203 ms while
    # P99 read 226 -> 364 -> 308 ms (one scheduler stall in ~200 requests)
    rows = [(1, 18.2, 58, 140), (2, 36.4, 58, 210), (4, 71.4, 59, 226), (8, 80.4, 108, 364), (16, 79.6, 203, 308)]
    steps = [step(u, q, p99, us=88.0, sy=12.0, r=12.0, cpu_pct=3.3, wait_pct=7.0, sy_share=0.1, active_threads=0.0,
                  top_thread_cpu_pct=3.0, cs=3000.0, migrations_s=0.3, threads=2.0) | {"p50_ms": p50, "mean_ms": p50}
             for u, q, p50, p99 in rows]
    f = only(explain(summary(steps, knee=4, logical=2, physical=2)), "waiting_not_computing")
    assert (f["evidence"]["p50_ms_knee"], f["evidence"]["p50_ms_last"]) == (59, 203) and "P50 rose 3.4x" in f["text"]
    for s in steps:  # neither quantile rose 1.5x: no finding
        s["p50_ms"] = s["mean_ms"] = 59.0
        s["p99_ms"] = min(s["p99_ms"], 300.0)
    assert "waiting_not_computing" not in ids(explain(summary(steps, knee=4, logical=2, physical=2)))


def test_switch_storm_reads_the_services_own_switches():
    # the host's cs/s climbs 10x with other work while the service's own switches follow its QPS
    steps = healthy_steps(cs=lambda u: 2000.0 * u * u)
    assert "switch_storm" not in ids(explain(summary(steps, knee=4, logical=64, physical=32)))
    # the service's own: 200 -> 51,200/s from 2 to 32 users (the step before the knee to the last)
    # while QPS grew 16x
    steps = healthy_steps(cswch_s=lambda u: 50.0 * u * u, nvcswch_s=lambda u: 0.0)
    f = only(explain(summary(steps, knee=4, logical=64, physical=32)), "switch_storm")
    assert (f["evidence"]["cs_from"], f["evidence"]["cs_to"]) == (50.0 * 4, 50.0 * 32 * 32)


def test_unbounded_queue_only_beyond_what_the_users_explain():
    # measured (a 16 x 2-thread ONNX target on a busy host): P99 22 -> 233 ms from 1 to 16
    # users at 190.8 -> 221.1/s; users / throughput alone grew 13.8x, P99 10.6x: a closed loop's queue
    rows = [(1, 190.8, 22), (2, 121.1, 71), (4, 92.8, 124), (8, 111.1, 324), (16, 221.1, 233)]
    steps = [step(u, q, p) for u, q, p in rows]
    assert "unbounded_queue" not in ids(explain(summary(steps, knee=1)))
    # the same numbers from an open loop: no bound from the users, the latency did explode
    s = summary(steps, knee=1) | {"load": {"loop": "open"}}
    assert only(explain(s), "unbounded_queue")["evidence"]["growth"] == pytest.approx(233 / 22, rel=1e-3)
