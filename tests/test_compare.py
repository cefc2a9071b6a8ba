"""Run-to-run comparison: bootstrap intervals, verdicts, reports, junit.xml and the exit codes.

The run directories are built here from rows drawn from known distributions: arrivals a Poisson
process of rate λ = RATE x users (so a step's QPS estimate has variance λ/T) and exponential
latencies of mean μ (so the sample P99 has the asymptotic variance p(1-p)/(n f(q)^2) = 99 μ²/n,
f the exponential density at q = μ ln 100).  Those closed forms are the independent truth for the
intervals; the verdicts' truth is how the rows were drawn.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from kneeswarm.analysis.measure import bootstrap
from kneeswarm.analysis.runs.compare import (IMPROVED, MIN_RELATIVE_CHANGE, NO_CHANGE, NOT_COMPARABLE, NOT_COMPARED, REGRESSED, compare_html, compare_markdown, compare_runs, compare_summaries)
from kneeswarm.analysis.schema.comparison import COMPARE_VERSION, Change, Comparison, Side, StepComparison
from kneeswarm.analysis.reports.junit import junit_xml
from conftest import read_summary
from kneeswarm.launch import cli
from kneeswarm.contracts.outcome import EXIT_REGRESSION
from kneeswarm.contracts.rundir import RunDir

USERS = (1, 2, 4, 8)
RATE = 100.0  # requests/s per user
MEAN_MS = 50.0
HOLD = 20.0
T0 = 1_700_000_000.0
Z = 1.959964  # the normal quantile of a 95 % interval
SLOWDOWN = 1.3


def kneeswarm_compare(argv: list[str]) -> int:
    """`kneeswarm compare ARGV...`, its exit code (kneeswarm.launch.cli, in this process)."""
    return cli.main(["compare", *argv])


def make_run(root, name: str, seed: int, slow: float = 1.0, users=USERS, bad_ok_share: dict | None = None):
    """A run directory whose step at u users has Poisson(RATE·u/slow) arrivals over HOLD s and
    exponential latencies of mean MEAN_MS·slow; rows split over two part files."""
    rd = RunDir.create(root, name)
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("t_start", "latency_ms", "ok", "status", "step", "users", "worker")}
    steps, t = [], T0
    for i, u in enumerate(users):
        t_steady, t_end = t + 1.0, t + 1.0 + HOLD
        n = rng.poisson(RATE * u / slow * HOLD)
        ok = np.ones(n, dtype=bool)
        if bad_ok_share and u in bad_ok_share:
            ok[: int(n * bad_ok_share[u])] = False
        cols["t_start"] += list(np.sort(rng.uniform(t_steady, t_end, n)))
        cols["latency_ms"] += list(rng.exponential(MEAN_MS * slow, n))
        cols["ok"] += list(rng.permutation(ok))
        cols["status"] += [200] * n
        cols["step"] += [i] * n
        cols["users"] += [u] * n
        cols["worker"] += ["worker-0"] * n
        steps.append((i, u, t, t_steady, t_end))
        t = t_end
    return write_drawn_run(rd, name, cols, steps)


def write_drawn_run(rd: RunDir, name: str, cols: dict[str, list], steps: list[tuple]) -> Path:
    """The drawn rows as two part files, the steps, a complete meta.json and an open-loop plan."""
    half = len(cols["t_start"]) // 2
    rd.write_request_part({k: v[:half] for k, v in cols.items()}, 0)
    rd.write_request_part({k: v[half:] for k, v in cols.items()}, 1)
    rd.write_steps(steps)
    rd.update_meta(run_id=name, complete=True, ended="completed")
    # arrivals drawn independently of latency: an open loop (Little's law for closed loops does not apply)
    rd.plan_path.write_text("[load]\nsettle = 0.0\nmode = \"open\"\n")
    return rd.path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {"base": make_run(root, "base", seed=1), "same": make_run(root, "same", seed=2),
            "slow": make_run(root, "slow", seed=3, slow=SLOWDOWN)}


def analytic_sd(metric: str, u: int, slow_new: float) -> float:
    """The standard deviation of (new − base) of a metric at u users, from the distributions drawn."""
    lam_b, lam_n = RATE * u, RATE * u / slow_new
    if metric == "qps":
        return math.sqrt(lam_b / HOLD + lam_n / HOLD)
    mu_b, mu_n = MEAN_MS, MEAN_MS * slow_new
    return math.sqrt(99 * mu_b**2 / (lam_b * HOLD) + 99 * mu_n**2 / (lam_n * HOLD))


def true_diff(metric: str, u: int, slow_new: float) -> float:
    if metric == "qps":
        return RATE * u / slow_new - RATE * u
    return math.log(100) * MEAN_MS * (slow_new - 1)


# Measured over 8 seeds x 4 steps (not only the seeds below): the intervals' half-width / (1.96
# analytic sd) was 0.82-1.21 for the QPS and 0.87-1.36 for the P99 (0.74-1.40 subsampled to 3000
# rows): the P99's bootstrap is noisier, and the asymptotic variance is a little low at 1 % tails of
# 20-160 rows.  So 45 % is the tolerance; an interval off by the factor √(n/m) would still fail it.
WIDTH_TOL = 0.45


def check_intervals(result, slow_new: float, width_tol: float = WIDTH_TOL) -> None:
    """Every interval: around the measured difference, as wide as the closed form says (within
    ``width_tol``), and the true difference within the interval widened by one analytic sd."""
    for s in result["steps"]:
        for metric in ("qps", "p99_ms"):
            c, sd = s[metric], analytic_sd(metric, s["users"], slow_new)
            lo, hi = c["ci"]
            assert lo < c["delta"] < hi, (s["users"], metric, c)
            assert (hi - lo) / 2 == pytest.approx(Z * sd, rel=width_tol), (s["users"], metric, c, Z * sd)
            assert lo - sd <= true_diff(metric, s["users"], slow_new) <= hi + sd, (s["users"], metric, c)


def test_same_distribution_is_no_significant_change(runs):
    r = compare_runs(runs["base"], runs["same"])
    assert r["verdict"] == NO_CHANGE and r["reasons"] == []
    assert [s["users"] for s in r["steps"]] == list(USERS)
    assert all(s["verdict"] == NO_CHANGE for s in r["steps"])
    check_intervals(r, 1.0)
    for s in r["steps"]:  # the points are the summary's, i.e. numpy on every row of the window
        assert s["qps"]["base"] == pytest.approx(s["base"]["qps"]) and s["p99_ms"]["new"] == s["new"]["p99_ms"]
    assert r["findings"]["appeared"] == [] and r["findings"]["vanished"] == []
    assert r["warnings"] == []


def test_slower_latency_and_lower_qps_is_regressed(runs):
    r = compare_runs(runs["base"], runs["slow"])
    assert r["verdict"] == REGRESSED
    for s in r["steps"]:
        # QPS -23 % against a threshold of 10 % and an sd of at most 3 %: worse at every step
        assert s["verdict"] == REGRESSED
        assert s["qps"]["direction"] == "worse" and s["qps"]["ci"][1] < 0
        # P99 +30 % against a threshold of 20 %: the sd of the relative change is 8.6 % at 1 user and
        # 3 % at 8, so only the 8-user step must show it; no step may show it as better
        assert s["p99_ms"]["direction"] in ("worse", None) and s["p99_ms"]["ci"][0] > 0
        assert s["users"] != 8 or s["p99_ms"]["direction"] == "worse"
        p99_base = math.log(100) * MEAN_MS
        assert s["p99_ms"]["rel"] == pytest.approx(SLOWDOWN - 1, abs=4 * analytic_sd("p99_ms", s["users"], SLOWDOWN) / p99_base)
    check_intervals(r, SLOWDOWN)
    assert len(r["reasons"]) == sum(1 + (s["p99_ms"]["direction"] == "worse") for s in r["steps"])
    # the USL fit of each run: a linear run has (almost) no contention; its λ fell by the slowdown
    assert r["usl"]["new"]["lambda"] / r["usl"]["base"]["lambda"] == pytest.approx(1 / SLOWDOWN, rel=0.05)


def test_the_other_way_round_is_improved(runs):
    r = compare_runs(runs["slow"], runs["base"])
    assert r["verdict"] == IMPROVED
    assert all(s["qps"]["direction"] == "better" and s["p99_ms"]["direction"] in ("better", None) for s in r["steps"])


def test_subsampled_steps_keep_the_interval_of_all_rows(runs):
    """With at most 3000 rows resampled per step, the 8-user step (16,000 rows) would give an interval
    √(16000/3000) ≈ 2.3 x too wide without the m-out-of-n scaling; it still matches the closed form."""
    r = compare_runs(runs["base"], runs["slow"], max_rows=3000, resamples=600)
    s8 = next(s for s in r["steps"] if s["users"] == 8)
    assert s8["base"]["rows_resampled"] == 3000 and s8["base"]["rows"] > 15000
    check_intervals(r, SLOWDOWN)
    assert r["verdict"] == REGRESSED


def test_seeded_results_repeat(runs):
    a = compare_runs(runs["base"], runs["same"], resamples=200)
    b = compare_runs(runs["base"], runs["same"], resamples=200)
    assert [s["p99_ms"]["ci"] for s in a["steps"]] == [s["p99_ms"]["ci"] for s in b["steps"]]


def test_small_but_certain_change_is_not_significant():
    """A 2 % QPS drop measured precisely: the interval excludes 0 but the change is under the threshold."""
    from kneeswarm.analysis.runs.compare import metric_change

    c = metric_change("qps", 100.0, 98.0, [-2.5, -1.5])
    assert c["significant"] is False and MIN_RELATIVE_CHANGE["qps"] > 0.02
    assert metric_change("qps", 100.0, 80.0, [-25.0, -15.0])["direction"] == "worse"
    assert metric_change("qps", 100.0, 80.0, [-25.0, 1.0])["significant"] is False  # interval holds 0


def test_unmatched_and_invalid_steps(tmp_path, runs):
    # the new run has an extra 16-user step and a 4-user step whose successes are too few to be valid
    new = make_run(tmp_path, "odd", seed=4, users=(1, 2, 4, 8, 16))
    r = compare_runs(runs["base"], new)
    assert r["unmatched"] == {"base_only": [], "new_only": [16]}
    short = make_run(tmp_path, "short", seed=5, users=(1,))
    rd = RunDir(short)
    # 1-user step with only 50 requests: not valid (min_requests 100)
    rd.write_request_part({"t_start": list(T0 + 1 + np.linspace(0, 19, 50)), "latency_ms": [50.0] * 50,
                           "ok": [True] * 50}, 0)
    for p in rd.request_parts()[1:]:
        p.unlink()
    r2 = compare_runs(runs["base"], short)
    (s1,) = r2["steps"]
    assert s1["verdict"] == NOT_COMPARED and s1["new"]["valid"] is False
    assert r2["verdict"] == NOT_COMPARABLE
    assert kneeswarm_compare([str(runs["base"]), str(short), "-q", "--out", str(tmp_path / "o")]) == 2


def test_a_torn_part_of_unknown_range_is_a_warning_and_leaves_nothing_comparable(tmp_path, runs):
    # A part whose footer is gone could have held rows of any step: the analysis marks every
    # step not valid, so no step's QPS can be trusted for a comparison.
    torn = make_run(tmp_path, "torn", seed=2)
    (RunDir(torn).requests_dir / "part-000009.parquet").write_bytes(b"PAR1 not really")
    r = compare_runs(runs["base"], torn)
    # the torn part itself, and the analysis calling the run incomplete because of it
    assert len(r["warnings"]) == 2 and "part-000009.parquet" in r["warnings"][0]
    assert "incomplete" in r["warnings"][1] and "request_parts=1" in r["warnings"][1]
    assert r["verdict"] == NOT_COMPARABLE
    assert all(s["verdict"] == NOT_COMPARED and s["new"]["valid"] is False for s in r["steps"])


def test_findings_knee_and_peak_shift_from_summaries():
    def st(u, q):
        return {"users": u, "qps": q, "p99_ms": 60.0, "mean_ms": 1000 * u / q, "error_rate": 0.0, "valid": True,
                "requests": 1000, "reasons": []}

    base = {"steps": [st(1, 20), st(2, 40), st(4, 80), st(8, 150), st(16, 155)],
            "knee": {"users": 8, "qps": 150.0}, "peak": {"users": 16, "qps": 155.0}}
    # the new run peaks at 4 users and falls 25 % below the peak at 16: retrograde appears
    new = {"steps": [st(1, 20), st(2, 40), st(4, 100), st(8, 90), st(16, 75)],
           "knee": {"users": 4, "qps": 100.0}, "peak": {"users": 4, "qps": 100.0}}
    c = compare_summaries(base, new)
    assert [f["id"] for f in c["findings"]["appeared"]] == ["retrograde"] and c["findings"]["vanished"] == []
    assert c["knee"]["users_ratio"] == 0.5 and c["knee"]["qps_rel"] == pytest.approx(100 / 150 - 1)
    assert c["peak"]["qps_rel"] == pytest.approx(100 / 155 - 1)
    assert c["usl"]["new"]["kappa"] > c["usl"]["base"]["kappa"]  # the retrograde curve has the coherency cost
    back = compare_summaries(new, base)
    assert [f["id"] for f in back["findings"]["vanished"]] == ["retrograde"]


def test_markdown_html_and_junit_of_a_regression(runs):
    r = compare_runs(runs["base"], runs["slow"], resamples=300)
    md = compare_markdown(r)
    assert md.startswith("## kneeswarm compare: ❌ regressed")
    n_worse = sum((s["qps"]["direction"] == "worse") + (s["p99_ms"]["direction"] == "worse") for s in r["steps"])
    assert md.count("**worse**") == n_worse >= len(USERS) + 1
    page = compare_html(r)
    assert page.startswith("<!DOCTYPE html>") and "<script src=\"https://cdn.plot.ly" not in page and "Plotly.newPlot" in page
    assert '"name":"base"' in page and '"name":"new"' in page
    root = ET.fromstring(junit_xml(None, r))
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "regression" and suite.get("tests") == str(2 * len(USERS))
    assert suite.get("failures") == str(n_worse)
    assert "8 users p99_ms" in [c.get("name") for c in suite.findall("testcase")]


def test_compare_command_exit_codes_and_files(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert kneeswarm_compare([str(runs["base"]), str(runs["slow"]), "--out", str(out), "-q"]) == 0  # no gate asked
    assert kneeswarm_compare([str(runs["base"]), str(runs["slow"]), "--out", str(out), "--fail-on-regression", "-q"]) \
        == EXIT_REGRESSION == 4
    written = json.loads((out / "compare.json").read_text())
    assert written["verdict"] == REGRESSED
    # compare.json holds what kneeswarm.analysis.runs.compare declares, no more and no less (its one contract)
    assert set(written) == Comparison.__required_keys__ and written["version"] == COMPARE_VERSION
    assert all(set(s) == StepComparison.__required_keys__ and set(s["base"]) == Side.__required_keys__
               and set(s["qps"]) == Change.__required_keys__ for s in written["steps"])
    assert {p.name for p in out.iterdir()} >= {"compare.json", "compare.md", "compare.html", "junit.xml"}
    ET.parse(out / "junit.xml")
    assert kneeswarm_compare([str(runs["base"]), str(runs["same"]), "--fail-on-regression"]) == 0
    assert (RunDir(runs["same"]).report_dir / "compare" / "compare.md").exists()  # default: NEW/report/compare
    assert "no significant change" in capsys.readouterr().out
    assert kneeswarm_compare([str(runs["base"]), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nowhere" in err and "not a directory" in err


def test_an_unreadable_plan_is_bad_input_and_a_missing_one_is_said(runs, tmp_path, capsys):
    """plan.toml that is there but unreadable: exit 2, one line naming it, nothing written (its
    findings would otherwise be judged with the defaults, silently); a run without one: a warning."""
    import shutil

    bad = Path(shutil.copytree(runs["slow"], tmp_path / "bad"))
    (bad / "report" / "compare").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(bad / "report" / "compare")
    (bad / "plan.toml").write_text("[load\nsettle = 0.0\n")
    assert kneeswarm_compare([str(runs["base"]), str(bad), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "plan.toml" in err and "unreadable" in err and "Traceback" not in err
    assert not (bad / "report" / "compare").exists()
    (bad / "plan.toml").unlink()
    result = compare_runs(runs["base"], bad)
    assert [w for w in result["warnings"] if "new run has no plan.toml" in w], result["warnings"]


def test_bootstrap_qps_interval_on_counts_with_known_variance():
    """The bin bootstrap alone: Poisson counts of rate λ over T s give sd(QPS) = √(λ/T)."""
    rng = np.random.default_rng(11)
    s = bootstrap.StepSample(1, 0.0, 40.0, 40)
    s.counts = rng.poisson(200.0, 40)
    devs = bootstrap.qps_deviations(s, np.random.default_rng(0), 4000)
    assert devs.std() == pytest.approx(math.sqrt(200.0 / 40.0), rel=0.25)
    assert abs(devs.mean()) < 0.1 * devs.std()


def test_holm_adjusts_by_its_step_down_definition():
    """Holm (1979), by hand: sorted p 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06,
    0.04, then each at least the one before it: 0.02, 0.03, 0.06, 0.06, put back in the given order."""
    assert bootstrap.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert bootstrap.holm([0.5, 0.9]) == [1.0, 1.0] and bootstrap.holm([]) == []


def test_bootstrap_p_value_is_the_interval_turned_round():
    """Deviations drawn N(0, 1) on each side: new - base has sd √2, so the p-value of a difference d
    is 2(1 - Φ(d/√2)); and p < 5 % exactly where the 95 % interval of diff_interval leaves 0 out."""
    rng = np.random.default_rng(5)
    base, new = rng.normal(size=20_000), rng.normal(size=20_000)
    for d in (0.0, 1.0, 2.0, 2.77, 3.5, -3.0):
        p = bootstrap.diff_p_value(base, new, d)
        assert p == pytest.approx(math.erfc(abs(d) / 2), abs=0.02), d  # 2(1 - Φ(|d|/√2)) = erfc(|d|/2)
        lo, hi = bootstrap.diff_interval(base, new, d)
        assert (p < 0.05) == (lo > 0 or hi < 0), (d, p, lo, hi)
    assert bootstrap.diff_p_value(None, new, 1.0) is None and bootstrap.diff_p_value(base, new, None) is None


# -- against real processes: the conductor, Locust, the demo target ----------------------------------
KNEE_SLOTS, KNEE_SERVICE_MS = 4, 50.0


def real_runs(start_demo_target, out, service_ms: dict[str, float]) -> dict[str, Path]:
    """One real run per name (`kneeswarm run`: Locust master + worker, agents) against its own
    knee-mode demo target of that service time, all side by side: each run sees the same machine
    (the same other load, at the same time), so only the service time tells them apart.  A steady
    window of 7 s: the slowed run's 1-user step (15 req/s) still holds the 100 rows a compared step
    needs (min_requests); a ramp and a settle of 0.5 s, ten of the 50-ms requests, are enough for a
    closed loop of at most 8 users to reach its steady state."""
    from conftest import start_cli

    procs = {}
    try:
        for name, ms in service_ms.items():
            target = start_demo_target("--mode", "knee", "--slots", str(KNEE_SLOTS), "--service-ms", str(ms))
            procs[name] = start_cli("run", "--target", target.url, "--steps", "1,4,8", "--hold", "7.5",
                                    "--ramp", "0.5", "--settle", "0.5", "--workers", "1", "--pid", str(target.pid), "--name", name,
                                    "--out", str(out / name), "-q")
        errs = {name: p.communicate(timeout=240)[1] for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    paths = {}
    for name, p in procs.items():
        assert p.returncode == 0, (name, errs[name][-2000:])  # 0: completed and analysed
        (paths[name],) = [d for d in (out / name).iterdir() if d.is_dir()]
        assert RunDir(paths[name]).read_meta()["ended"] == "completed" and read_summary(paths[name])["complete"] is True
    return paths


@pytest.mark.long
@pytest.mark.slow
def test_real_target_slowed_by_30_percent_is_regressed_and_a_repeat_is_not(start_demo_target, tmp_path):
    runs = real_runs(start_demo_target, tmp_path, {"base": KNEE_SERVICE_MS, "again": KNEE_SERVICE_MS,
                                                   "slow": KNEE_SERVICE_MS * SLOWDOWN})
    base, again, slow = runs["base"], runs["again"], runs["slow"]
    same = compare_runs(base, again)
    print("repeat:", [(s["users"], s["qps"] and round(s["qps"]["rel"], 3), s["p99_ms"] and round(s["p99_ms"]["rel"], 3))
                      for s in same["steps"]])
    assert same["verdict"] == NO_CHANGE, same["reasons"]
    worse = compare_runs(base, slow)
    print("slowed:", [(s["users"], s["qps"] and round(s["qps"]["rel"], 3), s["p99_ms"] and round(s["p99_ms"]["rel"], 3))
                      for s in worse["steps"]])
    assert worse["verdict"] == REGRESSED
    # ground truth: QPS = min(users, slots) x 1000 / (service_ms + the overhead of a request), so every
    # step's QPS fell by a little less than 1 - 1/1.3 = 23 % (measured: 19-25 %)
    for s in worse["steps"]:
        assert s["qps"]["direction"] == "worse", s
        assert -0.30 <= s["qps"]["rel"] <= -0.12, s
    # and the gate's exit code, through the command line function
    assert kneeswarm_compare([str(base), str(slow), "--fail-on-regression", "-q", "--out", str(tmp_path / "o")]) == 4
