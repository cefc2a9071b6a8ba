"""Analysis against run directories generated from a ground-truth model.

The model is a closed-loop server with K slots and service time S: with N users,
qps = min(N, K) * 1000 / S and, by Little's law, latency = S * max(1, N / K) (times a
lognormal jitter).  A retrograde variant loses 23 % of its QPS at 32 users after 16, as in
the source article.  Tests are named after the curve they check.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import analysis
from analysis.knee import find_knee, find_latency_knee, find_peak
from analysis.steps import step_stats
from kneeswarm.plan import AnalysisPlan, LoadPlan, Plan
from kneeswarm.rundir import RunDir

T0 = 1_700_000_000.0
RAMP, HOLD, SETTLE = 2.0, 12.0, 2.0
S_MS = 10.0


def closed_loop(k: int, s_ms: float = S_MS) -> Callable[[int], tuple[float, float]]:
    """users -> (qps, mean latency ms) of a server with k slots."""
    return lambda n: (min(n, k) * 1000.0 / s_ms, s_ms * max(1.0, n / k))


def retrograde(k: int = 16, drop: float = 0.23, s_ms: float = S_MS) -> Callable[[int], tuple[float, float]]:
    """Linear up to k users, then QPS falls by ``drop`` at 2k (latency from Little's law)."""
    def model(n: int) -> tuple[float, float]:
        q = min(n, k) * 1000.0 / s_ms * ((1 - drop) if n > k else 1.0)
        return q, n / q * 1000.0
    return model


def make_run(tmp_path: Path, model: Callable[[int], tuple[float, float]], users=(1, 2, 4, 8, 16), *,
             seed: int = 0, noise: float = 0.03, min_requests: int = 100, complete: bool = True,
             last_t_end: bool = True, meta: bool = True, error_plan: dict | None = None,
             generator_cpu: dict[int, float] | None = None, hosts: bool = True) -> RunDir:
    """A synthetic run directory: steps, request parts (one per step), generator and host CSVs."""
    rng = np.random.default_rng(seed)
    rd = RunDir.create(tmp_path, "synthetic")
    plan = Plan(load=LoadPlan(steps=list(users), ramp=RAMP, hold=HOLD, settle=SETTLE),
                analysis=AnalysisPlan(min_requests=min_requests))
    rd.plan_path.write_text(plan.to_toml())
    steps, t = [], T0
    for i, n in enumerate(users):
        t_ramp, t_steady, t_end = t, t + RAMP, t + RAMP + HOLD
        steps.append([i, n, t_ramp, t_steady, t_end if (last_t_end or i < len(users) - 1) else ""])
        qps, lat = model(n)
        qps *= 1 + rng.uniform(-noise, noise)
        count = int(qps * (t_end - t_ramp))
        ts = np.sort(rng.uniform(t_ramp, t_end, count))
        latency = lat * rng.lognormal(0.0, 0.1, count)
        latency[ts < t_steady + SETTLE] *= 3.0  # ramp/settle rows look different: wrong windows show
        ok = np.ones(count, dtype=bool)
        error: list[str | None] = [None] * count
        for category, n_err in (error_plan or {}).get(i, {}).items():
            free = np.flatnonzero(ok & (ts >= t_steady + SETTLE))
            pick = rng.choice(free, n_err, replace=False)
            ok[pick] = False
            for j in pick:
                error[j] = None if category == "null" else category
        rd.write_request_part({
            "t_start": ts.tolist(), "latency_ms": latency.tolist(), "ok": ok.tolist(),
            "status": np.where(ok, 200, 503).tolist(), "error": error, "step": [i] * count,
            "users": [n] * count, "worker": ["w1"] * count, "name": ["infer"] * count,
        }, seq=i)
        t = t_end
    rd.write_steps(steps)
    secs = np.arange(T0, t, 1.0)
    step_of = np.searchsorted([s[2] for s in steps], secs, side="right") - 1
    users_at = np.asarray(users)[step_of]
    gcpu = np.array([(generator_cpu or {}).get(int(i), 30.0) for i in step_of])
    from kneeswarm.rundir import write_csv
    write_csv(rd.generator_dir / "w1.csv", ("t", "cpu_pct", "rss_mb", "users", "lag_ms"),
              zip(secs, gcpu, [80.0] * len(secs), users_at, [1.0] * len(secs)))
    if hosts:
        busy = np.minimum(users_at, 4) / 4
        hd = rd.host_dir("server-1")
        write_csv(hd / "vmstat.csv", ("t", "r", "b", "us", "sy", "id", "wa", "cs"),
                  zip(secs, users_at * 1.0, [0] * len(secs), 70 * busy, 10 * busy, 100 - 80 * busy,
                      [0] * len(secs), 1000 * users_at))
        write_csv(hd / "process.csv", ("t", "pid", "cpu_pct", "rss_mb", "threads", "cswch_s", "migrations_s"),
                  zip(secs, [4242] * len(secs), 300 * busy, [500.0] * len(secs), users_at + 2,
                      50 * users_at, 5 * users_at))
    if meta:
        rd.update_meta(run_id=rd.path.name, complete=complete, ended="finished" if complete else "crashed")
    return rd


def steady_rows(rd: RunDir, step: int) -> pd.DataFrame:
    """The steady rows of one step, selected here independently of analysis.steps."""
    df = pd.concat([pq.read_table(p).to_pandas() for p in rd.request_parts()], ignore_index=True)
    st = pd.read_csv(rd.steps_path)
    row = st[st["index"] == step].iloc[0]
    lo = row["t_steady"] + SETTLE
    hi = row["t_end"] if not math.isnan(row["t_end"]) else (df["t_start"] + df["latency_ms"] / 1000).max()
    return df[(df["t_start"] >= lo) & (df["t_start"] < hi)]


def strict_json(path: Path) -> dict:
    def no_constant(name: str):
        raise AssertionError(f"{path} contains {name}")
    return json.loads(path.read_text(), parse_constant=no_constant)


# -- knee on whole run directories -------------------------------------------------------------
def test_plateau_knee_at_4(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4))
    s = analysis.analyze(rd.path)
    assert s["knee"]["users"] == 4
    assert s["knee"]["method"] in ("kneedle", "saturation")
    assert s["peak"]["users"] in (4, 8, 16)
    assert s["peak"]["qps"] == pytest.approx(400, rel=0.05)
    assert [st["valid"] for st in s["steps"]] == [True] * 5


def test_plateau_latency_knee_at_4(tmp_path):
    s = analysis.analyze(make_run(tmp_path, closed_loop(k=4)).path)
    assert s["latency_knee"]["users"] == 4
    assert s["latency_knee"]["took_off_users"] == 8


def test_retrograde_knee_at_16(tmp_path):
    rd = make_run(tmp_path, retrograde(k=16), users=(1, 2, 4, 8, 16, 32))
    s = analysis.analyze(rd.path)
    assert s["knee"]["users"] == 16
    assert s["peak"]["users"] == 16
    assert s["steps"][-1]["qps"] == pytest.approx(0.77 * s["steps"][-2]["qps"], rel=0.08)


def test_linear_has_no_knee(tmp_path):
    s = analysis.analyze(make_run(tmp_path, closed_loop(k=64), users=(1, 2, 4, 8, 16)).path)
    assert s["knee"] == {"users": None, "qps": None, "method": "none", "kneedle_users": s["knee"]["kneedle_users"]}
    assert s["peak"]["users"] == 16


# -- knee on curves (pure) ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_plateau_curve_with_noise_knee_at_4(seed):
    rng = np.random.default_rng(seed)
    qps = np.array([20, 40, 80, 80, 80]) * (1 + rng.uniform(-0.03, 0.03, 5))
    assert find_knee([1, 2, 4, 8, 16], qps)["users"] == 4


@pytest.mark.parametrize("seed", range(20))
def test_retrograde_curve_with_noise_knee_at_16(seed):
    rng = np.random.default_rng(seed)
    qps = np.array([10, 20, 40, 80, 160, 123.2]) * (1 + rng.uniform(-0.03, 0.03, 6))
    assert find_knee([1, 2, 4, 8, 16, 32], qps)["users"] == 16


@pytest.mark.parametrize(
    "name, users, qps, knee",
    [
        ("flat_from_start_knee_at_1", [1, 2, 4, 8, 16], [20, 20.5, 19.8, 20.1, 20], 1),
        ("plateau_at_last_but_one_knee_at_8", [1, 2, 4, 8, 16], [20, 40, 80, 160, 160], 8),
        ("plateau_between_steps_knee_at_8", [1, 2, 4, 8, 16], [20, 40, 80, 120, 120], 8),
        ("linear_no_knee", [1, 2, 4, 8, 16], [20, 40, 80, 160, 320], None),
        ("temporary_stall_no_knee", [1, 2, 4, 8, 16, 32], [20, 40, 80, 85, 170, 340], None),
        ("single_step_no_knee", [4], [80], None),
    ],
)
def test_knee_on_curve(name, users, qps, knee):
    got = find_knee(users, qps)
    assert got["users"] == knee, (name, got)
    assert (got["method"] == "none") == (knee is None)


def test_convex_p99_curve_latency_knee_at_4():
    got = find_latency_knee([1, 2, 4, 8, 16], [10, 10.4, 10.9, 21, 42])
    assert got["users"] == 4 and got["took_off_users"] == 8 and got["p99_ms"] == 10.9


def test_peak_is_the_max_qps_step():
    assert find_peak([1, 2, 4, 8], [10, 30, 25, float("nan")]) == {"users": 2, "qps": 30.0}


# -- per-step statistics ----------------------------------------------------------------------
def test_percentiles_equal_numpy_on_steady_rows(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), error_plan={2: {"timeout": 7}})
    s = analysis.analyze(rd.path)
    for i in range(5):
        rows = steady_rows(rd, i)
        ok = rows[rows["ok"]]
        lat = ok["latency_ms"].to_numpy()
        st = s["steps"][i]
        assert st["requests"] == len(rows)
        assert st["p50_ms"] == np.percentile(lat, 50)
        assert st["p95_ms"] == np.percentile(lat, 95)
        assert st["p99_ms"] == np.percentile(lat, 99)
        assert st["p999_ms"] == np.percentile(lat, 99.9)
        assert st["mean_ms"] == pytest.approx(lat.mean(), rel=1e-12)
        assert st["qps"] == pytest.approx(len(ok) / (HOLD - SETTLE), rel=1e-12)


def test_errors_counted_by_category(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), error_plan={1: {"timeout": 5, "http_5xx": 11, "null": 2}})
    s = analysis.analyze(rd.path)
    st = s["steps"][1]
    assert st["errors"] == {"http_5xx": 11, "other": 2, "timeout": 5}
    assert st["error_rate"] == pytest.approx(18 / st["requests"])
    assert s["steps"][0]["errors"] == {} and s["steps"][0]["error_rate"] == 0
    assert s["totals"]["errors"] == 18


def test_step_below_min_requests_is_invalid(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), min_requests=1500)
    s = analysis.analyze(rd.path)
    first = s["steps"][0]  # ~100 qps x 10 s steady
    assert first["valid"] is False
    assert first["reasons"] == [
        f"only {first['requests']} requests in the steady window (< 1500): P99 not trustworthy"
    ]
    assert s["steps"][1]["valid"] is True  # ~200 qps x 10 s
    assert s["totals"]["valid_steps"] == 4


def test_generator_cpu_97_invalidates_step(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), generator_cpu={3: 97.0})
    s = analysis.analyze(rd.path)
    bad = s["steps"][3]
    assert bad["valid"] is False
    assert bad["reasons"] == ["load generator CPU 97% > 90% (worker w1): "
                              "the generator, not the server, may be the bottleneck"]
    assert bad["generator"]["cpu_pct"]["w1"] == pytest.approx(97.0)
    assert all(st["valid"] for i, st in enumerate(s["steps"]) if i != 3)
    assert s["knee"]["users"] == 4  # the knee uses valid steps only


def test_server_metrics_averaged_over_steady_window(tmp_path):
    s = analysis.analyze(make_run(tmp_path, closed_loop(k=4)).path)
    srv = s["steps"][1]["server"]["server-1"]  # 2 users: busy = 0.5
    assert srv["us"] == pytest.approx(35.0) and srv["sy"] == pytest.approx(5.0)
    assert srv["cs"] == pytest.approx(2000.0) and srv["r"] == pytest.approx(2.0)
    assert srv["cpu_pct"] == pytest.approx(150.0) and srv["threads"] == pytest.approx(4.0)
    assert "sm_pct" not in srv  # no gpu.csv


def test_step_stats_missing_t_end_uses_next_ramp():
    req = pd.DataFrame({"t_start": [0.5, 3.0, 3.5, 5.5, 6.0], "latency_ms": [1.0, 2.0, 3.0, 4.0, 5.0],
                        "ok": [True] * 5, "error": [None] * 5})
    steps = pd.DataFrame({"index": [0, 1], "users": [1, 2], "t_ramp": [0.0, 5.0], "t_steady": [1.0, 5.0],
                          "t_end": [float("nan"), float("nan")]})
    st = step_stats(req, steps, settle=1.0)
    assert list(st["t_hi"]) == [5.0, 6.005]
    assert list(st["requests"]) == [2, 1]  # [2, 5) and [6, 6.005)
    assert st["qps"].iloc[0] == pytest.approx(2 / 3)


# -- partial run directories ------------------------------------------------------------------
def test_partial_run_without_meta_or_last_t_end(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), last_t_end=False, meta=False)
    s = analysis.analyze(rd.path)
    assert s["complete"] is False
    last = s["steps"][-1]
    rows = steady_rows(rd, 4)
    assert last["requests"] == len(rows)  # the window ends at the last request's completion
    assert last["valid"] is True
    assert "INCOMPLETE" in (rd.report_dir / "summary.md").read_text()
    assert "INCOMPLETE" in (rd.report_dir / "index.html").read_text()


def test_crashed_run_with_nothing_recorded(tmp_path):
    rd = RunDir.create(tmp_path, "empty")
    s = analysis.analyze(rd.path)
    assert s["complete"] is False and s["steps"] == [] and s["knee"]["users"] is None
    assert s["totals"]["requests"] == 0
    strict_json(rd.report_dir / "summary.json")
    assert (rd.report_dir / "index.html").exists()


def test_steps_without_requests_or_hosts(tmp_path):
    rd = RunDir.create(tmp_path, "noreq")
    rd.write_steps([[0, 1, T0, T0 + 2, T0 + 14], [1, 2, T0 + 14, "", ""]])
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [False, False]
    assert s["steps"][0]["reasons"][0].startswith("only 0 requests")
    assert "never reached steady state" in s["steps"][1]["reasons"][0]
    strict_json(rd.report_dir / "summary.json")


# -- files ------------------------------------------------------------------------------------
def test_summary_json_has_stable_keys_and_no_nan(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), min_requests=1500, error_plan={0: {"timeout": 3}})
    analysis.analyze(rd.path)
    s = strict_json(rd.report_dir / "summary.json")
    assert {"run_id", "complete", "steps", "knee", "peak", "latency_knee", "totals"} <= set(s)
    for st in s["steps"]:
        assert {"index", "users", "requests", "qps", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms",
                "error_rate", "errors", "valid", "reasons"} <= set(st)
    assert {"users", "qps", "method"} <= set(s["knee"]) and {"users", "qps"} <= set(s["peak"])
    assert s["run_id"] == rd.path.name and s["complete"] is True


def test_summary_md_has_steps_table(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4))
    analysis.analyze(rd.path)
    md = (rd.report_dir / "summary.md").read_text()
    assert "| users | requests | QPS | P50 ms | P95 ms | P99 ms | P999 ms | errors % | valid |" in md
    assert "CPU us%" in md and "run queue" in md and "proc CPU%" in md
    assert md.count("\n| ") == 1 + 5  # header + one row per step
    assert "**Knee:** 4 users" in md


def test_index_html_is_offline_and_marks_the_knee(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4))
    analysis.analyze(rd.path)
    html = (rd.report_dir / "index.html").read_text()
    assert "plotly.js v" in html  # the bundle is embedded
    assert '<script src="http' not in html and 'src="https://cdn.plot.ly' not in html
    assert "knee: 4 users" in html
    assert '<table class="steps">' in html
    assert "load generator CPU % per worker" in html and "server-1: CPU % (vmstat)" in html
    assert (rd.report_dir / "index.html").stat().st_size < 8_000_000


def test_gpu_metrics_two_gpus_averaged_and_summed(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4))
    secs = np.arange(T0, T0 + 5 * (RAMP + HOLD), 1.0)
    from kneeswarm.rundir import write_csv
    rows = [(t, g, 40.0 + 20 * g, 10.0, 1000.0 * (g + 1), 100.0, 1980, 2619, 40) for t in secs for g in (0, 1)]
    write_csv(rd.host_dir("server-1") / "gpu.csv",
              ("t", "gpu", "sm_pct", "mem_pct", "fb_used_mb", "power_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c"),
              rows)
    s = analysis.analyze(rd.path)
    srv = s["steps"][0]["server"]["server-1"]
    assert srv["sm_pct"] == pytest.approx(50.0) and srv["fb_used_mb"] == pytest.approx(3000.0)
    assert "GPU SM%" in (rd.report_dir / "summary.md").read_text()
    assert "GPU 1 SM %" in (rd.report_dir / "index.html").read_text()
