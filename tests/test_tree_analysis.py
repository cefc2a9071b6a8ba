"""The analysis of a service of several processes: per-step figures of each process, the host
section's tree (which processes were watched, how found, one line each), and the rules that name
a process (model_copies, the soak's growth rules); the plan's ``scope``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kneeswarm.analysis.findings import explain
from kneeswarm.analysis.measure.hostfacts import host_facts, host_lines, service_tree
from kneeswarm.analysis.measure.serverstats import server_metrics, tree_metrics
from kneeswarm.analysis.schema.summary import undeclared_keys
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from tests.test_findings import HOST, USERS, healthy_server, ids, only, step, summary


def tree_table(rows):
    cols = ["t", "pid", "ppid", "name", "role", "cpu_pct", "rss_mb", "threads", "cswch_s", "nvcswch_s", "wait_pct",
            "cmdline"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)


def listener_and_workers():
    """A listener (pid 10) at 2 % and workers: 11 through the run at 90 %, 12 replaced by 13 at t = 3."""
    rows = []
    for t in range(1, 7):
        rows.append([float(t), 10, 1, "srv", "listener", 2.0, 40.0, 3, 1, 0, 0, "srv --listen" if t == 1 else None])
        rows.append([float(t), 11, 10, "srv", "worker", 90.0, 30.0 + t, 1, 1, 0, 0, "srv --worker" if t == 1 else None])
        pid = 12 if t <= 3 else 13
        rows.append([float(t), pid, 10, "srv", "worker", 60.0, 25.0, 1, 1, 0, 0, "srv --worker" if t in (1, 4) else None])
    return tree_table(rows)


def test_each_process_per_step_over_the_part_of_the_window_it_lived():
    got = tree_metrics(listener_and_workers(), np.array([1.0, 2.0]), np.array([7.0, 4.0]))
    whole, part = got
    assert whole["processes"] == 3.0  # three at every sample: the replacement took the place
    assert set(whole["procs"]) == {"10", "11", "12", "13"}
    assert whole["procs"]["11"] == {"cpu_pct": 90.0, "rss_mb": pytest.approx(33.5), "threads": 1.0}
    assert whole["procs"]["13"]["cpu_pct"] == 60.0  # its own samples, not diluted by the time before it was born
    assert set(part["procs"]) == {"10", "11", "12"}
    assert tree_metrics(None, np.array([0.0]), np.array([1.0])) == [{}]


def test_the_service_is_the_sum_of_its_processes_at_each_sample():
    # pidstat's process table: one row per process per sample; the window's mean of the sums
    process = pd.DataFrame({"t": [1.0, 1.0, 2.0, 2.0], "pid": [10, 11, 10, 12], "cpu_pct": [2.0, 90.0, 3.0, 95.0]})
    [m] = server_metrics({HOST: {"process": process}}, np.array([0.0]), np.array([3.0]))
    assert m[HOST]["cpu_pct"] == pytest.approx((92.0 + 98.0) / 2)


def test_the_tree_facts_say_which_processes_and_their_lines_one_each():
    tree = service_tree(listener_and_workers(), "tree")
    assert tree["count"] == 4 and tree["at_once"] == 3 and tree["scope"] == "tree"
    assert [p["pid"] for p in tree["processes"]] == [11, 12, 13, 10]  # the busiest first
    w = tree["processes"][0]
    assert (w["ppid"], w["role"], w["cmdline"], w["cpu_pct"], w["rss_mb"]) == (10, "worker", "srv --worker", 90.0, 36.0)
    assert tree["processes"][1]["t_last"] == 3.0 and tree["processes"][2]["t_first"] == 4.0
    meta = {"hosts": {HOST: {"facts": {"process": {"pid": 10, "cmdline": "srv --listen", "by": "port", "scope": "tree",
                                                   "member_count": 3}}}}}
    facts = host_facts(meta, trees={HOST: listener_and_workers()})[HOST]
    lines = host_lines(HOST, facts)
    assert any(line.startswith("monitored service: the process tree of pid 10") and "chosen by port" in line
               for line in lines), lines
    assert "watched: 4 processes, 3 at most at once; the service's figures are their sums" in lines
    mine = [line for line in lines if line.startswith("process ")]
    assert len(mine) == 4 and mine[0].startswith("process 11 (parent 10, worker): 90.0 % CPU")
    assert "seen from +0 s to +2 s of 5 s" in mine[1] and "seen from +3 s" in mine[2]
    assert undeclared_keys({"hosts": {HOST: facts}}) == []
    assert undeclared_keys({"hosts": {HOST: {"tree": {**tree, "oops": 1}}}}) == [f"hosts.{HOST}.tree.oops"]


def test_a_run_from_before_the_tree_reads_as_it_did():
    meta = {"hosts": {HOST: {"facts": {"process": {"pid": 10, "cmdline": "srv", "by": "pid"}}}}}
    facts = host_facts(meta)[HOST]
    assert "tree" not in facts
    assert host_lines(HOST, facts)[1] == "monitored process: pid 10 (chosen by pid): `srv`"


def test_host_contended_names_the_service_and_what_is_outside_it():
    # a full 2-CPU host of which the service (3 processes) did a tenth, its threads waiting for a CPU
    steps = [step(u, 10.0 * min(u, 4), 50.0, us=85.0, sy=14.0, r=9.0, cpu_pct=20.0, wait_pct=40.0 * u,
                  processes=3.0, threads=6.0, active_threads=0.0, top_thread_cpu_pct=10.0) for u in (1, 2, 4, 8)]
    result = explain(summary(steps, knee=4, logical=2, physical=2))
    f = only(result, "host_contended")
    assert "the monitored service (its 3 processes) did only 10% of that work: processes outside it" in f["text"]
    assert f["evidence"]["processes"] == 3.0


def test_model_copies_names_the_process_whose_own_memory_grew():
    steps = [step(u, 50.0 * u, 20.0, **healthy_server(u, rss_mb=300.0 + 120.0 * u,
                                                      procs={"10": {"rss_mb": 100.0}, "11": {"rss_mb": 200.0 + 120.0 * u}}))
             for u in USERS]
    s = summary(steps, logical=64, physical=32)
    s["hosts"][HOST]["tree"] = {"processes": [{"pid": 11, "role": "worker"}, {"pid": 10, "role": "listener"}]}
    f = only(explain(s), "model_copies")
    assert "most in process 11 (worker), 320 -> 4,040 MB" in f["text"]
    assert (f["evidence"]["process_pid"], f["evidence"]["process_role"]) == (11, "worker")
    # a service of one process: its figure is that process's, nothing more to name
    for st in steps:
        st["server"][HOST]["procs"] = {"10": {"rss_mb": st["server"][HOST]["rss_mb"]}}
    assert "process_pid" not in only(explain(summary(steps, logical=64, physical=32)), "model_copies")["evidence"]
    assert ids(explain(summary(steps, logical=64, physical=32))) == {"model_copies"}


@pytest.mark.parametrize("where,value,ok", [("monitor", "cgroup", True), ("monitor", "pod", False),
                                            ("hosts", "process", True), ("hosts", "tree ", False)])
def test_the_plan_scope(where, value, ok):
    doc = {"target": "http://127.0.0.1:8000", "load": {"steps": [1, 2]}}
    if where == "monitor":
        doc["monitor"] = {"scope": value}
    else:
        doc["hosts"] = [{"name": "a", "port": 8000, "scope": value}]
    if ok:
        plan = plan_from_dict(doc)
        assert (plan.monitor.scope if where == "monitor" else plan.hosts[0].scope) == value
        return
    with pytest.raises(PlanError) as e:
        plan_from_dict(doc)
    assert "scope must be one of tree, cgroup, process" in str(e.value) and "\n" not in str(e.value)


def test_the_default_scope_is_the_tree():
    assert plan_from_dict({"target": "http://127.0.0.1:8000", "load": {"steps": [1, 2]}}).monitor.scope == "tree"
