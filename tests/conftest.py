"""Shared fixtures: real demo-target processes and a bounded wait helper."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest
import requests

from kneeswarm.launch.cli import start_target, stop_target

REPO = Path(__file__).resolve().parent.parent

# A suite started as a background job of a script (`make test &`) has SIGINT ignored, and every
# process it starts inherits that: a test that stops a child with SIGINT (as the agent stops
# vmstat) would wait forever.  The agent resets it for its collectors (kneeswarm.agents.remote.processes.
# child_setup, tested in test_collectors.py); the suite gives itself the default handler, which
# exec resets to SIG_DFL in its children, so its results do not depend on how it was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class Target:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url, self.pid = proc, url, proc.pid

    def metrics(self) -> dict[str, float]:
        """The target's /metrics as {"name{labels}": value}."""
        from kneeswarm.collectors.prometheus import parse_exposition

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


@pytest.fixture
def busy() -> Iterator[subprocess.Popen]:
    """A process that keeps about one core busy (sshd_fixture.start_busy), for collectors to watch."""
    from sshd_fixture import start_busy, stop_proc

    p = start_busy()
    yield p
    stop_proc(p)


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
        from kneeswarm.collectors.prometheus import parse_exposition

        metrics = parse_exposition(requests.get(url + "/metrics", timeout=5).text)
    finally:
        stop_target(proc)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return KneeRun(runs[0], metrics, res, proc.pid)


def run_cli(*args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """The real `kneeswarm` console command in its own process."""
    return subprocess.run([sys.executable, "-m", "kneeswarm.launch.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", REPO), **kw)


def start_cli(*args: str, **kw) -> subprocess.Popen:
    """The real `kneeswarm` console command started in its own process (output piped), for runs
    that go on side by side; the caller waits for it (``communicate``)."""
    return subprocess.Popen([sys.executable, "-m", "kneeswarm.launch.cli", *args], stdout=subprocess.PIPE,
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


def two_model_classes(cheap: float = 3, slow: float = 1) -> str:
    """The plan text of a mix of the demo target's two models (``--models cheap:...,slow:...``): one
    class per model, named after it, with these weights."""
    return "".join(f'[[request.classes]]\nname = "{name}"\nmodel = "{name}"\nweight = {weight}\n'
                   for name, weight in (("cheap", cheap), ("slow", slow)))



def mix_plan(name: str, url: str, steps: str, hold: float, weights: tuple[float, float] = (1, 1),
             protocol: str = "kserve", request: str = "shape = [1, 4]\n") -> str:
    """A closed-loop plan of the demo target's two models (two_model_classes), its /metrics scraped."""
    return f"""
name = "{name}"
target = "{url}"
protocol = "{protocol}"
metrics_url = "{url}/metrics"
[load]
steps = {steps}
hold = {hold}
ramp = 1.0
settle = 1.0
workers = 1
[request]
{request}{two_model_classes(*weights)}"""

@contextlib.contextmanager
def runs_against_targets(tmp: Path, target_flags: dict[str, list[str]],
                         plan: Callable[[str, str], str]) -> Iterator[dict[str, tuple[Path, Target]]]:
    """Each named plan run by `kneeswarm run`, side by side, each against its own demo target started
    with its flags; ``plan(name, target URL)`` gives the plan's text.  Yields {name: (its run
    directory, its target)} once every run exited 0; the targets are stopped when the block ends."""
    targets: dict[str, Target] = {}
    try:
        with side_by_side() as runs:
            for name, flags in target_flags.items():
                targets[name] = Target(*start_target(flags))
                (tmp / f"{name}.toml").write_text(plan(name, targets[name].url))
                runs[name] = start_cli("run", str(tmp / f"{name}.toml"), "--out", str(tmp / name), "-q")
            for name, p in runs.items():
                _, err = p.communicate(timeout=240)
                assert p.returncode == 0, (name, err[-3000:])
        yield {name: (only_run_dir(tmp / name), t) for name, t in targets.items()}
    finally:
        for t in targets.values():
            t.stop()


def only_run_dir(out: Path) -> Path:
    """The one run directory `kneeswarm run --out out` made."""
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


def bad_plan_line(tmp_path: Path, load: str) -> str:
    """`kneeswarm run` on a plan whose [load] table is ``load``, which must be refused as bad input:
    exit 2, one line on stderr, no traceback, no run directory.  Returns that line."""
    plan = tmp_path / "plan.toml"
    plan.write_text(f'target = "http://127.0.0.1:9"\n[load]\n{load}\n')
    res = run_cli("run", str(plan), "--out", str(tmp_path / "out"), timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    return lines[0]


def chromium_or_skip() -> tuple[Any, str]:
    """(playwright.sync_api, Debian's chromium) for a test that drives a browser; skipped where
    either is missing (`make test` installs both)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    return sync_api, chromium


@contextlib.contextmanager
def chromium_page(browsers: tuple[Any, str], url: str, **page: Any) -> Iterator[tuple[Any, Any]]:
    """(browser, page) in Chromium (``browsers``: chromium_or_skip's), the page opened at ``url``
    (``page``: new_page's options, e.g. a viewport); the browser is closed when the block ends."""
    sync_api, chromium = browsers
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            opened = browser.new_page(**page)
            opened.goto(url)
            yield browser, opened
        finally:
            browser.close()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command wrote on stderr (bad input: one line, no traceback)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """iproute2's `ip` with these arguments (network namespaces, links, addresses)."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def skip_without_netns() -> None:
    """Skip a test that builds network namespaces where it cannot: it needs root and iproute2."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 (ip netns)")


def answers_200(url: str, session: requests.Session | None = None) -> bool:
    """The page at ``url`` answers 200 now (False while nothing listens yet), for ``wait_for``."""
    try:
        return (session or requests).get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


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


def release_cgroups(paths: list[Path]) -> None:
    """Teardown of cgroups a test made: each one's processes moved back to its parent group (one
    that has exited meanwhile is skipped), then the directory removed."""
    for path in paths:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                (path.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        path.rmdir()


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
