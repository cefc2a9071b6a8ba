"""summary.json explains why and which numbers to trust: findings, the USL fit over valid steps only, Little's law
and clock-offset bounds in each step's reasons, energy per request.

Run directories come from tests/synthetic_run.py; expected values are computed here from the
model or with numpy on the rows, never read back from the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kneeswarm import analysis
import kneeswarm.analysis.findings
from kneeswarm.contracts.rundir import CLOCKS_FILE, write_csv, write_json
from synthetic_run import HOLD, RAMP, S_MS, SETTLE, T0, closed_loop, make_run, retrograde, steady_rows, strict_json
from usl_truth import usl_lstsq

USERS = (1, 2, 4, 8, 16)


def starved_at(n_bad: int, k: int = 64):
    """A closed loop whose generator held only half the users at ``n_bad`` users: the rows show half
    the throughput at the same latency (N ≠ X·R there)."""
    model = closed_loop(k)

    def m(n: int):
        q, lat = model(n)
        return (q / 2, lat) if n == n_bad else (q, lat)
    return m


def with_plan_load(rd, **load) -> None:
    """Add keys to plan.toml's [load] table (written the way the conductor writes plans)."""
    import tomllib

    import tomli_w
    plan = tomllib.loads(rd.plan_path.read_text())
    plan["load"].update(load)
    rd.plan_path.write_text(tomli_w.dumps(plan))


def test_littles_law_step_that_did_not_hold_the_load_is_invalid_and_out_of_knee_and_fit(tmp_path):
    rd = make_run(tmp_path, starved_at(8))
    s = analysis.analyze(rd.path)
    # independent truth: users vs (all rows / window) x mean latency of the ok rows, by numpy
    rows = steady_rows(rd, 3)
    window = HOLD - SETTLE
    in_system = len(rows) / window * rows.loc[rows["ok"], "latency_ms"].mean() / 1000.0
    assert in_system / 8 == pytest.approx(0.5, abs=0.05)
    # the number the check reads: the time-average in flight over the window, by numpy over every
    # row (a request that started before the window counts for its part inside it)
    st = s["steps"][3]
    lo, hi = st["t_lo"], st["t_hi"]
    every = steady_rows(rd, 3, whole=True)
    done = every["t_start"] + every["latency_ms"] / 1000.0
    in_flight = (np.minimum(done, hi) - np.maximum(every["t_start"], lo)).clip(lower=0).sum() / (hi - lo)
    assert st["in_flight"] == pytest.approx(in_flight, rel=1e-9)
    assert in_flight / 8 == pytest.approx(0.5, abs=0.05)
    bad = s["steps"][3]
    assert bad["valid"] is False
    assert len(bad["reasons"]) == 1 and bad["reasons"][0].startswith("Little's law:")
    assert f"users busy of 8 ({in_flight / 8:.0%})" in bad["reasons"][0]
    assert all(st["valid"] and st["reasons"] == [] for i, st in enumerate(s["steps"]) if i != 3)
    # the fit uses only the 4 valid steps: the least-squares fit (numpy, tests/usl_truth.py) of their
    # points alone, their QPS counted from the rows
    good = [i for i in range(len(USERS)) if i != 3]
    qps = [len(steady_rows(rd, i).query("ok")) / window for i in good]
    expected = usl_lstsq([USERS[i] for i in good], qps)
    assert s["usl"]["points"] == 4
    for k in ("sigma", "kappa", "lambda"):
        assert s["usl"][k] == pytest.approx(expected[k], rel=1e-3, abs=1e-9)
    assert s["knee"]["users"] is None  # the starved step would have looked like a knee at 4
    assert s["totals"]["valid_steps"] == 4


def test_think_time_from_the_plan_enters_littles_law(tmp_path):
    z = 30.0  # ms of think time: each user cycles every S + Z ms, so X = N / (S + Z)
    model = lambda n: (n * 1000.0 / (S_MS + z), S_MS)  # noqa: E731
    rd = make_run(tmp_path, model)
    with_plan_load(rd, wait_ms=z)
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [True] * 5, [st["reasons"] for st in s["steps"]]
    with_plan_load(rd, wait_ms=0.0)  # without the think time, every step looks 4x short of its users
    s = analysis.analyze(rd.path)
    assert all(not st["valid"] and "Little's law" in st["reasons"][0] for st in s["steps"])


def test_open_loop_steps_are_not_held_to_littles_law(tmp_path):
    rd = make_run(tmp_path, starved_at(8))
    with_plan_load(rd, mode="open")
    s = analysis.analyze(rd.path)
    assert all(st["valid"] for st in s["steps"]), [st["reasons"] for st in s["steps"]]


@pytest.mark.parametrize("error_s, valid", [(0.0005, True), (0.002, False)])
def test_clock_error_bound_above_a_tenth_of_p50_invalidates(tmp_path, error_s, valid):
    rd = make_run(tmp_path, closed_loop(k=64), users=(1, 2, 4))  # P50 ~ S_MS = 10 ms: the limit is ~1 ms
    rd.update_meta(hosts={"server-1": {"clock": {"before": {"offset": 0.1, "error": 0.0001},
                                                 "after": {"offset": 0.1, "error": error_s}}}})
    s = analysis.analyze(rd.path)
    p50 = [float(np.percentile(steady_rows(rd, i).query("ok")["latency_ms"], 50)) for i in range(3)]
    assert all(p > 10 * 0.0005 * 1000 and p < 10 * 0.002 * 1000 for p in p50)  # the story holds
    for st in s["steps"]:
        assert st["valid"] is valid
        if not valid:
            assert st["reasons"] == [f"clock offset error bound {error_s * 1000:,.2f} ms (host server-1) > 10% of "
                                     f"P50 {st['p50_ms']:,.2f} ms: samples and requests cannot be aligned that finely"]


def test_worker_clock_error_from_generator_clocks_json(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=64), users=(1, 2, 4))
    write_json(rd.generator_dir / CLOCKS_FILE, {"w1": {"offset_s": 0.2, "error_s": 0.004, "samples": 9}})
    s = analysis.analyze(rd.path)
    assert all(not st["valid"] and "(worker w1)" in st["reasons"][0] for st in s["steps"])


def test_findings_and_usl_in_summary_json_and_reports(tmp_path):
    rd = make_run(tmp_path, retrograde(), users=(1, 2, 4, 8, 16, 32), migrations_per_user=50.0)
    analysis.analyze(rd.path)
    s = strict_json(rd.report_dir / "summary.json")
    window = HOLD - SETTLE
    qps = {u: len(steady_rows(rd, i).query("ok")) / window for i, u in enumerate((1, 2, 4, 8, 16, 32))}
    [retro] = [f for f in s["findings"] if f["id"] == "retrograde"]
    # the rule's keys, and what judging it against the run's noise adds (its support: resamples)
    assert set(retro) == {"id", "severity", "steps", "evidence", "text", "advice", "support"}
    assert retro["evidence"]["peak_users"] == 16 and retro["evidence"]["users"] == 32
    assert retro["evidence"]["drop"] == pytest.approx(1 - qps[32] / qps[16], abs=1e-3)
    # the story's host: cs/s = 1000 x users (4x from 8 to 32 users), migrations 50/s x users (at 3 CPUs:
    # past 100 per CPU-second from 8 users)
    assert {f["id"] for f in s["findings"]} == {"retrograde", "switch_storm", "migrations_high"}
    expected = usl_lstsq(list(qps), list(qps.values()))  # numpy least squares on the rows' QPS
    assert s["usl"]["kappa"] == pytest.approx(expected["kappa"], rel=1e-3)
    assert s["usl"]["n_star"] == pytest.approx(expected["n_star"], rel=1e-3)
    assert len(s["usl"]["curve"]["users"]) == len(s["usl"]["curve"]["qps"]) > 10
    md = (rd.report_dir / "summary.md").read_text()
    assert "retrograde" in md and "N* = " in md
    html = (rd.report_dir / "index.html").read_text()
    assert "retrograde" in html and "USL fit" in html


def test_healthy_linear_run_has_no_findings(tmp_path):
    s = analysis.analyze(make_run(tmp_path, closed_loop(k=64)).path)
    assert s["findings"] == []
    assert s["usl"]["r2"] > 0.99 and s["usl"]["points"] == 5


def test_a_rule_that_raises_becomes_a_warning(tmp_path, monkeypatch):
    def broken(ctx):
        raise ZeroDivisionError("boom")
    monkeypatch.setattr(kneeswarm.analysis.findings, "RULES", (broken, *kneeswarm.analysis.findings.RULES))
    rd = make_run(tmp_path, retrograde(), users=(1, 2, 4, 8, 16, 32))
    s = analysis.analyze(rd.path)
    assert "findings: rule broken failed: ZeroDivisionError: boom (the other rules ran)" in s["warnings"]
    assert "retrograde" in {f["id"] for f in s["findings"]}  # the other rules still ran
    assert "rule broken failed" in (rd.report_dir / "summary.md").read_text()


def test_energy_per_request_from_gpu_power(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=64), users=(1, 2, 4))
    secs = np.arange(T0, T0 + 3 * (RAMP + HOLD), 1.0)
    power = {0: 150.0, 1: 90.0}  # W per GPU, constant: the host draws 240 W
    write_csv(rd.host_dir("server-1") / "gpu.csv", ("t", "gpu", "sm_pct", "power_w"),
              [(t, g, 50.0, power[g]) for t in secs for g in (0, 1)])
    s = analysis.analyze(rd.path)
    for i, st in enumerate(s["steps"]):
        completed = int(steady_rows(rd, i)["ok"].sum())
        assert st["energy_j_per_request"] == pytest.approx(240.0 * (HOLD - SETTLE) / completed, rel=1e-9)
    assert "J/request" in (rd.report_dir / "summary.md").read_text()
    assert all("energy_j_per_token" not in st for st in s["steps"])  # no tokens recorded: not an LLM run


def test_energy_per_output_token_when_tokens_are_recorded(tmp_path):
    import pyarrow.parquet as pq
    rd = make_run(tmp_path, closed_loop(k=64), users=(1, 2))
    for seq, part in enumerate(rd.request_parts()):  # the same rows, now with 40 output tokens each
        df = pq.read_table(part).to_pandas()
        cols = {c: [None if v is None or v != v else v for v in df[c].tolist()] for c in df.columns}
        cols["tokens_out"] = [40] * len(df)
        rd.write_request_part(cols, seq)
    secs = np.arange(T0, T0 + 2 * (RAMP + HOLD), 1.0)
    write_csv(rd.host_dir("server-1") / "gpu.csv", ("t", "gpu", "power_w"), [(t, 0, 300.0) for t in secs])
    s = analysis.analyze(rd.path)
    for i, st in enumerate(s["steps"]):
        completed = int(steady_rows(rd, i)["ok"].sum())
        assert st["energy_j_per_token"] == pytest.approx(300.0 * (HOLD - SETTLE) / (40 * completed), rel=1e-9)
    assert "J/token" in (rd.report_dir / "summary.md").read_text()


def test_no_energy_without_power(tmp_path):
    s = analysis.analyze(make_run(tmp_path, closed_loop(k=64), users=(1, 2)).path)
    assert all("energy_j_per_request" not in st for st in s["steps"])
    json.dumps(s)  # still plain JSON


def test_report_reads_top_down(tmp_path):
    rd = make_run(tmp_path, retrograde(), users=(1, 2, 4, 8, 16, 32))
    rd.update_meta(hosts_preflight={"server-1": {"hostname": "box", "cpu": {"logical_cpus": 16}}})
    s = analysis.analyze(rd.path)
    md = (rd.report_dir / "summary.md").read_text()
    order = ["**Verdict:** throughput stopped scaling at 16 users", "### Findings", "**CRITICAL** `retrograde` (at 16, 32 users)",
             "### Scalability model (USL)", "| users | requests | QPS |", "**Server `server-1`**", "### Hosts"]
    assert [md.index(x) for x in order] == sorted(md.index(x) for x in order)
    assert "**advice:**" in md and "evidence: `peak_users = 16" in md
    html = (rd.report_dir / "index.html").read_text()
    order = ["<b>Verdict:</b>", "<h2>Findings</h2>", "<h2>Scalability model (USL)</h2>", "USL fit",
             "Timeline (steps shaded", "<h3>Load</h3>", "<h3>Server <code>server-1</code></h3>", "<h2>Hosts</h2>"]
    assert [html.index(x) for x in order] == sorted(html.index(x) for x in order)
    for severity in ("critical", "warning"):  # one card per finding
        assert html.count(f"class='finding {severity}'") == sum(f["severity"] == severity for f in s["findings"]) > 0


def test_plan_sections_shown_when_the_summary_has_them():
    from kneeswarm.analysis.summary.gates import add_gates
    from kneeswarm.analysis.reports.markdown import to_markdown
    summary = add_gates({"run_id": "x", "steps": [{"users": 1, "qps": 10.0, "p99_ms": 300.0, "mean_ms": 100.0,
                                                   "error_rate": 0.0, "valid": True}]},
                        {"sla": {"p99_ms": 200.0}, "capacity": {"peak_qps": 100.0}})
    md = to_markdown(summary)
    assert "### SLA\n\n- **FAILED**" in md and "`p99_ms` ≤ 200: 300 at 1 user: **failed**" in md
    assert "### Capacity plan\n" in md


def test_timeline_panel_with_only_secondary_traces_uses_its_primary_axis(tmp_path):
    """plotly.js 3 draws every panel empty when a secondary axis overlays an axis without traces
    (seen in headless Chromium: a GPU panel with power but no memory blanked the whole timeline)."""
    from kneeswarm.analysis.measure.inputs import load_inputs
    from kneeswarm.analysis.reports.html import _timeline_figure
    rd = make_run(tmp_path, closed_loop(k=64), users=(1, 2))
    secs = np.arange(T0, T0 + 2 * (RAMP + HOLD), 1.0)
    write_csv(rd.host_dir("server-1") / "gpu.csv", ("t", "gpu", "sm_pct", "power_w"), [(t, 0, 50.0, 200.0) for t in secs])
    inputs = load_inputs(rd.path)
    fig = _timeline_figure(analysis.summarize(inputs), inputs.scan.timeline, inputs.generator, inputs.hosts, T0)
    layout = fig.to_plotly_json()["layout"]
    used = {t.yaxis or "y" for t in fig.data}
    for axis in used:
        spec = layout["yaxis" + axis[1:]]
        if "overlaying" in spec:  # a secondary axis: its primary carries a trace too
            assert spec["overlaying"] in used, (axis, spec)
    assert any(t.name == "GPU 0 power W" for t in fig.data)


def test_a_step_with_errors_above_the_sla_is_not_valid():
    import pandas as pd
    # Independent truth: 3 of 100 failed is 3%, above a 1% SLA; 0.5% is not.
    from kneeswarm.analysis.measure.trust import error_reason, sla_error_rate, trust_reasons
    stats = pd.DataFrame({"users": [1, 2], "qps": [10.0, 20.0], "mean_ms": [100.0, 100.0], "rps": [10.0, 20.0],
                          "p50_ms": [90.0, 90.0], "error_rate": [0.005, 0.03]})
    limit = sla_error_rate({"sla": {"error_rate": 0.01}})
    assert limit == 0.01 and sla_error_rate({}) is None
    reasons = trust_reasons(stats, 0.0, False, {}, limit)
    assert reasons[0] == [] and reasons[1] == ["errors 3.0% above the SLA's error_rate 1.0%"]
    assert error_reason(0.03, None) is None
