"""The demo target's request-duration histogram counts every served tensor request, whichever of
its protocols carried it (KServe v2, TorchServe, TF Serving): its count equals the requests the
test sent and got 200 for, and its sum lies between the clients' own latencies' bounds."""

from __future__ import annotations

import json
import time

import pytest
import requests

pytestmark = pytest.mark.slow

BODY = [[0.25] * 64]


def test_every_served_tensor_request_is_in_the_duration_histogram(start_demo_target):
    target = start_demo_target("--work", "1")
    sends = [("/v2/models/demo/infer", {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                                                    "data": BODY[0]}]}),
             ("/predictions/demo", {"data": BODY}),
             ("/v1/models/demo:predict", {"instances": BODY})]
    before = target.metrics()
    n0 = before.get("kneeswarm_target_request_duration_seconds_count", 0.0)
    s0 = before.get("kneeswarm_target_request_duration_seconds_sum", 0.0)
    took = []
    for path, body in sends * 4:
        t = time.perf_counter()
        r = requests.post(target.url + path, data=json.dumps(body), timeout=10)
        took.append(time.perf_counter() - t)
        assert r.status_code == 200, (path, r.text)
    after = target.metrics()
    assert after["kneeswarm_target_request_duration_seconds_count"] - n0 == len(took) == 12
    inside = after["kneeswarm_target_request_duration_seconds_sum"] - s0
    assert 0 < inside < sum(took)  # time inside the server is part of each client's round trip
