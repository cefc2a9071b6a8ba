"""Analysis against run directories generated from a ground-truth model (tests/synthetic_run.py).

Tests are named after the curve they check.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kneeswarm import analysis
from kneeswarm.analysis.models.knee import find_knee, find_latency_knee, find_peak
from kneeswarm.analysis.measure.loadstats import step_stats
from kneeswarm.contracts.rundir import REQUEST_SCHEMA, RunDir
from synthetic_run import HOLD, RAMP, SETTLE, T0, closed_loop, make_run, retrograde, steady_rows, strict_json


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
    # Kneedle alone reports its known spurious knee at the first step of a straight line
    # (analysis/models/knee.py); the saturation rule and the confirmation gain must reject it.
    assert {k: v for k, v in s["knee"].items() if k not in ("interval", "stability")} == {
        "users": None, "qps": None, "method": "none", "kneedle_users": 1}
    assert s["knee"]["interval"] is None  # noise-free steps: no resample found a knee either
    assert s["peak"]["users"] == 16


def test_plateau_with_kneedle_raising_is_said_not_read_as_no_knee(tmp_path, monkeypatch):
    """kneed raising (no real curve of ours makes 0.9 raise, so the library is made to) is no
    silent "no knee": the rule still decides, and summary.json, summary.md and the report say why."""
    import kneed

    class Broken:
        def __init__(self, *a, **kw):
            raise ValueError("x and y must be the same length.")

    monkeypatch.setattr(kneed, "KneeLocator", Broken)
    rd = make_run(tmp_path, closed_loop(k=4))
    s = analysis.analyze(rd.path)
    assert s["knee"]["users"] == 4 and s["knee"]["method"] == "saturation"  # the rule alone
    assert "x and y must be the same length" in s["knee"]["kneedle_error"]
    assert "x and y must be the same length" in s["latency_knee"]["kneedle_error"]
    lines = [w for w in s["warnings"] if "Kneedle failed" in w]
    assert [w.split(":")[0] for w in lines] == ["knee", "latency_knee"], s["warnings"]
    assert "Kneedle failed" in (rd.report_dir / "summary.md").read_text()
    assert "Kneedle failed" in (rd.report_dir / "index.html").read_text()
    assert s["complete"] is True  # a warning, not a loss: the run itself is whole


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
    html = (rd.report_dir / "index.html").read_text()
    assert html.count('<tr class="invalid">') == 2  # greyed in each table: load, server-1
    assert '<td class="valid">no: only ' in html and html.count('<td class="valid">yes</td>') == 4


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


def test_rows_are_grouped_by_their_recorded_step(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2, 4))
    part = rd.request_parts()[1]
    df = pq.read_table(part).to_pandas()
    steady = steady_rows(rd, 1)
    moved = steady.index[:10]  # part 1 holds exactly step 1's rows, in the order steady_rows read them
    df.loc[df["t_start"].isin(steady.loc[moved, "t_start"]), "step"] = 0
    pq.write_table(pa.Table.from_pandas(df, schema=REQUEST_SCHEMA, preserve_index=False), part)
    s = analysis.analyze(rd.path)
    kept = steady.drop(moved)
    st = s["steps"][1]
    assert st["requests"] == len(kept) == len(steady) - 10
    assert st["p99_ms"] == np.percentile(kept["latency_ms"], 99)
    assert s["steps"][0]["requests"] == len(steady_rows(rd, 0))  # outside step 0's window: not counted there
    assert "step 1: 10 rows in its steady window were recorded under another step and left out" in s["warnings"]


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
    # The load table, then the server's: each a header and one row per step.
    assert md.count("\n| ") == 2 * (1 + 5)
    assert md.index("| users | requests | QPS |") < md.index("**Server `") < md.index("| users | CPU us% |")
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
    from kneeswarm.contracts.rundir import write_csv
    rows = [(t, g, 40.0 + 20 * g, 10.0, 1000.0 * (g + 1), 100.0, 1980, 2619, 40) for t in secs for g in (0, 1)]
    write_csv(rd.host_dir("server-1") / "gpu.csv",
              ("t", "gpu", "sm_pct", "mem_pct", "fb_used_mb", "power_w", "sm_clock_mhz", "mem_clock_mhz", "temp_c"),
              rows)
    s = analysis.analyze(rd.path)
    srv = s["steps"][0]["server"]["server-1"]
    assert srv["sm_pct"] == pytest.approx(50.0) and srv["fb_used_mb"] == pytest.approx(3000.0)
    assert "GPU SM%" in (rd.report_dir / "summary.md").read_text()
    assert "GPU 1 SM %" in (rd.report_dir / "index.html").read_text()


# -- target metrics (the server's own /metrics) -----------------------------------------------
def write_prometheus(path: Path, t: np.ndarray, columns: dict[str, np.ndarray]) -> None:
    from kneeswarm.contracts.rundir import write_csv
    write_csv(path, ("t", *columns), zip(t, *columns.values()))


def test_target_queue_0_then_12_and_counter_rising_5_per_s(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    t = np.arange(T0, T0 + 2 * (RAMP + HOLD), 0.5)
    el = t - T0
    write_prometheus(rd.host_dir("target") / "prometheus.csv", t, {  # a host dir of its own
        'kneeswarm_target_requests_total{code="200"}': 100 * el,
        'kneeswarm_target_requests_total{code="503"}': 2 * el,
        "kneeswarm_target_rejected_total": 5 * el,
        "kneeswarm_target_inflight": np.where(el < RAMP + HOLD, 1.0, 2.0),
        "kneeswarm_target_queue_length": np.where(el < RAMP + HOLD, 0.0, 12.0),
        "kneeswarm_target_queue_wait_seconds_count": 10 * el,
        "kneeswarm_target_queue_wait_seconds_sum": 0.02 * el,
        'kneeswarm_target_request_duration_seconds_bucket{le="0.1"}': 7 * el,  # not a target metric
        "process_cpu_seconds_total": el,
    })
    rd.update_meta(target_metrics={  # the conductor's scraper, as it records itself
        "url": "http://10.0.0.5:8000/metrics", "scrapes": 56, "ok": 54, "failed": 2, "last_error": "timed out after 0.8s",
        "host": "target", "clock": "master", "parse": {"lines": 56, "skipped": 2, "rows": 54, "series": 9}})
    s = analysis.analyze(rd.path)
    assert s["hosts"]["target"] == {
        "scraper": {"url": "http://10.0.0.5:8000/metrics", "scrapes": 56, "ok": 54, "failed": 2,
                    "last_error": "timed out after 0.8s"},
        "parse": {"prometheus": {"lines": 56, "skipped": 2}}}
    first, second = (st["server"]["target"]["target"] for st in s["steps"])
    assert first == pytest.approx({"queue_length": 0.0, "in_flight": 1.0, "rejected_s": 5.0,
                                   "failures_s": 2.0, "queue_wait_ms": 2.0, "requests_s": 102.0})
    assert second["queue_length"] == 12.0 and second["in_flight"] == 2.0
    assert second["rejected_s"] == pytest.approx(5.0)
    assert "target" not in s["steps"][0]["server"]["server-1"]  # no prometheus.csv there
    used = s["target_series"]["target"]
    assert set(used) == {"queue_length", "in_flight", "rejected_s", "failures_s", "queue_wait_ms", "requests_s"}
    assert used["queue_length"] == {"label": "queue", "kind": "gauge", "server": "kneeswarm", "source": "scrape",
                                    "ref": "tests/fixtures/scrapes/kneeswarm-0.1.0.txt",
                                    "series": ["kneeswarm_target_queue_length"], "step": "mean"}
    assert used["requests_s"]["series"] == ['kneeswarm_target_requests_total{code="200"}',
                                            'kneeswarm_target_requests_total{code="503"}']
    md = (rd.report_dir / "summary.md").read_text()
    assert "**Target metrics (`target`)**" in md and "| queue |" in md and "| rejections/s |" in md
    assert "- **Malformed lines skipped:** target prometheus: 2 of 56 lines" in md
    assert "  - /metrics scraped from http://10.0.0.5:8000/metrics: 56 scrapes, 2 failed (last: timed out after 0.8s)" in md
    last_row = [line for line in md.splitlines() if line.startswith("| ")][-1]  # the target table's last step
    assert last_row.split(" | ")[-6:] == ["12.0", "2.0", "5.0", "2.0", "2.0", "102.0 |"]
    html = (rd.report_dir / "index.html").read_text().replace("\\u002f", "/")
    assert "target: target: queue / in flight / rejections/s" in html
    names = ("kneeswarm names from a recorded real scrape (tests/fixtures/scrapes/kneeswarm-0.1.0.txt): "
             "queue, in flight, rejections/s, failures/s, queue wait ms, server req/s")
    assert f"\n- {names}\n" in md and f"<p class='note'>{names}</p>" in html  # where the names come from
    strict_json(rd.report_dir / "summary.json")


def test_prometheus_csv_is_narrowed_to_known_series(tmp_path):
    from kneeswarm.analysis.measure.inputs import read_prometheus
    path = tmp_path / "prometheus.csv"
    t = np.arange(5.0)
    write_prometheus(path, t, {"go_gc_duration_seconds": t, "kneeswarm_target_inflight": t,
                               'kneeswarm_target_request_duration_seconds_bucket{le="0.1"}': t})
    assert list(read_prometheus(path).columns) == ["t", "kneeswarm_target_inflight"]
    write_prometheus(path, t, {"go_gc_duration_seconds": t})
    assert read_prometheus(path) is None


def test_counter_reset_counts_the_new_value():
    from kneeswarm.analysis.measure.target import target_windows
    df = pd.DataFrame({"t": [0.0, 1, 2, 3, 4], "kneeswarm_target_rejected_total": [0.0, 5, 10, 2, 7]})
    got = target_windows(df, np.array([0.0, 0.0, 3.5]), np.array([5.0, 1.0, 5.0]))
    assert got[0] == {"rejected_s": pytest.approx(17 / 4)}  # 5 + 5 + 2 (restart) + 5 over 4 s
    assert got[1] == {} and got[2] == {}  # one sample: no rate


def test_vllm_and_triton_series_combined_first_candidate_wins():
    from kneeswarm.analysis.measure.target import target_windows
    t = np.arange(0.0, 10.0)
    df = pd.DataFrame({
        "t": t,
        'vllm:num_requests_waiting{model_name="a"}': 3.0,
        'vllm:num_requests_waiting{model_name="b"}': 4.0,
        'vllm:num_requests_running{model_name="a"}': 2.0,
        'vllm:kv_cache_usage_perc{model_name="a"}': 0.5,
        'vllm:gpu_cache_usage_perc{model_name="a"}': 0.9,  # the V0 alias: not counted twice
        'vllm:num_preemptions_total{model_name="a"}': 1.0 * t,
        'vllm:request_queue_time_seconds_sum{model_name="a"}': 0.3 * t,
        'vllm:request_queue_time_seconds_count{model_name="a"}': 6.0 * t,
        'nv_inference_pending_request_count{model="m",version="1"}': 99.0,  # vLLM's queue wins
        'nv_inference_queue_duration_us{model="m",version="1"}': 250_000.0 * t,
    })
    got = target_windows(df, np.array([0.0]), np.array([10.0]))[0]
    assert got == pytest.approx({"queue_length": 7.0, "in_flight": 2.0, "kv_cache_usage_pct": 50.0,
                                 "preempted_s": 1.0, "queue_wait_ms": 50.0, "queue_time_us_s": 250_000.0,
                                 "llm_running": 2.0, "llm_waiting": 7.0, "llm_queue_ms": 50.0})


# -- host facts in the header -----------------------------------------------------------------
def h200_gpu() -> dict:
    """The GPU as the agent's preflight reports it, from the real H200 recording."""
    line = (Path(__file__).parent / "fixtures/gpu/nvidia-smi-info.txt").read_text().splitlines()[-1]
    name, mem, driver = (x.strip() for x in line.split(","))
    return {"index": 0, "name": name, "memory_total_mb": int(mem.split()[0]), "driver": driver}


def test_header_facts_in_summary_md_json_and_html(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    collectors = {"pidstat": {"enabled": True, "kind": "command", "version": "12.6.1"},
                  "vmstat": {"enabled": True, "kind": "command", "version": "4.0.2"},
                  "dmon": {"enabled": True, "kind": "command", "version": "580.159.04"},
                  "nvml": {"enabled": False, "reason": "pynvml is not importable"}}
    rd.update_meta(
        hosts_preflight={"server-1": {
            "hostname": "gpu-box", "kernel": "6.8.0",
            "cpu": {"model": "Intel(R) Xeon(R) Processor", "sockets": 1, "physical_cores": 16,
                    "threads_per_core": 1, "logical_cpus": 16, "source": "lscpu"},
            "memory_total_kb": 131980981, "gpus": [h200_gpu()],
            "process": {"pid": 4242, "cmdline": "python -m vllm.entrypoints.openai.api_server --port 8000",
                        "by": "port", "candidates": [4242]},
            "collectors": collectors}},
        hosts={"server-1": {
            "collectors": collectors,
            "clock": {"before": {"offset": 0.0015, "error": 4e-05}, "after": {"offset": 0.0016, "error": 5e-05},
                      "drift_ppm": 1.1, "errors": []},
            "parse": {"vmstat": {"lines": 92, "skipped": 3, "tables": {"vmstat": 89}},
                      "pidstat": {"lines": 892, "skipped": 0}},
            "warnings": ["collector nvml skipped: pynvml is not importable", "heartbeat late by 3 s"]}},
    )
    s = analysis.analyze(rd.path)
    h = s["hosts"]["server-1"]
    assert h["cpu"] == {"model": "Intel(R) Xeon(R) Processor", "sockets": 1, "physical_cores": 16,
                        "threads_per_core": 1, "logical_cpus": 16}
    assert h["memory_gib"] == 125.9 and h["gpus"] == [{"index": 0, "name": "NVIDIA H200",
                                                       "memory_total_mb": 143771, "driver": "580.159.04"}]
    assert h["process"]["pid"] == 4242 and h["process"]["by"] == "port"
    assert h["collectors"]["pidstat"]["version"] == "12.6.1" and h["collectors"]["nvml"]["enabled"] is False
    assert h["clock"]["offset_s"] == 0.0015 and h["clock"]["error_s"] == 5e-05 and h["clock"]["drift_ppm"] == 1.1
    assert h["parse"] == {"pidstat": {"lines": 892, "skipped": 0}, "vmstat": {"lines": 92, "skipped": 3}}
    md = (rd.report_dir / "summary.md").read_text()
    for text in ("- **Malformed lines skipped:** server-1 vmstat: 3 of 92 lines",
                 "- **server-1** (gpu-box, Linux 6.8.0): Intel(R) Xeon(R) Processor (1 socket, 16 physical cores, "
                 "1 thread(s)/core, 16 logical CPUs); 125.9 GiB memory; GPUs: 0: NVIDIA H200 140 GiB",
                 "  - monitored process: pid 4242 (chosen by port): "
                 "`python -m vllm.entrypoints.openai.api_server --port 8000`",
                 "  - collectors: dmon 580.159.04, pidstat 12.6.1, vmstat 4.0.2; not run: nvml (pynvml is not importable)",
                 "  - clock offset: before 1.50 ms ± 40.0 µs, after 1.60 ms ± 50.0 µs; drift 1.10 ppm",
                 "  - parsed: pidstat 892 lines, 0 skipped; vmstat 92 lines, **3 skipped**",
                 "  - warning: heartbeat late by 3 s"):
        assert text in md, text
    assert "collector nvml skipped" not in md  # already said under "not run"
    assert md.count("\n| ") == 2 * (1 + 2)  # the host lines break neither table
    html = (rd.report_dir / "index.html").read_text()
    assert "<p class='warn'><b>Malformed lines skipped:</b> server-1 vmstat: 3 of 92 lines</p>" in html
    assert "NVIDIA H200 140 GiB" in html and "<code>python -m vllm.entrypoints" in html


def test_header_tolerates_odd_and_missing_facts(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    rd.update_meta(hosts_preflight={"server-1": {"cpu": "weird", "gpus": None, "memory_total_kb": "n/a",
                                                 "process": {"error": "no process with pid 9"}},
                                    "ghost box": None},
                   hosts={"server-1": {"clock": {"before": {"offset": "x"}, "errors": ["echo timed out"]},
                                       "parse": {"vmstat": "bad", "pidstat": {"lines": 10}}}})
    s = analysis.analyze(rd.path)
    assert s["hosts"]["ghost_box"] == {"label": "ghost box"}
    assert s["hosts"]["server-1"]["process"] == {"error": "no process with pid 9"}
    md = (rd.report_dir / "summary.md").read_text()
    assert "monitored process: none (no process with pid 9)" in md
    assert "clock offset: not measured; errors: echo timed out" in md
    strict_json(rd.report_dir / "summary.json")


# -- threads, %sy share -----------------------------------------------------------------------
def test_sy_share_active_threads_from_procfs_tables(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2, 4))
    from kneeswarm.contracts.rundir import write_csv
    hd = rd.host_dir("server-1")
    (hd / "process.csv").unlink()  # no pidstat: the procfs sampler's tables are read instead
    secs = np.arange(T0, T0 + 3 * (RAMP + HOLD), 1.0)
    users_at = np.array([1, 2, 4])[((secs - T0) // (RAMP + HOLD)).astype(int)]
    busy = users_at / 4
    write_csv(hd / "process.procfs.csv", ("t", "pid", "cpu_pct", "usr_pct", "sys_pct", "threads", "migrations_s",
                                          "io_read_kb_s", "io_write_kb_s"),
              zip(secs, [7] * len(secs), 300 * busy, 270 * busy, 30 * busy, users_at + 2, 3 * users_at,
                  0 * users_at, 64 * users_at))
    rows = [(t, tid, "python3", 75.0 if tid <= n else 1.0) for t, n in zip(secs, users_at) for tid in range(1, n + 3)]
    write_csv(hd / "threads.procfs.csv", ("t", "tid", "name", "cpu_pct"), rows)
    s = analysis.analyze(rd.path)
    srv = [st["server"]["server-1"] for st in s["steps"]]
    assert [x["sy_share"] for x in srv] == pytest.approx([0.1, 0.1, 0.1])
    assert [x["active_threads"] for x in srv] == [1.0, 2.0, 4.0]
    assert [x["top_thread_cpu_pct"] for x in srv] == [75.0, 75.0, 75.0]
    assert [x["threads"] for x in srv] == [3.0, 4.0, 6.0] and [x["migrations_s"] for x in srv] == [3.0, 6.0, 12.0]
    md = (rd.report_dir / "summary.md").read_text()
    assert "| proc sy share | threads | active threads | top thread % | migrations/s |" in md
    assert "| 10% | 6 | 4.0 | 75 | 12.0 |" in md
    # the service's own disk IO (the /proc sampler reads /proc/PID/io): its own columns
    assert [x["io_write_kb_s"] for x in srv] == [64.0, 128.0, 256.0] and [x["io_read_kb_s"] for x in srv] == [0, 0, 0]
    assert "| migrations/s | proc read kB/s | proc write kB/s |" in md and "| 12.0 | 0 | 256 |" in md
    html = (rd.report_dir / "index.html").read_text()
    assert "server-1: threads (active" in html


# -- GPU from the real H200 recording ---------------------------------------------------------
def test_gpu_step_means_from_h200_dmon_recording(tmp_path):
    from kneeswarm.collectors import parse_raw
    gpu = parse_raw("dmon", (Path(__file__).parent / "fixtures/gpu/dmon-pucvmet-DT.txt").read_text()).frames["gpu"]
    t_first = float(gpu["t"].iloc[0])
    # step 0's steady window [t0+4, t0+14) holds samples 0-9, step 1's [t0+18, t0+28) samples 14-22
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2), t0=t_first - 4.5)
    gpu.to_csv(rd.host_dir("server-1") / "gpu.csv", index=False)
    s = analysis.analyze(rd.path)
    a, b = (st["server"]["server-1"] for st in s["steps"])
    assert (a["sm_pct"], a["mem_pct"], a["fb_used_mb"], a["power_w"]) == pytest.approx((20.0, 4.6, 505.5, 197.5))
    assert (b["sm_pct"], b["mem_pct"], b["fb_used_mb"]) == pytest.approx((499 / 9, 114 / 9, 1011.0))
    md = (rd.report_dir / "summary.md").read_text()
    assert "| GPU SM% | GPU mem% | GPU FB MB | GPU W |" in md and "| 20 | 5 | 506 | 198 |" in md
    html = (rd.report_dir / "index.html").read_text().replace("\\u002f", "/")
    assert "server-1: GPU memory used MB / power W" in html and "GPU 0 power W" in html


def test_per_request_timeline_stays_downsampled(tmp_path):
    from kneeswarm.analysis.reports.html import per_second
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    req = rd.read_requests()
    ps = per_second(req, T0)
    assert len(req) > 2000 and len(ps) <= 2 * (RAMP + HOLD) + 2  # one row per second, not per request


# -- threads.csv read a chunk at a time (bounded memory through a soak's hours) --------------------
FIXTURES = Path(__file__).parent / "fixtures" / "collectors"


@pytest.mark.parametrize("collector,fixture", [("pidstat", "pidstat-12.6.1-t.txt"), ("pidstat", "pidstat-12.6.1-d-t.txt"),
                                               ("procfs", "procfs-psutil.jsonl")])
@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 1_000_000])
def test_thread_samples_read_in_chunks_equal_the_whole_table(tmp_path, collector, fixture, chunk_rows):
    """Recorded thread tables: the chunked read's per-sample figures equal numpy's over the whole
    table and the whole-table path's (pd.read_csv, then active_threads), chunks splitting samples."""
    from kneeswarm.analysis.measure.inputs import _sorted_by_t, read_thread_samples
    from kneeswarm.analysis.measure.serverstats import ACTIVE_THREAD_CPU_PCT, active_threads
    from kneeswarm.collectors import parse_raw_file
    from kneeswarm.contracts.rundir import write_csv

    table = parse_raw_file(collector, FIXTURES / fixture).frames["threads"]
    assert len(table) > 10 and table["t"].nunique() > 2
    path = tmp_path / "threads.csv"
    write_csv(path, list(table.columns), table.itertuples(index=False, name=None))
    got = read_thread_samples(path, chunk_rows)
    whole = active_threads(_sorted_by_t(pd.read_csv(path)))
    raw = pd.read_csv(path)  # numpy over the rows: per sample time, threads at >= 5 % and the busiest
    t_all, cpu = raw["t"].to_numpy(float), raw["cpu_pct"].to_numpy(float)
    t, inv = np.unique(t_all, return_inverse=True)
    top = np.full(len(t), -np.inf)
    np.maximum.at(top, inv, cpu)
    active = np.bincount(inv, weights=(cpu >= ACTIVE_THREAD_CPU_PCT).astype(float), minlength=len(t))
    for frame in (got, whole):
        assert np.array_equal(frame["t"].to_numpy(float), t)
        assert np.array_equal(frame["active_threads"].to_numpy(float), active)
        assert np.array_equal(frame["top_thread_cpu_pct"].to_numpy(float), top)
    assert active_threads(got) is got  # per-sample figures pass through to the windows and the report


def test_thread_table_torn_or_without_cpu_reads_as_the_whole_table(tmp_path, monkeypatch):
    """A torn line after the first chunk makes the table unreadable (said, counted) as a whole read
    does; a table with t but no cpu_pct stands for the threads table with no samples."""
    from kneeswarm.analysis.measure.inputs import read_host_table
    from kneeswarm.contracts.rundir import WarningLog

    torn = tmp_path / "threads.csv"
    torn.write_text("t,tid,name,cpu_pct\n" + "".join(f"{T0 + k},{k % 4},w,{k % 50}\n" for k in range(40)) + "1,2,3,4,5,6\n")
    monkeypatch.setattr("kneeswarm.analysis.measure.inputs.THREAD_CHUNK_ROWS", 8)
    warnings, lost = WarningLog(), {}
    with pytest.raises(pd.errors.ParserError):
        pd.read_csv(torn)
    assert read_host_table("threads", torn, "hosts/h/threads.csv", warnings, lost) is None
    assert lost == {"host_csvs": 1} and "hosts/h/threads.csv: unreadable" in " ".join(warnings.items)
    no_cpu = tmp_path / "threads2.csv"
    no_cpu.write_text("t,tid\n1.0,2\n")
    got = read_host_table("threads", no_cpu, "x", WarningLog(), {})
    assert got is not None and got.empty
