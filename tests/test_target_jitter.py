"""The demo target's --jitter: its knee and usl modes' service time made noisy on purpose, seeded.

The expected figures are the noise's definition (lognormal factors of mean 1 and log-spread J, one
per request and one per period), measured with numpy on the factors drawn and, for the real target,
on the latencies a client measures of requests sent one at a time.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import requests

from kneeswarm.target.jitter import Jitter

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}]}


def test_factors_have_mean_one_and_the_spread_asked_for():
    per_request = Jitter(0.3, period_s=0.0, seed=1)
    f = np.array([per_request.factor(0.0) for _ in range(20_000)])
    assert f.mean() == pytest.approx(1.0, abs=0.01) and np.log(f).std() == pytest.approx(0.3, rel=0.03)
    both = Jitter(0.3, period_s=1.0, seed=1)
    g = np.array([both.factor(t * 0.01) for t in range(200_000)])  # 2,000 periods of 100 requests
    assert g.mean() == pytest.approx(1.0, abs=0.03) and np.log(g).std() == pytest.approx(0.3 * np.sqrt(2), rel=0.05)


def test_the_slow_part_holds_for_a_period_and_repeats_with_its_seed():
    a, b, c = Jitter(0.5, 2.0, seed=7), Jitter(0.5, 2.0, seed=7), Jitter(0.5, 2.0, seed=8)
    first = [a.slow(t) for t in (100.0, 100.5, 101.9)]  # counted from the first request: period 0
    assert first[0] == first[1] == first[2] != a.slow(102.0)
    assert [b.slow(t) for t in (100.0, 101.0, 102.5, 107.0)] == [a.slow(t) for t in (100.0, 101.0, 102.5, 107.0)]
    assert c.slow(100.0) != a.slow(100.0)
    assert Jitter(0.5, 2.0, 7).factor(0.0) == Jitter(0.5, 2.0, 7).factor(0.0)
    assert Jitter(0.0).factor(1.0) == 1.0 and Jitter(0.5, 0.0).slow(1.0) == 1.0


@pytest.mark.long
@pytest.mark.slow
def test_the_real_target_answers_with_the_noise(start_demo_target):
    """One request at a time to the knee target (1 slot, 40 ms, --jitter 0.25 per request only): its
    own mean request duration (/metrics) stays 40 ms (noise of mean 1), the log-spread of the
    latencies a client sees is about the noise's (the round trip's few ms narrow it a little), and
    /metrics says the settings.  Without --jitter the spread is the round trip's alone."""
    spreads = {}
    for jitter in ("0.25", "0"):
        target = start_demo_target("--mode", "knee", "--slots", "1", "--service-ms", "40", "--jitter", jitter,
                                   "--jitter-period", "0", "--jitter-seed", "3")
        with requests.Session() as s:
            lat = []
            for _ in range(150):
                t0 = time.perf_counter()
                assert s.post(target.url + "/v2/models/demo/infer", json=BODY, timeout=5).status_code == 200
                lat.append((time.perf_counter() - t0) * 1000)
        m = target.metrics()
        mean_s = m["kneeswarm_target_request_duration_seconds_sum"] / m["kneeswarm_target_request_duration_seconds_count"]
        assert mean_s * 1000 == pytest.approx(40.0, rel=0.1)
        assert any('jitter="0.25"' in k for k in m) == (jitter == "0.25")
        spreads[jitter] = float(np.log(lat).std())
        target.stop()
    assert spreads["0.25"] == pytest.approx(0.25, rel=0.35) and spreads["0"] < 0.1


def test_jitter_on_the_onnx_mode_is_refused_in_one_line():
    res = subprocess.run([sys.executable, "-m", "kneeswarm.target", "--mode", "onnx", "--jitter", "0.2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "--jitter is for --mode knee and usl" in res.stderr
