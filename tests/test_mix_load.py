"""A traffic mix on the load side: each request draws its class by weight from a generator
seeded per user, is built from its class's settings, and its row records the class."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.contracts.rundir import REQUEST_SCHEMA, RunDir
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.recorder import RowBuffer

PLAN = {"protocol": "kserve", "request": {"shape": [1, 4], "classes": [
    {"name": "cheap", "weight": 3, "model": "cheap"},
    {"name": "slow", "weight": 1, "model": "slow", "shape": [1, 8]}]}}


def test_each_request_is_its_class_s_and_the_draws_are_the_weights_shares():
    plan = plan_from_dict(PLAN)
    protocol = for_plan(plan, seed=7)
    reqs = [protocol.next_request() for _ in range(20000)]
    counts = Counter(r.klass for r in reqs)
    # binomial truth: 20000 draws at p = 0.25 have a standard deviation of 61; 4 sigma is 245
    assert abs(counts["slow"] - 5000) < 245, counts
    for r in reqs[:200]:
        body = json.loads(r.body)
        expected = {"cheap": ("/v2/models/cheap/infer", [1, 4]), "slow": ("/v2/models/slow/infer", [1, 8])}[r.klass]
        assert (r.path, body["inputs"][0]["shape"]) == expected


def test_the_draws_are_reproducible_per_user_and_differ_between_users():
    plan = plan_from_dict(PLAN)
    seq = lambda seed: [p.next_request().klass for p in [for_plan(plan, seed=seed)] for _ in range(200)]  # noqa: E731
    assert seq(3) == seq(3)
    assert seq(3) != seq(4)


def test_the_row_records_the_class_and_an_old_part_without_the_column_reads_as_null(tmp_path):
    buf = RowBuffer()
    buf.on_request("POST", "infer", 5.0, 10, context={"kneeswarm_tags": (None, None, "slow")}, start_time=1.0)
    buf.on_request("POST", "infer", 5.0, 10, context={}, start_time=2.0)
    cols = buf.take()
    assert cols["class"] == ["slow", None]
    rd = RunDir.create(tmp_path, "mix")
    rd.write_request_part({**cols, "step": [0, 0], "users": [1, 1], "worker": ["w", "w"]}, 0)
    old = pa.schema([f for f in REQUEST_SCHEMA if f.name != "class"])
    pq.write_table(pa.table({f.name: pa.nulls(1, f.type) if f.name != "t_start" else pa.array([3.0])
                             for f in old}, schema=old), rd.requests_dir / "part-000001.parquet")
    df = rd.read_requests()
    assert list(df["class"].replace({np.nan: None})) == ["slow", None, None]


def test_the_knee_classes_tab_counts_each_class_s_rows_as_the_run_directory_holds_them(tmp_path):
    """The live view of a mix (the web UI's Knee classes tab) beside pandas on the same parts: each
    class's rows of every step and their share, and the last step's rows, QPS and P99 over its
    steady part (from its t_steady plus the plan's settle); rows without a class (an open loop's
    dropped arrival) count in no class."""
    from kneeswarm.launch.lifecycle import Lifecycle

    plan = plan_from_dict({**PLAN, "load": {"steps": [1, 2], "settle": 1.0}})
    rd = RunDir.create(tmp_path, "mix")
    rd.plan_path.write_text(plan.to_toml())
    rng = np.random.default_rng(5)
    t0 = 1_700_000_000.0
    rd.write_steps([[0, 1, t0, t0 + 1.0, t0 + 6.0], [1, 2, t0 + 6.0, t0 + 7.0, ""]])
    for i, (lo, hi, n) in enumerate(((t0, t0 + 6.0, 600), (t0 + 6.0, t0 + 11.0, 900))):
        klass = rng.choice(np.array(["cheap", "slow", None], dtype=object), n, p=[0.7, 0.28, 0.02])
        rd.write_request_part({"t_start": np.sort(rng.uniform(lo, hi, n)).tolist(),
                               "latency_ms": rng.lognormal(3.0, 0.5, n).tolist(), "ok": (rng.random(n) > 0.05).tolist(),
                               "status": [200] * n, "step": [i] * n, "users": [i + 1] * n, "worker": ["w"] * n,
                               "name": ["infer"] * n, "class": klass.tolist()}, i)
    view = Lifecycle(plan, rd).live()
    rows = rd.read_requests()
    with_class = rows[rows["class"].notna()]
    last = rows[rows["step"] == 1]
    t_from = t0 + 7.0 + 1.0
    steady = last[last["t_start"] >= t_from]
    span = steady["t_start"].max() - t_from
    shown = {r["class"]: r for r in view["classes"]}
    assert list(shown) == ["cheap", "slow"]
    for name, weight_pct in (("cheap", 75.0), ("slow", 25.0)):
        r = shown[name]
        mine = steady[steady["class"] == name]
        assert r["weight_pct"] == weight_pct and (r["step"], r["users"]) == (1, 2)
        assert r["requests"] == int((with_class["class"] == name).sum())
        assert r["share_pct"] == round(100.0 * r["requests"] / len(with_class), 1)
        assert r["step_requests"] == int((last["class"] == name).sum())
        assert r["errors"] == int(((last["class"] == name) & ~last["ok"]).sum())
        assert r["qps"] == round(len(mine) / span, 1)
        assert r["p99_ms"] == round(float(np.percentile(mine.loc[mine["ok"], "latency_ms"], 99)), 1)
    assert sum(r["requests"] for r in shown.values()) == len(with_class) < len(rows)


def test_locust_names_a_class_s_request_apart_and_the_row_keeps_the_request_s_name():
    from kneeswarm.locustfiles.protocols.base import request_name

    buf = RowBuffer()
    buf.on_request("POST", request_name("slow"), 5.0, 10, context={"kneeswarm_tags": (None, None, "slow")}, start_time=1.0)
    buf.on_request("POST", request_name(None), 5.0, 10, context={}, start_time=2.0)
    cols = buf.take()
    assert (request_name("slow"), request_name(None)) == ("infer slow", "infer")
    assert cols["name"] == ["infer", "infer"] and cols["class"] == ["slow", None]
