"""Shared fixtures: real demo-target processes and a bounded wait helper."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest
import requests

from kneeswarm.cli import start_target, stop_target

REPO = Path(__file__).resolve().parent.parent


class Target:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url, self.pid = proc, url, proc.pid

    def metrics(self) -> dict[str, float]:
        """The target's /metrics as {"name{labels}": value}."""
        from collectors.prometheus import parse_exposition

        return parse_exposition(requests.get(self.url + "/metrics", timeout=5).text)

    def stop(self) -> None:
        stop_target(self.proc)


@pytest.fixture
def start_demo_target() -> Iterator[Callable[..., Target]]:
    """Start real `kneeswarm target` processes on free ports; all are stopped at teardown."""
    started: list[Target] = []

    def start(*args: str) -> Target:
        proc, url = start_target(list(args))
        t = Target(proc, url)
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()


# The knee-mode demo target as a ground truth: at most KNEE_SLOTS requests at once for
# KNEE_SERVICE_MS each, so in a closed loop QPS = min(users, KNEE_SLOTS) x 1000 / KNEE_SERVICE_MS.
KNEE_SLOTS, KNEE_SERVICE_MS = 4, 50
KNEE_STEPS, KNEE_HOLD = (1, 2, 4, 8, 16), 7.0  # below, at and above the knee; 7 s held after each ramp
KNEESWARM = str(Path(sys.executable).with_name("kneeswarm"))  # the console script the venv installed


@dataclass
class KneeRun:
    run_dir: Path
    metrics: dict[str, float]  # the target's /metrics after the run: its own counts
    res: subprocess.CompletedProcess  # the console script's exit code, stdout and stderr
    pid: int  # the target's process, monitored by the run


@pytest.fixture(scope="session")
def knee_run(tmp_path_factory) -> KneeRun:
    """ONE real run against the knee-mode target, shared by the tests that each read a different
    part of it (tests/test_e2e.py, test_findings.py, test_progress.py): the installed `kneeswarm`
    console script with stderr a pipe (not -q), a Locust master and 2 workers in their own
    processes, local pidstat/vmstat on the target's pid, its /metrics scraped.  The target is the
    run's own (its counters count this run only) and is stopped after the run."""
    out = tmp_path_factory.mktemp("knee_run")
    proc, url = start_target(["--mode", "knee", "--slots", str(KNEE_SLOTS), "--service-ms", str(KNEE_SERVICE_MS)])
    try:
        res = subprocess.run([KNEESWARM, "run", "--target", url, "--steps", ",".join(map(str, KNEE_STEPS)),
                              "--hold", str(KNEE_HOLD), "--ramp", "1", "--settle", "1", "--workers", "2",
                              "--pid", str(proc.pid), "--metrics-url", url + "/metrics", "--out", str(out),
                              "--name", "knee"],
                             capture_output=True, text=True, timeout=240, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        from collectors.prometheus import parse_exposition

        metrics = parse_exposition(requests.get(url + "/metrics", timeout=5).text)
    finally:
        stop_target(proc)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return KneeRun(runs[0], metrics, res, proc.pid)


def run_cli(*args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """The real `kneeswarm` console command in its own process."""
    return subprocess.run([sys.executable, "-m", "kneeswarm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", REPO), **kw)


def start_cli(*args: str, **kw) -> subprocess.Popen:
    """The real `kneeswarm` console command started in its own process (output piped), for runs
    that go on side by side; the caller waits for it (``communicate``)."""
    return subprocess.Popen([sys.executable, "-m", "kneeswarm.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=kw.pop("cwd", REPO), **kw)


@contextlib.contextmanager
def side_by_side() -> Iterator[dict[str, subprocess.Popen]]:
    """Runs started side by side (``start_cli`` into the yielded dict, by name): any still running
    when the block ends (an assertion, a timeout) is killed, so none outlives its test."""
    started: dict[str, subprocess.Popen] = {}
    try:
        yield started
    finally:
        for p in started.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def wait_for(cond: Callable[[], bool], timeout: float, what: str, period: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "report" / "summary.json").read_text())


class SmallDisk:
    """A real tmpfs of a few MiB that a test can fill to the last byte and free again."""

    def __init__(self, path: Path):
        self.path = path
        self.filler = path / ".filler"

    def fill(self) -> int:
        """Write the filler until the disk is full (ENOSPC); returns its size in bytes."""
        import os

        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for chunk in (1 << 16, 1 << 12, 1):  # the last page to the byte: no new file fits
                try:
                    for _ in range(1 << 20):
                        os.write(fd, b"\0" * chunk)
                except OSError:
                    pass
        finally:
            os.close(fd)
        return self.filler.stat().st_size

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[SmallDisk]:
    """tmp_path/disk as a 16 MiB tmpfs (needs root: `mount -t tmpfs`), unmounted at teardown."""
    path = tmp_path / "disk"
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def find_libfaketime() -> str | None:
    """libfaketime's preload library wherever the distribution put it (any multiarch directory)."""
    import glob

    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1", "/usr/lib64/faketime/libfaketime.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


@pytest.fixture
def shifted_clock() -> Callable[[float], list[str]]:
    """A command prefix that runs a process with its wall clock shifted by SECONDS (libfaketime;
    monotonic time untouched).  Skipped only where the faketime package is not installed; an
    installed one that cannot be found or does not shift the clock fails the test."""
    import shutil

    if shutil.which("faketime") is None:
        pytest.skip("faketime (the Debian package) is not installed")
    lib = find_libfaketime()
    assert lib, "faketime is installed but libfaketime.so.1 was not found"

    def prefix(seconds: float) -> list[str]:
        return ["env", f"LD_PRELOAD={lib}", f"FAKETIME={seconds:+g}s", "DONT_FAKE_MONOTONIC=1"]

    out = subprocess.run([*prefix(2.5), sys.executable, "-c", "import time; print(time.time())"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and abs(float(out.stdout) - time.time() - 2.5) < 1.0, (lib, out.stdout, out.stderr)
    return prefix
