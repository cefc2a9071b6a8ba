"""Nothing lost silently: what analysis cannot read or trust reaches the steps' validity,
summary.json (``complete``, ``warnings``, ``lost``) and the top of summary.md and index.html."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kneeswarm import analysis
from kneeswarm.analysis.measure.loadstats import GENERATOR_SLACK_S
from kneeswarm.contracts.plan import AnalysisPlan, LoadPlan
from kneeswarm.contracts.rundir import REQUEST_SCHEMA
from synthetic_run import HOLD, SETTLE, closed_loop, make_run, steady_rows

DEFAULTS = (f"settle={LoadPlan().settle!r}, min_requests={AnalysisPlan().min_requests!r}, "
            f"generator_cpu_max={AnalysisPlan().generator_cpu_max!r}")


def rewrite_part(path, df: pd.DataFrame) -> None:
    pq.write_table(pa.Table.from_pandas(df, schema=REQUEST_SCHEMA, preserve_index=False), path)


# -- generator CSVs ----------------------------------------------------------------------------
def test_unreadable_generator_csv_invalidates_saturated_steps(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), generator_cpu={3: 97.0})
    path = rd.generator_dir / "w1.csv"
    path.write_bytes(b"\xff\xfe\x00garbage" + path.read_bytes()[:50])  # not UTF-8, not CSV
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [False] * 5
    for st in s["steps"]:
        assert ("generator metrics unreadable (generator/w1.csv): the load generator's CPU is unknown"
                in st["reasons"])
    assert s["lost"] == {"generator_csvs": 1} and s["complete"] is False
    assert any(w.startswith("generator/w1.csv: unreadable") for w in s["warnings"])


def test_generator_csv_without_samples_in_a_step_invalidates_it(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2, 4))
    path = rd.generator_dir / "w1.csv"
    gen = pd.read_csv(path)
    steps = pd.read_csv(rd.steps_path)
    # worker w1 silent during step 1 and beyond the GENERATOR_SLACK_S around its steady window
    gap = (gen["t"] >= steps["t_ramp"][1]) & (gen["t"] < steps["t_end"][1] + GENERATOR_SLACK_S + 1)
    gen[~gap].to_csv(path, index=False)
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [True, False, True]
    assert s["steps"][1]["reasons"] == [
        "generator metrics missing: worker w1 sent requests but has no sample in the steady window"]


def test_generator_sample_just_outside_a_short_window_is_enough(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2, 4))
    path = rd.generator_dir / "w1.csv"
    gen = pd.read_csv(path)
    steps = pd.read_csv(rd.steps_path)
    lo, hi = steps["t_steady"][1] + SETTLE, steps["t_end"][1]
    gen[(gen["t"] < lo) | (gen["t"] >= hi)].to_csv(path, index=False)  # samples 1 s either side only
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [True, True, True]


def test_torn_generator_line_is_skipped_and_said(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    path = rd.generator_dir / "w1.csv"
    with path.open("a") as f:
        f.write("1700000100.0,99.0,80.0,2,1.0,1,2,3\n")  # one line with too many fields
    s = analysis.analyze(rd.path)
    assert "generator/w1.csv: 1 malformed lines skipped" in s["warnings"]
    assert [st["valid"] for st in s["steps"]] == [True, True]


# -- plan.toml ---------------------------------------------------------------------------------
def test_missing_plan_says_which_defaults_were_used(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    rd.plan_path.unlink()
    s = analysis.analyze(rd.path)
    assert f"plan.toml missing: analysis used the default settings {DEFAULTS}" in s["warnings"]
    md = (rd.report_dir / "summary.md").read_text()
    assert "plan.toml missing" in md.split("**Knee:**")[0]


def test_bad_plan_and_bad_value_say_so(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    rd.plan_path.write_text("[load\nsettle = ")
    s = analysis.analyze(rd.path)
    assert any(w.startswith("plan.toml unreadable (") and w.endswith(f"default settings {DEFAULTS}")
               for w in s["warnings"])
    rd.plan_path.write_text('[load]\nsettle = 2.0\n[analysis]\nmin_requests = "many"\ngenerator_cpu_max = 90.0\n')
    s = analysis.analyze(rd.path)
    assert (f"plan.toml: min_requests='many' is not a number; analysis used the default "
            f"min_requests={AnalysisPlan().min_requests!r}") in s["warnings"]


def test_complete_plan_gives_no_warning(tmp_path):
    s = analysis.analyze(make_run(tmp_path, closed_loop(k=4), users=(1, 2)).path)
    assert s["warnings"] == [] and s["lost"] == {} and s["complete"] is True


# -- latencies and failures --------------------------------------------------------------------
def test_non_finite_latencies_are_errors_not_successes(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    part = rd.request_parts()[1]
    df = pd.read_parquet(part)
    steady = np.flatnonzero((df["t_start"] >= pd.read_csv(rd.steps_path)["t_steady"][1] + SETTLE).to_numpy())
    df.loc[steady[:5], "latency_ms"] = np.nan
    df.loc[steady[5:8], "latency_ms"] = np.inf
    df.loc[steady[8:9], "latency_ms"] = -1.0
    rewrite_part(part, df)
    s = analysis.analyze(rd.path)
    rows = steady_rows(rd, 1)
    good = rows[rows["ok"] & np.isfinite(rows["latency_ms"]) & (rows["latency_ms"] >= 0)]
    st = s["steps"][1]
    assert st["errors"] == {"bad_latency": 9}
    assert st["qps"] == pytest.approx(len(good) / (HOLD - SETTLE), rel=1e-12)
    assert st["p99_ms"] == np.percentile(good["latency_ms"], 99)
    assert st["error_rate"] == pytest.approx(9 / len(rows))
    assert s["totals"]["errors"] == 9


def test_step_with_most_requests_failed_is_not_valid(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2), error_plan={1: {"http_5xx": 2000}})
    s = analysis.analyze(rd.path)
    st = s["steps"][1]
    n = len(steady_rows(rd, 1))
    assert st["valid"] is False
    assert st["reasons"] == [f"2000 of {n} requests failed (more than 50%): the figures describe failures, "
                             "not the service"]
    assert s["steps"][0]["valid"] is True


def test_run_where_every_request_failed_has_no_valid_step(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2), min_requests=0)
    for part in rd.request_parts():
        df = pd.read_parquet(part)
        df["ok"], df["status"], df["error"] = False, 404, "http_4xx"
        rewrite_part(part, df)
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [False, False]
    assert s["totals"]["valid_steps"] == 0 and s["knee"]["users"] is None and s["peak"]["users"] is None
    assert any(w.startswith("no request succeeded (") for w in s["warnings"])


# -- meta.json's and hosts' warnings and losses ------------------------------------------------
def test_meta_and_host_warnings_and_losses_reach_the_top_of_the_report(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    rd.update_meta(
        warnings=["parquet write failed: No space left on device", "server-1: fetch of pidstat.txt failed"],
        lost={"request_rows": 120},
        hosts={"server-1": {"warnings": ["fetch of pidstat.txt failed"], "complete": False,
                            "lost": {"raw_files": 1},
                            "collectors": {"pidstat": {"enabled": True, "error": "exited with 1"},
                                           "nvml": {"enabled": False, "reason": "no GPU"}}}})
    s = analysis.analyze(rd.path)
    assert s["complete"] is False
    assert s["lost"] == {"hosts.server-1.raw_files": 1, "request_rows": 120}
    assert s["warnings"][:2] == ["parquet write failed: No space left on device",
                                 "server-1: fetch of pidstat.txt failed"]  # the host's own copy deduplicated
    assert "server-1: collector pidstat: exited with 1" in s["warnings"]
    assert "server-1: the host's data is incomplete" in s["warnings"]
    assert s["warnings"].count("server-1: fetch of pidstat.txt failed") == 1
    md = (rd.report_dir / "summary.md").read_text()
    top = md.split("**Knee:**")[0]
    assert "INCOMPLETE" in md.splitlines()[0]
    for text in ("parquet write failed: No space left on device", "collector pidstat: exited with 1",
                 "data was lost: hosts.server-1.raw\\_files 1, request\\_rows 120".replace("\\_", "_")):
        assert text in top, text
    html = (rd.report_dir / "index.html").read_text()
    assert html.index("parquet write failed: No space left on device") < html.index("<b>Knee:</b>")


def test_killed_controller_run_is_incomplete_with_a_line(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2), meta=False)
    rd.update_meta(run_id=rd.path.name, complete=False, ended="running")
    s = analysis.analyze(rd.path)
    assert s["complete"] is False and s["ended"] == "running"
    assert s["warnings"][0].startswith('meta.json still says "ended": "running": the controller was killed')
    md = (rd.report_dir / "summary.md").read_text()
    assert 'the controller was killed' in md.split("**Knee:**")[0]
