"""The demo target's `--mode usl`: a ground truth whose closed-loop throughput follows the USL.

Truth here is the law written out in this file (T·(1 + σ(N−1) + κN(N−1)), N* = √((1−σ)/κ)),
never the module's own formula; the real-run test fits the throughput kneeswarm measured on the
real target with kneeswarm.analysis.models.usl.fit_usl and compares the fitted σ, κ and N* with the target's.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess

import pytest

from kneeswarm.launch.cli import start_target, stop_target
from kneeswarm.target.engine import UslEngine, Warmup, usl_efficiency_users, usl_service_s, warmup_extra_s
from kneeswarm.target.metrics import TargetMetrics
from tests.conftest import KNEESWARM, REPO, read_summary


def closed_form_ms(n: int, t_ms: float, sigma: float, kappa: float) -> float:
    return t_ms + t_ms * sigma * (n - 1) + t_ms * kappa * n * (n - 1)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 40])
@pytest.mark.parametrize("sigma,kappa", [(0.0, 0.0), (0.3, 0.02), (0.05, 0.001), (1.0, 0.0)])
def test_service_time_is_the_usl_closed_form(n, sigma, kappa):
    assert usl_service_s(n, 0.08, sigma, kappa) * 1000 == pytest.approx(closed_form_ms(n, 80.0, sigma, kappa))
    # N users each always in service: X(N) = N / service time = the USL with λ = 1/T
    x = n / usl_service_s(n, 0.08, sigma, kappa)
    assert x == pytest.approx(n * 12.5 / (1 + sigma * (n - 1) + kappa * n * (n - 1)))


@pytest.mark.parametrize("sigma,kappa", [(0.0, 0.01), (0.02, 0.002), (0.05, 0.0025)])
def test_the_efficiency_knee_is_where_the_served_rates_marginal_gain_falls_that_low(sigma, kappa):
    """usl_efficiency_users against numpy: X(N) from usl_service_s on a fine grid, its slope by
    np.gradient over X/N, the first N where that falls under 0.6."""
    import numpy as np

    n = np.arange(1.0, 200.0, 0.001)
    x = n / usl_service_s(n, 1.0, sigma, kappa)  # type: ignore[arg-type]  # the formula, elementwise
    crossing = n[np.argmax(np.gradient(x, n) / (x / n) < 0.6)]
    assert usl_efficiency_users(sigma, kappa, 0.6) == pytest.approx(crossing, abs=0.002)


def test_warmup_extra_falls_linearly_to_zero():
    assert warmup_extra_s(0.0, 4.0, 0.2) == pytest.approx(0.2)
    assert warmup_extra_s(1.0, 4.0, 0.2) == pytest.approx(0.15)
    assert warmup_extra_s(3.0, 4.0, 0.2) == pytest.approx(0.05)
    assert warmup_extra_s(4.0, 4.0, 0.2) == 0.0 and warmup_extra_s(9.0, 4.0, 0.2) == 0.0
    assert warmup_extra_s(0.0, 0.0, 0.2) == 0.0  # no warm-up asked
    w = Warmup(4.0, 0.2)
    assert w.extra(100.0) == pytest.approx(0.2) and w.extra(102.0) == pytest.approx(0.1)  # from the first


def test_engine_samples_n_at_each_requests_start():
    """k requests that start together: the i-th to start sees i in service (itself included) and
    sleeps T·g(i); measured on the real engine and event loop, not the formula."""
    t_s, sigma, kappa, k = 0.05, 0.2, 0.05, 5
    engine = UslEngine(TargetMetrics({"mode": "usl"}, workers=0, queue_capacity=0), t_s, sigma, kappa)

    async def burst() -> list[float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one() -> float:
            await engine.infer()
            return loop.time() - t0

        return await asyncio.gather(*(one() for _ in range(k)))

    took = asyncio.run(burst())
    for i, d in enumerate(took, start=1):  # gather starts them in order
        assert d * 1000 == pytest.approx(closed_form_ms(i, 50.0, sigma, kappa), abs=15), (i, took)


# S, K and T chosen so that the run is short and the fit well conditioned on a loaded 2-core
# machine: T long beside the client's turn-around (1-10 ms per request on a busy host, which reads
# as a lower σ: at T = 80 ms one run gave σ 0.248), σ large enough that what is left moves it
# little, N* = √(0.7/0.02) = 5.9 users with steps on both sides of it, the retrograde region clear.
USL_SIGMA, USL_KAPPA, USL_SERVICE_MS = 0.3, 0.02, 200
USL_STEPS = (1, 2, 4, 6, 8, 11)
# Every step is fitted, the last one too: after the last step's window its load goes on until the
# requests in flight complete (locustfiles/steps.py, the drain), so its rows are all recorded.  A tail step
# of 14 users used to absorb the requests cut at the end (its QPS read low by R / window); without
# it, 11 users as the last step read 8.72/s, as they did with the tail after them (truth 8.87/s).
USL_FIT_STEPS = USL_STEPS


@pytest.mark.long
@pytest.mark.slow
def test_fit_usl_recovers_the_usl_targets_sigma_kappa_and_peak(tmp_path):
    proc, url = start_target(["--mode", "usl", "--sigma", str(USL_SIGMA), "--kappa", str(USL_KAPPA),
                              "--service-ms", str(USL_SERVICE_MS)])
    try:
        plan = tmp_path / "plan.toml"
        plan.write_text("[analysis]\nmin_requests = 10\n")  # the fit needs QPS, not P99: low N is few rows
        res = subprocess.run([KNEESWARM, "run", str(plan), "--target", url, "--steps", ",".join(map(str, USL_STEPS)),
                              "--hold", "5", "--ramp", "0.5", "--settle", "1", "--workers", "1",
                              "--out", str(tmp_path / "out"), "--name", "usl", "-q"],
                             capture_output=True, text=True, timeout=240, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        stop_target(proc)
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "out").iterdir()
    steps = [s for s in read_summary(run_dir)["steps"] if s["users"] in USL_FIT_STEPS]
    assert [s["users"] for s in steps] == list(USL_FIT_STEPS), steps
    for s in steps:  # validity is the tool's own judgement (e.g. generator CPU on a loaded host): shown, not required
        print(f"{s['users']} users: {s['qps']:.2f}/s, valid {s['valid']} {s['reasons']}")

    from kneeswarm.analysis.models.usl import fit_usl

    fit = fit_usl([s["users"] for s in steps], [s["qps"] for s in steps])
    n_star = math.sqrt((1 - USL_SIGMA) / USL_KAPPA)
    print(f"usl target: σ {fit['sigma']:.3f} (true {USL_SIGMA}), κ {fit['kappa']:.4f} (true {USL_KAPPA}), "
          f"N* {fit['n_star']:.2f} (true {n_star:.2f}), λ {fit['lambda']:.2f} (true {1000 / USL_SERVICE_MS}), "
          f"R² {fit['r2']:.4f}")
    assert fit["sigma"] == pytest.approx(USL_SIGMA, rel=0.15)
    assert fit["kappa"] == pytest.approx(USL_KAPPA, rel=0.15)
    assert fit["n_star"] == pytest.approx(n_star, rel=0.10)
    # retrograde past N*: the measured QPS falls from the step nearest N* to the last fitted one
    by_users = {s["users"]: s["qps"] for s in steps}
    assert by_users[11] < by_users[6]
