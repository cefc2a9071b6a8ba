"""Failures reach the exit code and meta.json, and nothing of a run outlives its controller.

Everything here goes through the real console script (the `kneeswarm` the venv installed, with
this tree first on PYTHONPATH), real Locust processes and the real demo target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import psutil
import pytest

from conftest import REPO, wait_for
from kneeswarm.contracts.plan import LoadPlan

pytestmark = pytest.mark.slow

KNEESWARM = str(Path(sys.executable).with_name("kneeswarm"))
ORPHAN_WAIT = 10.0  # seconds after the kill by which nothing of the run may remain


def kneeswarm_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def console(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The installed console script, run to the end."""
    return subprocess.run([KNEESWARM, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=kneeswarm_env())


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_processes(root: psutil.Process) -> dict[str, list[psutil.Process]]:
    """The Locust processes and the demo target among ``root``'s descendants, by role."""
    roles: dict[str, list[psutil.Process]] = {"master": [], "worker": [], "target": []}
    for p in root.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "-m locust" in cmd:
            roles["worker" if "--worker" in cmd else "master"].append(p)
        elif "kneeswarm.target" in cmd:
            roles["target"].append(p)
    return roles


def agent_processes(run_id: str) -> list[psutil.Process]:
    """The local host agent of run ``run_id`` (its command line names the run's agent directory,
    agents/local.py) and its collectors (the agent's children)."""
    agents = []
    for p in psutil.process_iter(["cmdline"]):
        if any(f"kneeswarm-{run_id}-" in a for a in p.info["cmdline"] or []):
            agents.append(p)
    out = list(agents)
    for a in agents:
        try:
            out += a.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return out


def samples_in_first_window(run_dir: Path) -> int:
    """How many of the /proc samples fetched so far lie in step 1's steady window as the analysis
    cuts a step the run died in: from steps.csv's t_steady + settle to the last completion among the
    request rows written so far.  0 while any of it is not there yet."""
    raw = run_dir / "hosts" / "local" / "raw" / "procfs.jsonl"
    try:
        t_lo = float(pd.read_csv(run_dir / "steps.csv")["t_steady"].iloc[0]) + LoadPlan().settle
        rows = pd.concat([pd.read_parquet(p, columns=["t_start", "latency_ms"])
                          for p in sorted(run_dir.glob("requests/part-*.parquet"))])
        t_hi = float((rows["t_start"] + rows["latency_ms"].fillna(0) / 1000.0).max())
        sampled = [json.loads(x)["t"] for x in raw.read_text().splitlines() if x.endswith("}")]
    except (OSError, ValueError, KeyError, IndexError):  # not written yet, or caught mid-write
        return 0
    return sum(t_lo <= t < t_hi for t in sampled)


def test_kill_9_of_demo_leaves_nothing_running_and_analyze_reports_what_was_recorded(tmp_path):
    """kill -9 of `kneeswarm demo` mid-step: its master, workers, target, host agent and collectors
    are gone within 10 s; `kneeswarm analyze` then reports the steps recorded, with server metrics,
    marked incomplete."""
    out = tmp_path / "runs"
    proc = subprocess.Popen([KNEESWARM, "demo", "--out", str(out), "--steps", "1,2", "--hold", "60"],
                            cwd=REPO, env=kneeswarm_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    started: list[psutil.Process] = []
    try:
        wait_for(lambda: any(out.glob("*/requests/part-*.parquet")) or proc.poll() is not None, 120,
                 "the first request rows")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        roles = run_processes(psutil.Process(proc.pid))
        assert len(roles["master"]) == 1 and len(roles["worker"]) >= 1 and len(roles["target"]) == 1, roles
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        # fetched /proc samples (the agent's incremental fetch, every 5 s) inside the first step's steady
        # window as the analysis will cut it: a count of fetches alone raced a slow start on CI
        wait_for(lambda: samples_in_first_window(run_dir) >= 2, 90, "/proc samples fetched inside the first step's window",
                 period=0.5)  # it reads every part: no need to every 0.1 s
        roles["agent"] = agent_processes(run_dir.name)
        names = {p.name() for p in roles["agent"] if alive(p)}
        assert "vmstat" in names, names  # the agent (its /proc sampler a thread of it) and its commands run
        started = [p for ps in roles.values() for p in ps]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + ORPHAN_WAIT
        while time.monotonic() < deadline and any(alive(p) for p in started):
            time.sleep(0.2)
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in started if alive(p)]
        assert left == [], f"still running {ORPHAN_WAIT:g}s after the kill: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in started:  # never leave a failed test's leftovers behind
            if alive(p):
                p.kill()
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    res = console("analyze", str(run_dir), timeout=120)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert last_line(res.stderr).startswith("kneeswarm: error: the load did not complete")
    assert f"report: {run_dir / 'report' / 'index.html'}" in res.stdout
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["complete"] is False
    first = summary["steps"][0]  # recorded before the kill: its server metrics are in the report
    assert first["requests"] > 0 and first["server"]["local"].get("cpu_pct") is not None, first


# -- exit codes, through the console script ------------------------------------------------
def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def quick_run(target_url: str, out: Path, *extra: str) -> list[str]:
    return ["run", *extra, "--target", target_url, "--steps", "1,2", "--hold", "2", "--ramp", "0.5",
            "--settle", "0", "--workers", "1", "--out", str(out), "-q"]


QUICK_TESTS = {"ok": "test_exit_0_for_a_complete_analysed_run", "failing": "test_exit_1_when_no_request_succeeded"}


@pytest.fixture(scope="module", autouse=True)
def quick_runs(request, tmp_path_factory):
    """The two runs that need nothing done to them mid-run, started with this module (when their
    tests are selected) side by side through the console script, each against its own knee
    target: "ok" (a healthy target) and "failing" (a target that answers every inference 500).
    They go while the tests before theirs run; each test collects its own with ``quick_result``.
    Output to files: nobody reads it before the end."""
    from kneeswarm.launch.cli import start_target, stop_target

    selected = {item.name for item in request.session.items if item.module is request.module}
    root = tmp_path_factory.mktemp("quick_runs")
    targets = {"ok": [], "failing": ["--fail-rate", "1.0"]}
    started, procs = {}, []
    try:
        for name, extra in targets.items():
            if QUICK_TESTS[name] not in selected:
                continue
            proc, url = start_target(["--mode", "knee", "--slots", "4", "--service-ms", "20", *extra])
            procs.append(proc)
            with (root / f"{name}.stdout").open("w") as o, (root / f"{name}.stderr").open("w") as e:
                started[name] = subprocess.Popen([KNEESWARM, *quick_run(url, root / name, "--pid", str(proc.pid))],
                                                 cwd=REPO, env=kneeswarm_env(), stdout=o, stderr=e, text=True)
        yield {name: (p, root) for name, p in started.items()}
    finally:
        for p in started.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for proc in procs:
            stop_target(proc)


def quick_result(quick_runs, name: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The finished quick run ``name``: (its exit code and output, its --out directory)."""
    p, root = quick_runs[name]
    p.wait(timeout=240)
    out, err = ((root / f"{name}.{kind}").read_text() for kind in ("stdout", "stderr"))
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), root / name


def test_exit_0_for_a_complete_analysed_run(quick_runs):
    res, out = quick_result(quick_runs, "ok")
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = out.iterdir()
    assert res.stdout.strip().splitlines()[-1] == f"report: {run_dir / 'report' / 'index.html'}"
    assert (run_dir / "report" / "index.html").is_file()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["lost"] == {} and not [w for w in meta["warnings"] if "load generator" in w], meta["warnings"]


def test_exit_1_when_no_request_succeeded(quick_runs):
    """Every request fails (the target answers every inference 500; its health and model checks
    pass, so the preflight lets the run start): exit 1, one line saying so. (A model the target
    does not serve is now refused by the protocol's preflight: exit 2, tests/test_protocols_e2e.py.)"""
    res, out = quick_result(quick_runs, "failing")
    assert res.returncode == 1, res.stderr[-2000:]
    line = last_line(res.stderr)
    assert line.startswith("kneeswarm: error: no request succeeded (") and "http_5xx" in line, line
    (run_dir,) = out.iterdir()
    rows = pd.read_parquet(run_dir / "requests")
    assert len(rows) > 0 and not rows["ok"].any() and set(rows["status"]) == {500}
    assert f"({len(rows)} requests, all failed: http_5xx {len(rows)})" in line


def run_disturbed(args: list[str], out: Path, disturb: Callable[[subprocess.Popen], None]) -> tuple[int, str, str]:
    """`kneeswarm` with ``args`` (writing under ``out``); once its first request rows are there,
    ``disturb(its process)``.  (Exit code, stdout, stderr) when it ended; killed if the test failed first."""
    proc = subprocess.Popen([KNEESWARM, *args], cwd=REPO, env=kneeswarm_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(out.glob("*/requests/part-*.parquet")) or proc.poll() is not None, 60,
                 "the first request rows")
        disturb(proc)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, stderr


@pytest.mark.long
def test_exit_1_when_the_load_dies(tmp_path, start_demo_target):
    """The Locust master dies mid-run: the load did not complete, exit 1, the report still written."""
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    args = quick_run(target.url, tmp_path, "--pid", str(target.pid))
    args[args.index("--hold") + 1] = "60"

    def kill_the_master(proc: subprocess.Popen) -> None:
        (master,) = run_processes(psutil.Process(proc.pid))["master"]
        master.kill()

    code, out, err = run_disturbed(args, tmp_path, kill_the_master)
    assert code == 1, err[-2000:]
    assert last_line(err).startswith("kneeswarm: error: the load did not complete (ended: load_failed)")
    (run_dir,) = tmp_path.iterdir()
    assert f"report: {run_dir / 'report' / 'index.html'}" in out


@pytest.mark.long
def test_exit_1_when_the_analysis_fails(tmp_path, start_demo_target):
    """report/ is not a directory, so the report cannot be written: exit 1 with the reason, and no
    `report:` line pointing at a report that does not exist; `analyze` says the same."""
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")

    def report_not_a_folder(_: subprocess.Popen) -> None:
        (run_dir,) = tmp_path.iterdir()
        (run_dir / "report").rmdir()
        (run_dir / "report").write_text("not a directory\n")

    code, out, err = run_disturbed(quick_run(target.url, tmp_path, "--pid", str(target.pid)), tmp_path,
                                   report_not_a_folder)
    (run_dir,) = tmp_path.iterdir()
    assert code == 1, err[-2000:]
    assert last_line(err).startswith("kneeswarm: error: analysis failed: "), err[-2000:]
    assert "report:" not in out and "Traceback" not in err
    assert len(pd.read_parquet(run_dir / "requests")) > 0  # what was recorded is kept
    res = console("analyze", str(run_dir), timeout=120)
    assert res.returncode == 1 and last_line(res.stderr).startswith("kneeswarm: error: analysis failed: ")
    assert "report:" not in res.stdout and "Traceback" not in res.stderr


def test_exit_2_for_bad_input_through_the_console_script(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text("[load]\nsteps = [1, 2]\nwarmup = 3\n")
    res = console("run", str(plan), "--out", str(tmp_path / "runs"), timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kneeswarm: error: {plan}: unknown key 'load.warmup'"), lines
    assert not (tmp_path / "runs").exists()


# -- a full disk ---------------------------------------------------------------------------
HELD_ROWS_IN_TEST = 100  # the master holds at most this many unwritable rows (recorder.MAX_HELD_ROWS)


def served(target) -> int:
    """Infer requests the target answered, from its own counter (the independent truth)."""
    return int(sum(v for k, v in target.metrics().items() if k.startswith("kneeswarm_target_requests_total")))


@pytest.mark.long
def test_full_disk_mid_run_loses_only_counted_rows(tmp_path, small_disk, start_demo_target, monkeypatch, capsys):
    """--out on a real 16 MiB tmpfs, filled to the last byte for ~6 s mid-run and then freed: the
    run finishes, and every request the target served is on disk or counted lost in meta.json."""
    import threading

    from kneeswarm.launch import cli, conductor
    from kneeswarm.contracts.rundir import RunDir

    swarm = tmp_path / "swarm_small_hold.py"  # the real locustfile with a small hold, in master and workers
    swarm.write_text(f"from kneeswarm.locustfiles import recorder\nrecorder.MAX_HELD_ROWS = {HELD_ROWS_IN_TEST}\n"
                     "from kneeswarm.locustfiles.swarm import *  # noqa: F401,F403\n")
    monkeypatch.setattr(conductor, "SWARM", swarm)
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    before = served(target)
    filled: dict[str, int] = {}

    def fill_then_free() -> None:
        try:
            wait_for(lambda: any(small_disk.path.glob("*/requests/part-*.parquet")), 60, "the first part")
            filled["bytes"] = small_disk.fill()
            time.sleep(6)
        finally:
            small_disk.free()

    filler = threading.Thread(target=fill_then_free, daemon=True)
    filler.start()
    rc = cli.main(["run", "--target", target.url, "--steps", "1,2,4", "--hold", "5", "--ramp", "0.5",
                   "--settle", "0", "--workers", "1", "--pid", str(target.pid), "--out", str(small_disk.path), "-q"])
    filler.join(timeout=30)
    assert filled.get("bytes", 0) > 0, "the disk was never filled"
    (run_dir,) = [p for p in small_disk.path.iterdir() if p.is_dir()]
    run = RunDir(run_dir)
    meta = run.read_meta()
    rec = json.loads((run_dir / "generator" / "recorder.json").read_text())
    on_disk = len(run.read_requests())
    lost = meta["lost"]["request_rows"]
    assert lost == rec["lost"]["request_rows"] > 0  # ~6 s of rows at ~50-200/s, at most 100 held
    assert on_disk == rec["request_rows"]["written"] == rec["request_rows"]["received"] - lost
    answered = served(target) - before
    assert 0 <= answered - (on_disk + lost) <= 8, (answered, on_disk, lost)  # <= in flight at the stop
    assert any(w.startswith("load generator: requests/:") and f"{lost} of" in w for w in meta["warnings"])
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert rc == (0 if summary["complete"] else 1), meta.get("warnings")  # 1 where analysis counts losses
    if rc:
        assert f"request_rows {lost}" in last_line(capsys.readouterr().err)
    steps = run.read_steps()
    assert len(steps) == 3 and steps["t_end"].notna().all()


@pytest.mark.long
def test_disk_still_full_at_the_end_is_one_error_line(tmp_path, small_disk, start_demo_target):
    """The disk fills mid-run and stays full: exit 1 with one line saying why, no traceback, and
    the parts written before it filled are intact."""
    import threading

    from kneeswarm.contracts.rundir import RunDir

    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    parts_before: list[Path] = []

    def fill() -> None:
        wait_for(lambda: any(small_disk.path.glob("*/requests/part-*.parquet")), 60, "the first part")
        parts_before.extend(small_disk.path.glob("*/requests/part-*.parquet"))
        small_disk.fill()

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    try:
        res = subprocess.run([KNEESWARM, *quick_run(target.url, small_disk.path, "--pid", str(target.pid))],
                             capture_output=True, text=True, timeout=180, cwd=REPO, env=kneeswarm_env())
    finally:
        filler.join(timeout=30)
        small_disk.free()
    assert parts_before, "the disk was never filled"
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert last_line(res.stderr).startswith("kneeswarm: error: "), res.stderr[-2000:]
    assert "report:" not in res.stdout
    (run_dir,) = [p for p in small_disk.path.iterdir() if p.is_dir()]
    assert len(RunDir(run_dir).read_requests()) > 0


def test_bare_locust_that_cannot_write_its_outcome_exits_1(tmp_path, small_disk, start_demo_target):
    """`locust -f locustfiles/swarm.py --headless` (no conductor) on a disk that fills mid-run and
    stays full: the recording's outcome (generator/recorder.json, meta.json's ``ended``) cannot be
    written, and Locust's exit code says so (1) instead of Locust's own 0."""
    from kneeswarm.contracts.rundir import RunDir

    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "bare"\ntarget = "{target.url}"\n'
                    "[load]\nsteps = [1]\nramp = 0.5\nhold = 2.0\nsettle = 0.0\n")
    log = tmp_path / "locust.log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"),
                                 "--headless", "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(small_disk.path)],
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=f, env=kneeswarm_env())
    try:
        wait_for(lambda: any(small_disk.path.glob("*/requests/part-*.parquet")), 60, "the first part")
        small_disk.fill()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        small_disk.free()
    text = log.read_text()
    (run_dir,) = [p for p in small_disk.path.iterdir() if p.is_dir()]
    assert "ended" not in RunDir(run_dir).read_meta()  # the failure was provoked: nothing says how it ended
    assert rc == 1, text[-3000:]
    assert "could not write recorder.json" in text and "could not write meta.json" in text, text[-3000:]
