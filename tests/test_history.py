"""`kneeswarm history` on a history built here from real short runs against the demo target.

Two plans, run side by side, one run of each per round (the installed console script, a real
Locust master and worker, the demo target restarted on the same port for each run so every run of
a plan has the same target):
- "drift": the target's service time (``--ttft-ms``, what each request waits before its answer)
  rises slowly from run to run, and at one run the prompts grow from 32 to 512 words and the
  service time jumps with them (a server that is slower on longer inputs);
- "steady": the same service time every run.
The truth is what the test configured: the service times, the prompt lengths, which run changed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kneeswarm.analysis.runs.history import INDEX_NAME
from kneeswarm.contracts.outcome import EXIT_DRIFT
from kneeswarm.launch.cli import start_target, stop_target
from tests.conftest import REPO, read_summary, run_cli, side_by_side, start_cli, wait_for
from tests.test_soak import SOAK_PLAN

# rising 4 ms a run, and +28 ms where the inputs grow: steps above the ms by which a busy 2-core
# machine lifts one run's median (seen: +5 ms; with +18 ms, three test runs side by side once put
# the change point one run early)
DRIFT_TTFT_MS = (20, 24, 28, 32, 60, 64)
DRIFT_PROMPT = (32, 32, 32, 32, 512, 512)
CHANGED_AT = 4  # the run where the prompts grew
STEADY_TTFT_MS, STEADY_RUNS = 20, 5
USERS = 2
# hold 1.5 s after a settle of 0.5 s: a steady window of ~1 s.  The slowest run (64 ms + at most the
# 15 ms round trip the test allows) still makes 2 / 0.079 s = 25 requests in it: above min_requests
# (20) and the 20 a P50 needs to be measured (MIN_TAIL_ROWS 10 / 0.5); its P99 stays unmeasured.
PLAN = """name = "{name}"
target = "{target}"
protocol = "openai"
[load]
steps = [{users}]
ramp = 0.5
hold = 1.5
settle = 0.5
workers = 1
[request]
model = "demo"
stream = false
max_tokens = 1
prompt_tokens = {prompt}
[analysis]
min_requests = 20
[sla]
p99_ms = 1000
"""


@dataclass
class History:
    root: Path
    runs: dict[str, list[Path]]  # plan name -> its run directories in order


def _target(ttft: float, port: int) -> tuple[subprocess.Popen, str]:
    return start_target(["--mode", "knee", "--ttft-ms", str(ttft), "--output-tokens", "1", "--port", str(port)])


def _round(root: Path, plans: dict[str, tuple[float, int]], ports: dict[str, int]) -> dict[str, Path]:
    """One run of each plan side by side; {plan: its new run directory}."""
    before = {p for p in root.iterdir()} if root.exists() else set()
    targets = {}
    try:
        with side_by_side() as started:
            for name, (ttft, prompt) in plans.items():
                proc, url = _target(ttft, ports.get(name, 0))
                targets[name] = proc
                ports[name] = int(url.rsplit(":", 1)[1])
                plan = root.parent / f"{name}-{len(before)}.toml"
                plan.write_text(PLAN.format(name=name, target=url, users=USERS, prompt=prompt))
                started[name] = start_cli("run", str(plan), "--out", str(root), "-q",
                                          env={**os.environ, "PYTHONPATH": str(REPO)})
            for name, p in started.items():
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, err[-2000:]
    finally:
        for proc in targets.values():
            stop_target(proc)
    new = sorted(set(root.iterdir()) - before)
    return {name: next(d for d in new if d.name.endswith("-" + name)) for name in plans}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> History:
    base = tmp_path_factory.mktemp("history")
    root = base / "runs"
    root.mkdir()
    ports: dict[str, int] = {}
    runs: dict[str, list[Path]] = {"drift": [], "steady": []}
    for i, (ttft, prompt) in enumerate(zip(DRIFT_TTFT_MS, DRIFT_PROMPT)):
        plans = {"drift": (ttft, prompt)}
        if i < STEADY_RUNS:
            plans["steady"] = (STEADY_TTFT_MS, 32)
        for name, d in _round(root, plans, ports).items():
            runs[name].append(d)
    return History(root, runs)


def _history(*args: str) -> subprocess.CompletedProcess:
    return run_cli("history", *args, timeout=120)


def _result(root: Path) -> dict:
    return json.loads((root / "history" / "history.json").read_text())


def _series(result: dict, plan: str, figure: str) -> dict:
    g = next(g for g in result["groups"] if g["plan"] == plan)
    return next(s for s in g["series"] if s["figure"] == figure)


@pytest.mark.long
@pytest.mark.slow
def test_history_finds_the_drift_and_names_input_length_at_the_change_point(built: History):
    res = _history(str(built.root), "--fail-on-drift")
    assert res.returncode == EXIT_DRIFT, res.stderr
    assert res.stderr.startswith("kneeswarm history: drifted worse: drift p50_ms at 2 users +")  # one line for CI
    assert len(res.stderr.strip().splitlines()) == 1
    result = _result(built.root)
    p50 = _series(result, "drift", f"p50_ms at {USERS} users")
    assert p50["drift"]["drifting"] and p50["drift"]["direction"] == "worse"
    # each run's median latency is its configured service time plus the loopback round trip
    for value, ttft in zip(p50["values"], DRIFT_TTFT_MS):
        assert ttft <= value < ttft + 15, (p50["values"], DRIFT_TTFT_MS)
    cp = p50["change_point"]
    assert cp["run"] == built.runs["drift"][CHANGED_AT].name
    assert cp["previous_run"] == built.runs["drift"][CHANGED_AT - 1].name
    inputs = [c for c in cp["changes"] if c["what"] == "input length"]
    assert {c["key"]: (c["before"], c["after"]) for c in inputs}["tokens_in p50"] == (32, 512)
    assert {"what": "plan keys", "key": "request.prompt_tokens", "before": 32, "after": 512} in cp["changes"]
    assert "input length" in res.stdout and "drift worse" in res.stdout
    # the steady plan, beside it: its median latency did not drift
    steady = _series(result, "steady", f"p50_ms at {USERS} users")
    assert steady["drift"]["p"] is not None and not steady["drift"]["drifting"]
    assert len(steady["values"]) == STEADY_RUNS
    # the SLA (P99 under 1 s) is met at the only step: its boundary is that step
    assert _series(result, "drift", "p50_ms at the SLA boundary")["values"] == p50["values"]
    html = (built.root / "history" / "history.html").read_text()
    assert "plotly" in html and "change point" in html and "<script src=" not in html  # offline
    for name in ("P50", "P95", "P99", "P99.9"):  # one line per percentile on each latency chart
        assert html.count(f'"name":"{name}"') == 4, name  # 2 plans x (2 users, the SLA boundary)
    # --figures p99_ms: the drift plan's P99 rests on < 1 row per step (< MIN_TAIL_ROWS): not tested, exit 0
    p99 = _history(str(built.root), "--plan", "drift", "--figures", "p99_ms", "--fail-on-drift",
                   "--out", str(built.root.parent / "p99"))
    assert p99.returncode == 0, p99.stdout + p99.stderr
    assert "requests beyond this percentile" in p99.stdout and "p50_ms" not in p99.stdout
    # --plan steady alone: nothing drifted worse, exit 0 even with --fail-on-drift
    only = _history(str(built.root), "--plan", "steady", "--fail-on-drift", "--out", str(built.root.parent / "steady"))
    assert only.returncode == 0, only.stdout + only.stderr


@pytest.mark.long
@pytest.mark.slow
def test_history_index_is_one_table_read_again_only_where_a_run_changed(built: History):
    assert _history(str(built.root), "-q").returncode in (0, EXIT_DRIFT)
    n = len(built.runs["drift"]) + len(built.runs["steady"])
    db = built.root / INDEX_NAME
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM runs WHERE status = 'indexed'").fetchone()[0] == n
        tokens = dict(con.execute("SELECT path, input_tokens FROM runs"))
    for d, prompt in zip(built.runs["drift"], DRIFT_PROMPT):  # the request rows' tokens_in, as sent
        assert json.loads(tokens[str(d.resolve())])["mean"] == prompt
    # unchanged runs are not read: a summary overwritten with garbage of the same size and time stays
    victim = built.runs["steady"][0] / "report" / "summary.json"
    saved, st = victim.read_bytes(), victim.stat()
    try:
        victim.write_bytes(b"x" * len(saved))
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
        _history(str(built.root), "-q")
        idx = _result(built.root)["index"]
        assert (idx["read"], idx["unchanged"]) == (0, n)
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # now it changed: read, and skipped
        _history(str(built.root), "-q")
        result = _result(built.root)
        assert result["index"]["read"] == 1
        assert [s["path"] for s in result["skipped"]] == [str(built.runs["steady"][0].resolve())]
    finally:
        victim.write_bytes(saved)


@pytest.mark.long
@pytest.mark.slow
def test_history_names_runs_without_a_summary_or_incomplete(built: History, tmp_path):
    """A run without a summary is named as skipped; an incomplete one is named as left out of the
    trend; an index of another schema is rebuilt, not an error."""
    no_summary = tmp_path / "runs" / built.runs["steady"][-1].name
    shutil.copytree(built.runs["steady"][-1], no_summary)
    (no_summary / "report" / "summary.json").unlink()
    incomplete = tmp_path / "runs" / (built.runs["steady"][-1].name + "-incomplete")
    shutil.copytree(built.runs["steady"][-1], incomplete)
    summary = json.loads((incomplete / "report" / "summary.json").read_text())
    (incomplete / "report" / "summary.json").write_text(json.dumps({**summary, "complete": False}))
    index = tmp_path / "h.sqlite"
    with sqlite3.connect(index) as con:
        con.execute("CREATE TABLE runs (path TEXT PRIMARY KEY, figures TEXT)")  # an older index
    res = _history(str(built.root), str(tmp_path / "runs"), "--index", str(index), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert "skipped" in res.stdout and "kneeswarm analyze" in res.stdout, res.stdout
    result = json.loads((tmp_path / "out" / "history.json").read_text())
    assert [s["path"] for s in result["skipped"]] == [str(no_summary.resolve())]
    steady = next(g for g in result["groups"] if g["plan"] == "steady")
    assert steady["left_out"] == [{"run": summary["run_id"], "reason": "incomplete run"}]
    assert result["index"]["runs"] == len(built.runs["drift"]) + len(built.runs["steady"]) + 2


@pytest.mark.long
@pytest.mark.slow
def test_history_since_keeps_the_runs_started_then_or_later(built: History, tmp_path):
    started = {d.resolve(): json.loads((d / "meta.json").read_text())["started"]
               for plan in built.runs.values() for d in plan}
    since = int(started[built.runs["drift"][2].resolve()])  # whole seconds: the ISO text holds them exactly
    when = dt.datetime.fromtimestamp(since, dt.timezone.utc).isoformat()
    res = _history(str(built.root), "--since", when, "--index", str(tmp_path / "h.sqlite"), "--out", str(tmp_path))
    assert res.returncode in (0, EXIT_DRIFT), res.stderr
    result = json.loads((tmp_path / "history.json").read_text())
    kept = {r["path"] for g in result["groups"] for r in g["runs"]}
    assert kept == {str(p) for p, t in started.items() if t >= since}
    assert len([r for g in result["groups"] if g["plan"] == "drift" for r in g["runs"]]) == len(DRIFT_TTFT_MS) - 2


@pytest.mark.long
@pytest.mark.slow
def test_history_bad_input_is_one_line_exit_2(built: History, tmp_path):
    bad_index = tmp_path / "bad.sqlite"
    bad_index.write_text("not a database, but long enough to be read as one" * 40)
    for args in ([str(tmp_path / "nowhere")], [str(tmp_path)], [str(built.root), "--since", "yesterday"],
                 [str(built.root), "--last", "3"], [str(built.root), "--plan", "nosuchplan"],
                 [str(built.root), "--index", str(bad_index)], [str(built.root), "--figures", "p42_ms"]):
        res = _history(*args, "--out", str(tmp_path / "out"))
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
        assert "kneeswarm history:" in res.stderr


def test_history_exit_code_is_documented():
    cli_page = (REPO / "docs" / "cli.md").read_text()  # the exit-code table
    assert f"| `{EXIT_DRIFT}` | a figure drifted worse" in cli_page
    assert f"exit {EXIT_DRIFT} when a figure drifted worse" in " ".join(_history("--help").stdout.split())


# A soak and step runs of one plan name against one target, in one history: the soak is indexed as
# one step of its load (each figure the median over its windows, its trends and findings beside),
# in a group of its own.  The target's service time drifts +120 ms/min (2 ms/s: +6 ms per 3-s window
# over a 20-ms service), so the soak's P50 rises window by window: latency_drift.
MIXED_STEPS = """name = "mixed"
[load]
steps = [1, 2]
ramp = 0.5
hold = 1.5
settle = 0.5
workers = 1
[analysis]
min_requests = 20
"""
MIXED_SOAK = SOAK_PLAN.format(name="mixed") + "[analysis]\nmin_requests = 20\n"  # test_soak.py's soak plan, its min_requests lower


def _window_medians(run: Path, summary: dict) -> dict[str, float]:
    """numpy over the soak's own request rows: each valid window's percentiles, then their median."""
    import glob

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.concat_tables([pq.read_table(p, columns=["t_start", "latency_ms", "ok"])
                          for p in sorted(glob.glob(str(run / "requests" / "part-*.parquet")))])
    ts, lat, ok = (t[c].to_numpy(zero_copy_only=False) for c in ("t_start", "latency_ms", "ok"))
    per: dict[str, list[float]] = {"p50_ms": [], "p99_ms": [], "qps": [], "requests": []}
    for w in summary["steps"]:
        if not w["valid"]:
            continue
        m = (ts >= w["t_lo"]) & (ts < w["t_hi"])
        good = lat[m & ok.astype(bool)]
        per["p50_ms"].append(np.percentile(good, 50))
        per["p99_ms"].append(np.percentile(good, 99))
        per["qps"].append(len(good) / (w["t_hi"] - w["t_lo"]))
        per["requests"].append(int(m.sum()))
    return {"requests": min(per.pop("requests")), **{k: float(np.median(v)) for k, v in per.items()}}


def _load_ended(root: Path, before: set[Path], n_steps: int) -> bool:
    """Whether the run started after ``before`` was listed has sent all its load: its steps.csv
    holds every step's end (it then only drains, shuts Locust down and analyses)."""
    from kneeswarm.contracts.rundir import RunDir

    new = [d for d in root.iterdir() if d not in before and (d / "steps.csv").is_file()]
    try:
        steps = RunDir(new[0]).read_steps() if len(new) == 1 else None
    except Exception:  # read while being rewritten: ask again
        return False
    return steps is not None and len(steps) == n_steps and bool(steps["t_end"].notna().all())


def _mixed_runs(root: Path, url: str, tmp_path: Path) -> list[Path]:
    """MIXED_STEPS, MIXED_SOAK, MIXED_STEPS against the one target at ``url``, their loads one after
    the other: each run starts once the one before has sent all its load, so its start-up overlaps
    that one's drain, shutdown and analysis.  Their run directories in the order started."""
    from kneeswarm.contracts.rundir import RunDir

    with side_by_side() as started:
        for i, (text, n_steps) in enumerate(((MIXED_STEPS, 2), (MIXED_SOAK, 7), (MIXED_STEPS, 2))):
            plan = tmp_path / f"mixed-{i}.toml"
            plan.write_text(text)
            before = set(root.iterdir())
            started[str(i)] = start_cli("run", str(plan), "--target", url, "--out", str(root), "-q",
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
            if i < 2:
                wait_for(lambda: started[str(i)].poll() is not None or _load_ended(root, before, n_steps), 180,
                         f"run {i}'s load to end")
        for i, p in started.items():
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, (i, err[-3000:])
    return sorted((d for d in root.iterdir() if d.is_dir() and (d / "meta.json").is_file()),
                  key=lambda d: RunDir(d).read_meta()["started"])


@pytest.mark.long
@pytest.mark.slow
def test_history_indexes_a_soak_beside_step_runs_of_the_same_plan(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    proc, url = start_target(["--mode", "knee", "--slots", "2", "--service-ms", "20", "--drift-ms-per-min", "120"])
    try:
        made = _mixed_runs(root, url, tmp_path)
    finally:
        stop_target(proc)
    res = _history(str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    result = _result(root)
    assert not result["skipped"]
    (steps,) = [g for g in result["groups"] if not g["soak"]]
    (soak,) = [g for g in result["groups"] if g["soak"]]
    assert (steps["plan"], steps["target"]) == (soak["plan"], soak["target"]) == ("mixed", url)
    assert [r["path"] for r in steps["runs"]] == [str(made[0].resolve()), str(made[2].resolve())]
    assert [r["path"] for r in soak["runs"]] == [str(made[1].resolve())]
    # the step runs as before: their steps' P50 at 2 users, from their summaries
    at2 = next(s for s in steps["series"] if s["figure"] == "p50_ms at 2 users")
    assert at2["values"] == [next(s["p50_ms"] for s in read_summary(d)["steps"] if s["users"] == 2)
                             for d in (made[0], made[2])]
    # the soak: each figure the median over its windows, as numpy finds it over the rows
    summary = read_summary(made[1])
    truth = _window_medians(made[1], summary)
    figure = {s["figure"]: s["values"] for s in soak["series"]}
    assert figure["p50_ms at 2 users (windows' median)"][0] == pytest.approx(truth["p50_ms"], rel=1e-9)
    assert figure["p99_ms at 2 users (windows' median)"][0] == pytest.approx(truth["p99_ms"], rel=1e-9)
    assert figure["QPS (windows' median)"][0] == pytest.approx(truth["qps"], rel=1e-9)
    last_window = [w for w in summary["steps"] if w["valid"]][-1]["p50_ms"]
    assert truth["p50_ms"] < last_window  # read as steps, the drifting soak's figure would be its last window
    # what crept within it: the target's drift, as the soak's own trend found it
    entry = soak["runs"][0]["soak"]
    assert entry["windows"] == 7 and entry["valid_windows"] == sum(w["valid"] for w in summary["steps"])
    assert "latency_drift" in {f["id"] for f in entry["findings"]}
    assert entry["trends"]["p50_ms"]["direction"] == "worse"
    assert entry["trends"]["p50_ms"]["slope"] == pytest.approx(2.0, rel=0.3)  # 120 ms/min = 2 ms/s, set on the target
    with sqlite3.connect(root / INDEX_NAME) as con:
        modes = dict(con.execute("SELECT path, mode FROM runs"))
        requests = json.loads(con.execute("SELECT steps FROM runs WHERE mode = 'soak'").fetchone()[0])[0]["requests"]
    assert sorted(modes.values()) == ["grid", "grid", "soak"] and requests == truth["requests"]
    md = (root / "history" / "history.md").read_text()
    assert "## mixed → " + url + " (soak)" in md and "latency_drift" in md


def test_read_run_takes_meta_through_rundir_and_skips_a_run_it_cannot_place(tmp_path):
    """meta.json is read as RunDir.read_meta reads it: the old fixture's started/run_id as written,
    and an unreadable one (or a started of the wrong JSON type) skips the run rather than index it
    without a place in start order."""
    from kneeswarm.analysis.runs.history import read_run

    fixture = REPO / "tests" / "fixtures" / "run-72ed389"
    written = json.loads((fixture / "meta.json").read_text())
    run = tmp_path / "old"
    shutil.copytree(fixture, run)
    row = read_run(run)
    assert (row["run_id"], row["started"], row["target"]) == (written["run_id"], written["started"], written["target"])
    for broken in (b"{not json", json.dumps({**written, "started": "yesterday"}).encode()):
        (run / "meta.json").write_bytes(broken)
        row = read_run(run)
        assert (row["status"], row["reason"]) == ("skipped", "meta.json missing or unreadable"), row
