"""The SLA gate, the capacity plan and `kneeswarm compare` wired into the analysis and the CLI.

Everything runs through the real `kneeswarm` console script on run directories built here from
rows drawn from known distributions.  The truth of the SLA and the capacity plan is numpy on those
same rows (a step's P99 is np.percentile of its successful latencies in the steady window, its QPS
the successes per second of window) and the digest's rules written out here; the truth of a
comparison is how its rows were drawn (tests/test_compare.py's builder).  The slow test runs the
demo target's knee mode, whose every request takes at least its service time: an SLA below that
cannot be met.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kneeswarm.launch import cli
from kneeswarm.contracts.outcome import EXIT_REGRESSION, EXIT_SLA_FAILED
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.contracts.rundir import RunDir

from conftest import REPO
from test_compare import make_run

USERS = (1, 2, 4, 8)
RATE = 200.0  # requests/s per user
MEAN_MS_PER_USER = 20.0  # latency exponential with mean 20 ms × users: P99 ≈ 92 ms × users
HOLD = 10.0
T0 = 1_700_000_000.0
SLA_P99 = 300.0  # between the 2-user (~184 ms) and the 4-user (~368 ms) P99
PEAK_QPS = 1000.0
SPARE = 1
GATE_PLAN = {"load": {"settle": 0.0}, "sla": {"p99_ms": SLA_P99, "error_rate": 0.01},
             "capacity": {"peak_qps": PEAK_QPS, "spare": SPARE}}


def kneeswarm(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The real `kneeswarm` console script (the venv's), with this tree first on the path."""
    script = Path(sys.executable).with_name("kneeswarm")
    exe = str(script) if script.exists() else shutil.which("kneeswarm")
    assert exe, "the kneeswarm console script is not installed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def build_run(root: Path, name: str, plan: dict | None, error_share: dict | None = None, seed: int = 0,
              complete: bool = True) -> Path:
    """A run whose step at u users has RATE·u·HOLD rows in its steady window, exponential latencies
    of mean MEAN_MS_PER_USER·u, and ``error_share[u]`` of its rows failed; plan.toml from ``plan``
    written by the plan module itself (so it is the resolved plan a real run leaves)."""
    rd = RunDir.create(root, name)
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("t_start", "latency_ms", "ok", "status", "error", "step", "users", "worker")}
    steps, t = [], T0
    for i, u in enumerate(USERS):
        t_steady, t_end = t + 1.0, t + 1.0 + HOLD
        n = int(RATE * u * HOLD)
        bad = int(n * (error_share or {}).get(u, 0.0))
        ok = rng.permutation(np.arange(n) >= bad)
        cols["t_start"] += list(np.sort(rng.uniform(t_steady, t_end, n)))
        cols["latency_ms"] += list(rng.exponential(MEAN_MS_PER_USER * u, n))
        cols["ok"] += list(ok)
        cols["status"] += [200 if x else 503 for x in ok]
        cols["error"] += [None if x else "http_5xx" for x in ok]
        cols["step"] += [i] * n
        cols["users"] += [u] * n
        cols["worker"] += ["worker-0"] * n
        steps.append((i, u, t, t_steady, t_end))
        t = t_end
    rd.write_request_part(cols, 0)
    rd.write_steps(steps)
    rd.update_meta(run_id=name, complete=complete, ended="completed" if complete else "load_failed")
    rd.plan_path.write_text(open_loop(plan_from_dict(plan or {"load": {"settle": 0.0}}).to_toml()))
    return rd.path


def open_loop(plan_toml: str) -> str:
    """The rows above arrive at RATE·u whatever their latency: an open loop, which the plan must
    say, or the analysis rightly finds Little's law broken for a closed loop and no step valid."""
    if 'arrivals = "closed"' in plan_toml:
        return plan_toml.replace('arrivals = "closed"', 'arrivals = "open"', 1)
    return plan_toml.replace("[load]\n", '[load]\narrivals = "open"\n', 1)


def truth(run: Path) -> dict[int, dict[str, float]]:
    """numpy on the run's rows: per users, P99 and mean of the successes, QPS, error rate."""
    t = pq.read_table(next((run / "requests").glob("part-*.parquet"))).to_pandas()
    out = {}
    for u, g in t.groupby("users"):
        lat = g.loc[g["ok"], "latency_ms"].to_numpy()
        out[int(u)] = {"p99": float(np.percentile(lat, 99)), "mean": float(lat.mean()), "qps": lat.size / HOLD,
                       "error_rate": float((~g["ok"]).mean())}
    return out


def summary_of(run: Path) -> dict:
    return json.loads((run / "report" / "summary.json").read_text())


def junit_cases(run_or_file: Path) -> dict[str, ET.Element]:
    path = run_or_file if run_or_file.is_file() else run_or_file / "report" / "junit.xml"
    return {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}


@pytest.fixture
def root(tmp_path):
    return tmp_path


# -- the SLA, applied from plan.toml ---------------------------------------------------------------
def test_sla_met_up_to_the_highest_step_numpy_says_and_the_gate_passes(root):
    run = build_run(root, "met", GATE_PLAN)
    res = kneeswarm("analyze", str(run), "--fail-on-sla")
    assert res.returncode == 0, res.stderr
    tr = truth(run)
    meeting = [u for u in USERS if tr[u]["p99"] <= SLA_P99 and tr[u]["error_rate"] <= 0.01]
    assert meeting == [1, 2]  # the drawn P99s straddle the limit as designed
    sla = summary_of(run)["sla"]
    assert sla["set"] is True and sla["passed"] is True
    assert sla["best"]["users"] == 2 and sla["best"]["qps"] == pytest.approx(tr[2]["qps"])
    assert sla["limits"] == {"p99_ms": SLA_P99, "error_rate": 0.01}
    p99 = next(c for c in sla["checks"] if c["name"] == "p99_ms")
    assert p99["value"] == pytest.approx(tr[2]["p99"], rel=1e-9) and p99["highest_users_alone"] == 2
    cases = junit_cases(run)
    assert set(cases) == {"p99_ms <= 300", "error_rate <= 0.01"}
    assert all(c.find("failure") is None for c in cases.values())
    md = (run / "report" / "summary.md").read_text()
    assert "### SLA" in md and "**PASSED**" in md and "### Capacity plan" in md
    assert "### SLA" in res.stdout  # the printed summary.md carries it too


def test_capacity_plan_follows_the_digest_on_the_numpy_figures(root):
    run = build_run(root, "cap", GATE_PLAN)
    assert kneeswarm("analyze", str(run)).returncode == 0
    tr = truth(run)
    cap = summary_of(run)["capacity"]
    stable = max(tr[1]["qps"], tr[2]["qps"])  # the steps meeting the SLA
    assert cap["max_stable_qps"]["value"] == pytest.approx(stable)
    # highest SLA-meeting step whose QPS leaves >= 30 % of the max stable QPS: 1 user (~50 % left)
    rec = max(u for u in (1, 2) if 1 - tr[u]["qps"] / stable >= 0.30)
    assert cap["recommended_users"]["value"] == rec == 1
    assert cap["safe_qps"]["value"] == pytest.approx(0.7 * stable)
    assert cap["replicas"]["value"] == math.ceil(PEAK_QPS / (0.7 * stable)) + SPARE
    assert cap["single_inference_ms"]["value"] == pytest.approx(tr[1]["mean"])
    assert cap["settings"]["spare"] == SPARE and cap["settings"]["peak_qps"] == PEAK_QPS


def test_sla_failed_exits_3_only_with_the_gate_and_junit_names_the_failed_check(root):
    plan = {**GATE_PLAN, "sla": {"p99_ms": 50.0, "error_rate": 0.01}}  # below even the 1-user P99 (~92 ms)
    run = build_run(root, "failed", plan)
    tr = truth(run)
    assert tr[1]["p99"] > 50.0
    res = kneeswarm("analyze", str(run), "--fail-on-sla")
    assert res.returncode == EXIT_SLA_FAILED == 3, res.stderr
    err = [line for line in res.stderr.splitlines() if "SLA failed" in line]
    assert len(err) == 1 and "p99_ms" in err[0]
    cases = junit_cases(run)
    failure = cases["p99_ms <= 50"].find("failure")
    assert failure is not None and f"{tr[1]['p99']:.6g}" in failure.get("message")
    assert cases["error_rate <= 0.01"].find("failure") is None
    root_el = ET.parse(run / "report" / "junit.xml").getroot()
    assert (root_el.get("tests"), root_el.get("failures")) == ("2", "1")
    assert summary_of(run)["sla"]["passed"] is False
    assert kneeswarm("analyze", str(run)).returncode == 0  # without the gate the analysis is done


def test_error_rate_limit_lowers_the_best_step(root):
    run = build_run(root, "errors", GATE_PLAN, error_share={2: 0.05})
    assert kneeswarm("analyze", str(run), "--fail-on-sla").returncode == 0
    tr = truth(run)
    assert tr[2]["error_rate"] == pytest.approx(0.05)
    sla = summary_of(run)["sla"]
    assert sla["best"]["users"] == 1 and sla["below_best_failed"] == []
    assert next(c for c in sla["checks"] if c["name"] == "error_rate")["highest_users_alone"] == 8


def test_incomplete_run_exits_1_before_the_sla_gate(root):
    run = build_run(root, "incomplete", {**GATE_PLAN, "sla": {"p99_ms": 50.0}}, complete=False)
    res = kneeswarm("analyze", str(run), "--fail-on-sla")
    assert res.returncode == 1, res.stderr
    assert summary_of(run)["sla"]["passed"] is False  # the SLA was still checked and recorded


def test_run_without_sla_records_so_and_the_gate_is_bad_input(root):
    run = build_run(root, "nosla", None)
    res = kneeswarm("analyze", str(run))
    assert res.returncode == 0, res.stderr
    sla = summary_of(run)["sla"]
    assert sla["set"] is False and sla["passed"] is None and "no SLA set" in sla["text"]
    assert summary_of(run)["capacity"]["max_stable_qps"]["value"] == pytest.approx(truth(run)[8]["qps"])
    (case,) = junit_cases(run).values()
    assert case.find("skipped") is not None and case.find("failure") is None
    res = kneeswarm("analyze", str(run), "--fail-on-sla")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "[sla]" in res.stderr


def test_bad_sla_key_in_an_old_plan_is_a_warning_not_a_crash(root):
    run = build_run(root, "badkey", GATE_PLAN)
    text = run.joinpath("plan.toml").read_text().replace("p99_ms = 300.0", "p95_ms = 300.0")
    run.joinpath("plan.toml").write_text(text)
    res = kneeswarm("analyze", str(run))
    assert res.returncode == 0, res.stderr
    s = summary_of(run)
    assert any("[sla] p95_ms: unknown key" in w for w in s["warnings"])
    assert s["sla"]["limits"] == {"error_rate": 0.01}


def test_sla_round_trips_through_the_run_directorys_plan(root):
    """The resolved plan.toml carries [sla] and [capacity]: a later analysis applies the same."""
    run = build_run(root, "roundtrip", GATE_PLAN)
    written = tomllib.loads(run.joinpath("plan.toml").read_text())
    assert written["sla"] == GATE_PLAN["sla"] and written["capacity"] == GATE_PLAN["capacity"]
    assert kneeswarm("analyze", str(run)).returncode == 0
    first = summary_of(run)["sla"]
    assert kneeswarm("analyze", str(run)).returncode == 0
    assert summary_of(run)["sla"] == first


# -- run flags that are bad input: no run directory left behind -------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--fail-on-sla"], "--fail-on-sla needs an SLA"),
    (["--sla-p99-ms", "-5"], "sla.p99_ms must be > 0"),
    (["--sla-error-rate", "1.5"], "sla.error_rate must be >= 0 and <= 1"),
])
def test_run_gate_flags_that_are_bad_input(root, flags, message):
    out = root / "runs"
    res = kneeswarm("run", "--target", "http://127.0.0.1:9", "--out", str(out), *flags, timeout=60)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())


def test_help_lists_the_gate_flags():
    for command, flags in (("run", ("--fail-on-sla", "--sla-p99-ms", "--sla-error-rate")),
                           ("analyze", ("--fail-on-sla",)), ("compare", ("--fail-on-regression", "--out"))):
        res = kneeswarm(command, "--help", timeout=60)
        assert res.returncode == 0 and all(f in res.stdout for f in flags), (command, res.stdout)


def test_exit_codes_agree_between_the_cli_and_the_gates():
    assert cli.EXIT_SLA_FAILED == EXIT_SLA_FAILED == 3 and EXIT_REGRESSION == 4


# -- compare through the console script -------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return {"base": make_run(root, "base", seed=1), "same": make_run(root, "same", seed=2),
            "slow": make_run(root, "slow", seed=3, slow=1.3)}


def test_compare_slowed_run_exits_4_with_the_gate(pair, tmp_path):
    out = tmp_path / "cmp"
    res = kneeswarm("compare", str(pair["base"]), str(pair["slow"]), "--fail-on-regression", "--out", str(out))
    assert res.returncode == EXIT_REGRESSION == 4, res.stderr
    assert json.loads((out / "compare.json").read_text())["verdict"] == "regressed"
    assert "regressed" in res.stdout  # the markdown summary for a pull request
    failed = [n for n, c in junit_cases(out / "junit.xml").items() if c.find("failure") is not None]
    assert "1 users qps" in failed  # QPS fell by 1/1.3 at every step
    assert (out / "compare.html").is_file() and (out / "compare.md").is_file()
    res = kneeswarm("compare", str(pair["base"]), str(pair["slow"]), "--out", str(out), "-q")
    assert res.returncode == 0 and res.stdout == ""  # no gate, no failure


def test_compare_same_configuration_exits_0_and_writes_under_the_new_run(pair):
    res = kneeswarm("compare", str(pair["base"]), str(pair["same"]), "--fail-on-regression", "-q")
    assert res.returncode == 0, res.stderr
    assert json.loads((pair["same"] / "report" / "compare" / "compare.json").read_text())["verdict"] != "regressed"


def test_compare_bad_input_exits_2_with_one_line(pair, tmp_path):
    res = kneeswarm("compare", str(pair["base"]), str(tmp_path / "nope"), "--fail-on-regression")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "nope" in res.stderr
    assert kneeswarm("compare", str(pair["base"])).returncode == 2  # a missing argument


# -- against the real demo target -------------------------------------------------------------------
REAL_TEST = "test_real_run_against_the_knee_target_fails_an_sla_below_its_service_time"
REAL_SERVICE_MS = 50


@pytest.fixture(scope="module", autouse=True)
def real_sla_run(request, tmp_path_factory):
    """The slow test's real run, started with this module when that test is selected, so that it
    goes while the module's other tests (run directories built here, nothing timed) run; the test
    collects it.  The console script as `kneeswarm()` runs it, output to files nobody reads early."""
    if not any(item.name == REAL_TEST for item in request.session.items):
        yield None
        return
    tmp = tmp_path_factory.mktemp("real_sla")
    plan = tmp / "plan.toml"
    plan.write_text(f"[sla]\np99_ms = {REAL_SERVICE_MS - 10}\nerror_rate = 0.01\n[capacity]\npeak_qps = 500\n")
    out, stdout, stderr = tmp / "runs", tmp / "stdout.txt", tmp / "stderr.txt"
    proc, url = cli.start_target(["--mode", "knee", "--slots", "4", "--service-ms", str(REAL_SERVICE_MS)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with stdout.open("w") as o, stderr.open("w") as e:
        run = subprocess.Popen([str(Path(sys.executable).with_name("kneeswarm")), "run", str(plan), "--target", url,
                                "--steps", "1,2,4", "--hold", "5", "--ramp", "1", "--settle", "1", "--workers", "1",
                                "--pid", str(proc.pid), "--out", str(out), "-q", "--fail-on-sla"],
                               stdout=o, stderr=e, text=True, cwd=REPO, env=env)
    try:
        yield run, out, stderr
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        cli.stop_target(proc)


@pytest.mark.slow
def test_real_run_against_the_knee_target_fails_an_sla_below_its_service_time(real_sla_run):
    """The knee target holds each request SERVICE_MS: a P99 limit below it cannot be met."""
    service_ms = REAL_SERVICE_MS
    run_proc, out, stderr = real_sla_run
    run_proc.wait(timeout=240)
    res = subprocess.CompletedProcess(run_proc.args, run_proc.returncode, "", stderr.read_text())
    assert res.returncode == 3, res.stderr[-3000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    failure = junit_cases(run)[f"p99_ms <= {service_ms - 10}"].find("failure")
    assert failure is not None
    value = float(failure.get("message").split("=")[1].split()[0])
    assert value >= service_ms  # no request is served faster than the service time
    s = summary_of(run)
    assert s["complete"] is True and s["sla"]["passed"] is False and s["sla"]["best"] is None
    assert tomllib.loads((run / "plan.toml").read_text())["sla"]["p99_ms"] == service_ms - 10
    again = kneeswarm("analyze", str(run), "--fail-on-sla")  # months later: the same SLA from plan.toml
    assert again.returncode == 3


# -- the module's own edges ---------------------------------------------------------------------------
def test_sla_that_is_not_a_table_is_a_problem_and_no_sla():
    from kneeswarm.analysis.summary.gates import evaluate

    summary = {"steps": [{"users": 1, "qps": 10.0, "p99_ms": 5.0, "mean_ms": 2.0, "error_rate": 0.0, "valid": True}]}
    sla, capacity = evaluate(summary, {"sla": 5})
    assert sla["set"] is False and sla["passed"] is None
    assert sla["problems"] == ["plan.toml: [sla] is not a table (5); no SLA checked"]
    assert capacity["max_stable_qps"]["value"] == 10.0


def test_gate_sections_and_junit_of_a_failed_check(tmp_path):
    import xml.etree.ElementTree as ET

    from kneeswarm.analysis.summary.gates import add_gates
    from kneeswarm.analysis.reports.junit import write_junit
    from kneeswarm.analysis.reports.sections import plan_lines

    summary = {"warnings": [], "steps": [{"users": 1, "qps": 10.0, "p99_ms": 5.0, "mean_ms": 2.0,
                                          "error_rate": 0.0, "valid": True}]}
    add_gates(summary, {"sla": {"p99_ms": 4.0}})
    sections = dict(plan_lines(summary))  # what summary.md and index.html render
    assert set(sections) == {"SLA", "Capacity plan"}
    assert "`p99_ms` ≤ 4: 5 at 1 user: **failed**" in sections["SLA"]
    write_junit(summary, tmp_path)
    (case,) = ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")
    assert case.find("failure") is not None


def test_demo_gate_without_an_sla_is_bad_input_before_the_target_starts(root):
    res = kneeswarm("demo", "--fail-on-sla", "--out", str(root / "runs"), timeout=60)
    assert res.returncode == 2 and "--fail-on-sla needs an SLA" in res.stderr
    assert "demo target" not in res.stderr and not (root / "runs").exists()
