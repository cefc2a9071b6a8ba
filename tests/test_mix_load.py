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
