"""`kneeswarm run --repeat N` for real: the installed console script, a Locust master and worker in
their own processes, the demo target (the knee-mode ground truth: at most K requests at once for S
ms each, QPS = min(users, K) x 1000 / S, the knee at K users), pidstat and vmstat on its process.

The truth is what the target was started with; each run's own summary is the truth of what each
run said, which the merged result must count and not re-decide.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kneeswarm.analysis.runs.history import run_history
from kneeswarm.contracts import outcome
from kneeswarm.contracts.rundir import REPEAT_JSON, REPEAT_MD, REPORT_HTML, RunDir
from conftest import KNEESWARM, REPO, read_summary, wait_for

pytestmark = pytest.mark.slow

SLOTS, SERVICE_MS = 4, 50
PLAN = """name = "{name}"
target = "{target}"
[load]
steps = {steps}
hold = {hold}
ramp = 1.0
settle = 1.0
workers = 1
repeat = {repeat}
cooldown = {cooldown}
[analysis]
min_requests = 20
[[hosts]]
name = "local"
pid = {pid}
"""


def _plan(tmp_path: Path, target, name: str, steps: list[int], repeat: int, cooldown: float, hold: float = 3.0) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(PLAN.format(name=name, target=target.url, steps=steps, hold=hold, repeat=repeat, cooldown=cooldown,
                                pid=target.pid))
    return path


def _outputs(out: Path) -> tuple[list[Path], Path]:
    """(the run directories in order, the merged result's folder) of one series under ``out``."""
    runs = sorted(p for p in out.iterdir() if (p / "meta.json").is_file())
    (folder,) = [p for p in out.iterdir() if (p / REPEAT_JSON).is_file()]
    return runs, folder


@pytest.mark.long
def test_repeat_3_on_the_knee_target_knee_4_and_the_same_findings_in_3_of_3(start_demo_target, tmp_path):
    target = start_demo_target("--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS))
    plan = _plan(tmp_path, target, "knee", [1, 2, 4, 8], repeat=3, cooldown=1.0)
    res = subprocess.run([KNEESWARM, "run", str(plan), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=400, cwd=REPO)
    assert res.returncode == outcome.EXIT_OK, res.stderr[-3000:]
    runs, folder = _outputs(tmp_path / "out")
    assert len(runs) == 3 and folder.name.endswith("-knee-repeat")
    for i in (1, 2, 3):
        assert f"kneeswarm: repetition {i} of 3" in res.stderr
    rep = json.loads((folder / REPEAT_JSON).read_text())
    sums = [read_summary(r) for r in runs]
    assert [s["knee"]["users"] for s in sums] == [SLOTS] * 3  # each run found the truth ...
    assert rep["knee"]["users"] == [SLOTS] * 3 and rep["knee"]["text"] == f"knee {SLOTS} users in 3 of 3 runs"
    ids = [{f["id"] for f in s["findings"]} for s in sums]
    assert ids[0] == ids[1] == ids[2] and "waiting_not_computing" in ids[0]  # ... and the same findings
    assert {c["id"] for c in rep["findings"]} == ids[0]
    assert all(c["label"] == "3 of 3" and c["stable"] for c in rep["findings"])
    for step in rep["steps"]:
        truth = min(step["users"], SLOTS) * 1000 / SERVICE_MS
        if step["valid"] == 3:
            assert step["qps"]["mean"] == pytest.approx(truth, rel=0.10), step
            assert all(w[0] <= v <= w[1] for v, w in zip(step["qps"]["values"], step["qps"]["within"]))
    md = (folder / REPEAT_MD).read_text()
    assert md in res.stdout and f"repeat report: {folder / REPORT_HTML}" in res.stdout
    assert "`waiting_not_computing` | warning | 3 of 3 | 3 of 3: repeats" in md
    print("\n" + md)
    result, _ = run_history([tmp_path / "out"], out=str(tmp_path / "history"))
    (group,) = result["groups"]
    assert [r["run_id"] for r in group["runs"]] == [folder.name]  # one point, not three


@pytest.mark.long
def test_repeat_on_a_jittered_target_marks_the_findings_that_did_not_repeat(start_demo_target, tmp_path):
    """The knee target made noisy (--jitter 0.3, a slow part every second): each run's figures move,
    and with them the knee and the findings.  Whatever each run said (its own summary), the merged
    result counts it, and marks every finding not confirmed in all three runs as one that did not
    repeat.  (On this machine 9 of 9 such runs moved: waiting_not_computing fired in 7, retrograde
    in 6; every series of 3 had a finding that did not repeat.)"""
    target = start_demo_target("--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS),
                               "--jitter", "0.3", "--jitter-period", "0.5")
    # 6-s holds: each window holds ten of the slow parts, so a run can see in itself how far they move it
    plan = _plan(tmp_path, target, "jitter", [2, 4, 6, 8], repeat=3, cooldown=1.0, hold=6.0)
    res = subprocess.run([KNEESWARM, "run", str(plan), "--out", str(tmp_path / "out"), "-q"], capture_output=True,
                         text=True, timeout=400, cwd=REPO)
    assert res.returncode == outcome.EXIT_OK, res.stderr[-3000:]
    runs, folder = _outputs(tmp_path / "out")
    rep = json.loads((folder / REPEAT_JSON).read_text())
    sums = [read_summary(r) for r in runs]
    assert rep["knee"]["users"] == [s["knee"]["users"] for s in sums]
    # each run's own knee interval (its steps resampled from their windows) covers the truth, whatever
    # knee the run itself named: the noise a run can see in itself is the noise that moved it
    intervals = [s["knee"].get("interval") for s in sums]
    print("knees:", [s["knee"]["users"] for s in sums], "intervals:", intervals)
    assert all(iv is not None and iv[0] <= SLOTS <= (math.inf if iv[1] is None else iv[1]) for iv in intervals), intervals
    truth: dict[str, list[int]] = {}
    marginal: dict[str, list[int]] = {}
    for i, s in enumerate(sums, 1):
        for fid in dict.fromkeys(f["id"] for f in s["findings"]):
            truth.setdefault(fid, []).append(i)
        for fid in dict.fromkeys(f["id"] for f in s.get("findings_marginal") or []):
            marginal.setdefault(fid, []).append(i)
    assert {c["id"]: c["confirmed_in"] for c in rep["findings"]} == {k: truth.get(k, []) for k in truth | marginal}
    assert {c["id"]: c["marginal_in"] for c in rep["findings"]} == {k: marginal.get(k, []) for k in truth | marginal}
    md = (folder / REPEAT_MD).read_text()
    for c in rep["findings"]:
        assert c["stable"] == (len(truth.get(c["id"], [])) == 3)
        if not marginal.get(c["id"]):  # confirmed only: the count and its mark
            mark = f"{len(truth[c['id']])} of 3: " + ("repeats" if c["stable"] else "**did not repeat**")
            assert f"| `{c['id']}` | {c['severity']} | {len(truth[c['id']])} of 3 | {mark} |" in md
        else:
            assert f"`{c['id']}`" in md
    unstable = [c["id"] for c in rep["findings"] if not c["stable"]]
    if unstable:
        assert "**Findings that did not repeat:** " + ", ".join(
            f"`{c['id']}` ({c['label']})" for c in rep["findings"] if not c["stable"]) in md
    # the noise moved the runs: the saturated steps' QPS spread between the runs is far wider than the
    # exact target's (0.5-1 % in the test above), and every run's own interval holds its own value
    plateau = [s for s in rep["steps"] if s["users"] >= SLOTS and s["valid"] == 3]
    assert plateau and all(w[0] <= v <= w[1] for s in plateau for v, w in zip(s["qps"]["values"], s["qps"]["within"]))
    print("\n" + md)


@pytest.mark.long
def test_the_stability_bench_runs_a_scenario_end_to_end(tmp_path):
    """bench/stability.py's cheapest scenario (the knee target, 2 runs) through the script itself:
    its table says per run what that run's own summary.json says, and its lines whether they agree."""
    res = subprocess.run([sys.executable, str(REPO / "bench" / "stability.py"), "--only", "knee", "--repeat", "2",
                          "--cooldown", "0.5", "--keep", str(tmp_path)], capture_output=True, text=True, timeout=600,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    print(res.stdout)
    runs, folder = _outputs(tmp_path / "knee" / "out")
    sums = [read_summary(r) for r in runs]
    assert len(runs) == 2 and folder.name.endswith("-knee-repeat")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in res.stdout.splitlines()
            if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2
    for i, (row, s) in enumerate(zip(rows, sums), 1):
        knee, causes = s["knee"], s["verdict"]["causes"]
        assert row[0] == str(i) and row[1] == ("–" if knee["users"] is None else f"{knee['users']:g}")
        assert row[4] == (", ".join(causes) or "–")
        assert row[5] == (", ".join(f["id"] for f in s["findings"]) or "–")
        assert row[6] == (", ".join(f["id"] for f in s["findings_marginal"]) or "–")
        assert row[7] == ("yes" if knee["users"] == SLOTS and causes == ["waiting_not_computing"] else "no")
    same = sums[0]["verdict"]["causes"] == sums[1]["verdict"]["causes"]
    assert f"knee: same root cause in every run: {'yes' if same else 'no'} (" in res.stdout
    assert "load average at the start: " in res.stdout


def test_ctrl_c_between_runs_ends_the_series_and_keeps_what_was_recorded(start_demo_target, tmp_path):
    """SIGINT during the cooldown after the first of 3 runs: exit 130 at once, the first run kept
    (completed, its report written) and merged as 1 of 3 planned, marked incomplete."""
    target = start_demo_target("--mode", "knee", "--slots", str(SLOTS), "--service-ms", "20")
    plan = _plan(tmp_path, target, "stop", [2], repeat=3, cooldown=120.0, hold=1.5)
    out = tmp_path / "out"
    p = subprocess.Popen([KNEESWARM, "run", str(plan), "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(p.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: any("cooldown 120s before repetition 2 of 3" in line for line in said), 120, "the cooldown")
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        reader.join(timeout=10)
        stdout = p.stdout.read()  # type: ignore[union-attr]
    finally:
        if p.poll() is None:
            p.kill()
    stderr = "".join(said)
    assert p.returncode == outcome.EXIT_INTERRUPTED, stderr[-3000:]
    assert "interrupted during the cooldown: 1 of 3 runs kept" in stderr and "Traceback" not in stderr
    runs, folder = _outputs(out)
    assert len(runs) == 1
    assert RunDir(runs[0]).read_meta()["ended"] == outcome.Ended.COMPLETED
    rep = json.loads((folder / REPEAT_JSON).read_text())
    assert (rep["planned"], rep["merged"], rep["complete"]) == (3, 1, False)
    assert "2 of the 3 planned runs did not run" in (folder / REPEAT_MD).read_text()
    assert f"repeat report: {folder / REPORT_HTML}" in stdout


@pytest.mark.long
def test_a_repetition_that_cannot_start_ends_the_series_with_exit_1(start_demo_target, tmp_path):
    """The target stopped during the cooldown: the second repetition's health check fails, the
    series ends there (exit 1, one line naming the repetition), and the first run is merged as 1
    of the 2 planned, marked incomplete."""
    target = start_demo_target("--mode", "knee", "--slots", str(SLOTS), "--service-ms", "20")
    plan = _plan(tmp_path, target, "gone", [2], repeat=2, cooldown=8.0, hold=1.5)
    out = tmp_path / "out"
    p = subprocess.Popen([KNEESWARM, "run", str(plan), "--out", str(out), "-q"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(p.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: out.exists() and any(out.glob("*/report/index.html")), 120, "the first run's report")
        target.stop()  # within the 8 s cooldown that follows the report
        p.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    stderr = "".join(said)
    assert p.returncode == outcome.EXIT_FAILED, stderr[-3000:]
    assert "repetition 2 of 2 did not start: target" in stderr and "Traceback" not in stderr
    runs, folder = _outputs(out)
    assert len(runs) == 1
    rep = json.loads((folder / REPEAT_JSON).read_text())
    assert (rep["planned"], rep["merged"], rep["complete"]) == (2, 1, False)
