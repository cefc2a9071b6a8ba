"""A headless run says where it is: one plain line per step in a log, a live line on a terminal."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from kneeswarm.contracts.planfile import load_plan
from kneeswarm.launch.progress import Progress
from kneeswarm.contracts.rundir import RunDir

LINE = re.compile(r"^kneeswarm: step (\d+)/(\d+): (\d+) users?, (\d+) requests, ([\d.]+) QPS, P99 ([\d.]+) ms, "
                  r"(\d+) errors(?: \([\d.]+%\))?, (~\S+ left|done)$")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def write_part(run: RunDir, seq: int, step: int, t: np.ndarray, lat: np.ndarray, ok: np.ndarray) -> None:
    run.write_request_part({"t_start": t, "latency_ms": lat, "ok": ok, "step": np.full(len(t), step, np.int32)}, seq)


def test_lines_per_step_carry_the_figures_of_its_rows(tmp_path):
    run = RunDir.create(tmp_path, "p")
    plan = load_plan(None, {"load.steps": [1, 2, 4], "load.ramp": 1.0, "load.hold": 10.0})
    rng = np.random.default_rng(3)
    t0 = 1000.0
    run.write_steps([(0, 1, t0, t0 + 1, t0 + 11), (1, 2, t0 + 11, None, None)])
    t = np.sort(rng.uniform(t0 + 1, t0 + 11, 200))
    lat = rng.gamma(4, 10, 200)
    ok = np.ones(200, bool)
    ok[:5] = False
    write_part(run, 0, 0, t, lat, ok)
    out = io.StringIO()
    progress = Progress(run, plan, stream=out)
    progress.poll(now=t0 + 12, force=True)
    assert out.getvalue() == ""  # no row of step 1 yet: step 0's rows may still be on their way
    write_part(run, 1, 1, np.array([t0 + 11.5]), np.array([5.0]), np.array([True]))
    progress.poll(now=t0 + 12, force=True)
    (line,) = out.getvalue().splitlines()
    m = LINE.match(line)
    assert m, line
    assert m.groups()[:4] == ("1", "3", "1", "200")
    steady = t >= t0 + 1
    assert float(m.group(5)) == pytest.approx(steady.sum() / (t[steady].max() - (t0 + 1)), abs=0.05)
    assert float(m.group(6)) == pytest.approx(np.percentile(lat[ok], 99), abs=0.05)
    assert m.group(7) == "5" and m.group(8) == "~21s left"  # step 2's hold (ramped by now) + step 3's 1 + 10 s
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_a_terminal_gets_one_live_line_redrawn(tmp_path):
    run = RunDir.create(tmp_path, "p")
    plan = load_plan(None, {"load.steps": [1, 2], "load.ramp": 1.0, "load.hold": 10.0})
    run.write_steps([(0, 1, 1000.0, 1001.0, None)])
    write_part(run, 0, 0, np.linspace(1001, 1004, 31), np.full(31, 20.0), np.ones(31, bool))
    term = Terminal()
    progress = Progress(run, plan, stream=term)
    assert progress.live
    progress.poll(now=1005.0, force=True)
    assert term.getvalue().startswith("\r\x1b[Kkneeswarm: step 1/2: 1 user, 31 requests, 10.3 QPS")  # 31 rows over 3 s
    assert term.getvalue().endswith("~17s left")  # 6 s of this hold + 1 + 10 s and "\n" not in term.getvalue()
    run.write_steps([(0, 1, 1000.0, 1001.0, 1011.0), (1, 2, 1011.0, 1012.0, 1022.0)])
    progress.finish()
    tail = term.getvalue().rsplit("\r\x1b[K", 1)[1]  # the live line cleared, then the steps' lines
    first, second = tail.splitlines()
    assert tail.endswith("\n") and first.startswith("kneeswarm: step 1/2") and first.endswith("done")
    assert second.startswith("kneeswarm: step 2/2: 2 users, 0 requests") and second.endswith("done")


@pytest.mark.slow
def test_pipeline_log_has_one_plain_line_per_step(knee_run):
    """Through the console script, stderr a pipe: one line per step, no control codes, and the
    figures agree with the ground-truth target (QPS = min(users, 4) x 20/s, service 50 ms).  The
    run is the session's shared one (tests/conftest.py `knee_run`: the installed `kneeswarm`,
    not -q, stderr captured)."""
    from conftest import KNEE_SERVICE_MS, KNEE_SLOTS, KNEE_STEPS

    res = knee_run.res
    assert res.returncode == 0, res.stderr[-2000:]
    assert "\x1b" not in res.stderr and "\r" not in res.stderr
    lines = [m for m in map(LINE.match, res.stderr.splitlines()) if m]
    n = str(len(KNEE_STEPS))
    assert [(m.group(1), m.group(2), m.group(3)) for m in lines] == [("1", n, "1"), ("2", n, "2"), ("3", n, "4"),
                                                                     ("4", n, "8"), ("5", n, "16")]
    rows = RunDir(knee_run.run_dir).read_requests()
    for m, users in zip(lines, KNEE_STEPS):
        assert float(m.group(5)) == pytest.approx(min(users, KNEE_SLOTS) * 1000 / KNEE_SERVICE_MS, rel=0.2), m.group(0)
        assert float(m.group(6)) >= KNEE_SERVICE_MS  # no request is served faster than the service time
        on_disk = int((rows["step"] == int(m.group(1)) - 1).sum())
        assert 0.5 * on_disk <= int(m.group(4)) <= on_disk
    assert lines[-1].group(8) == "done"
