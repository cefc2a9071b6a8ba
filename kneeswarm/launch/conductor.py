"""The conductor: one `kneeswarm run`, from preflight to report (floor 4).

The conductor starts processes (target check, Locust master and workers, signals); what happens
during the test (host agents, the target's metrics, the report) is kneeswarm/launch/lifecycle.py, the
same code a Locust master started from the web UI or plain `locust --headless` uses.

    preflight   the target answers its health check; every monitored host and process is there
    start       run directory (plan.toml, meta.json), host agents, the target's /metrics scraper
                (plan.metrics_url, 1 Hz, from this machine), Locust master + N workers
    load        the step shape runs on the master; rows stream into requests/*.parquet; host
                agents are fetched every lifecycle.FETCH_PERIOD seconds; progress on stderr (progress.py)
    stop        agents stopped and fetched (verified), parsed CSVs, meta.json says how it ended
                (with the master's generator/recorder.json merged into "lost" and "warnings")
    analyze     report/summary.json, summary.md, index.html

A first Ctrl-C (or SIGTERM) stops the load gracefully and still writes the report, marked
incomplete; a second one kills everything at once.  A conductor killed outright takes its Locust
processes along (PR_SET_PDEATHSIG, kneeswarm/launch/lifeline.py).  Bad input raises ConductorError with one
line before any load is sent, and leaves no run directory behind.  Once the load has started,
nothing a host agent or the metrics scraper does can end the run: failures become warnings in
meta.json["warnings"] (and the host's own list), and the final fetch is still attempted.

The target's metrics land in hosts/target/raw/prometheus.jsonl (one JSON line per scrape) and
hosts/target/prometheus.csv (t + one column per series), on the master's clock by construction.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

if TYPE_CHECKING:  # the analysis is loaded only when a run is analysed
    from kneeswarm.analysis.schema.summary import Summary

import requests

from kneeswarm.launch import lifecycle
from kneeswarm.launch.export import ExportOptions
from kneeswarm.launch.lifecycle import Lifecycle, analyze_run  # noqa: F401  (analyze_run: cli imports it from here)
from kneeswarm.launch.lifeline import die_with_parent
from kneeswarm.contracts.plan import HostPlan, Plan
from kneeswarm.launch.progress import Progress
from kneeswarm.contracts.outcome import Ended
from kneeswarm.contracts.rundir import CLOCKS_FILE, MASTER_FILE, SEARCH_FILE, Meta, RunDir, WarningLog
from kneeswarm.locustfiles.recorder import RECORDER_FILE

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT = 10.0  # seconds the target has to pass its health check before the run
#: 4xx answers to the health check that may change within HEALTH_TIMEOUT (a timeout, a rate
#: limit); any other 4xx is a refusal, said at once
RETRY_STATUS = (408, 425, 429)
WORKER_WAIT = 60.0  # seconds for all workers to connect
RUN_MARGIN = 120.0  # seconds beyond the planned duration before the master is killed
STOP_GRACE = 20.0  # seconds the master has to quit after SIGTERM
#: Prefix of each worker's command line, e.g. ["taskset", "-c", "1"] to pin the load generator
#: (tests use it to run a worker under a shifted clock).
WORKER_WRAPPER: list[str] = []
SWARM = Path(__file__).resolve().parent.parent / "locustfiles" / "swarm.py"


@dataclass
class Distribution:
    """Where the workers come from: local processes, and workers started elsewhere
    (`kneeswarm worker --master HOST:PORT` on other machines) that the master waits for."""

    local_workers: int | None = None  # None: plan.load.workers, or the number of cores
    expect_workers: int | None = None  # workers the master waits for in all; None: the local ones
    bind_host: str = "127.0.0.1"  # the master's port listens here (no authentication on it)
    port: int | None = None  # None: a free port
    wait: float = WORKER_WAIT  # seconds the master waits for them
    remote: Any = None  # RemoteWorkers started over SSH (kneeswarm/launch/remote_workers.py), or None


class ConductorError(RuntimeError):
    """A run that cannot start; str() is one line naming the input and the problem."""


@dataclass
class RunResult:
    run: RunDir
    ended: Ended  # COMPLETED, INTERRUPTED or LOAD_FAILED
    summary: Summary | None  # None when the analysis failed or was not run
    analysis_error: str | None = None  # one line, when the analysis raised

    @property
    def complete(self) -> bool:
        return self.ended == Ended.COMPLETED


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_target(plan: Plan, timeout: float | None = None) -> None:
    """Wait until the target's health check answers 2xx, or raise ConductorError.

    Through the plan's [endpoint] (TLS trust, client certificate, headers, base path), as the
    load will go.  A refusal (4xx other than 404) or a TLS failure ends the wait at once: the
    server is up and will not answer differently in a second; it is said in one line naming
    what failed.  Connection errors and 5xx are retried until ``timeout`` (a server starting)."""
    from kneeswarm.locustfiles.protocols import (PreflightError, ProtocolError, connection_problem, detail, for_plan, refusal_hint)

    timeout = HEALTH_TIMEOUT if timeout is None else timeout
    try:
        protocol = for_plan(plan)
    except ProtocolError as e:
        raise ConductorError(str(e)) from None
    if getattr(protocol, "grpc", False):  # the server's own gRPC API: readiness, the model, one request
        try:
            return protocol.preflight(plan.target, timeout=timeout)
        except PreflightError as e:
            raise ConductorError(str(e)) from None
    url = plan.base_url + protocol.health_path
    deadline = time.monotonic() + timeout
    problem = "no answer"
    with plan.endpoint.requests_session() as session:
        while time.monotonic() < deadline:
            try:
                r = session.get(url, timeout=min(2.0, timeout), headers=protocol.headers,
                                **plan.endpoint.requests_kwargs())
                # 404: up, but the health path is the model's own (TF Serving): the preflight says why
                if 200 <= r.status_code < 300 or r.status_code == 404:
                    try:  # the plan's model must be served (one line, exit 2, no run directory)
                        return protocol.preflight(plan.base_url, timeout=min(HEALTH_TIMEOUT, timeout))
                    except PreflightError as e:
                        raise ConductorError(str(e)) from None
                problem = f"HTTP {r.status_code}"
                if 400 <= r.status_code < 500 and r.status_code not in RETRY_STATUS:
                    said = detail(r.content) + refusal_hint(r.status_code, r.content, protocol.headers)
                    raise ConductorError(protocol.redact(f"target {plan.target}: health check {url} -> {problem}{said}"))
            except requests.exceptions.SSLError as e:
                raise ConductorError(f"target {plan.target}: health check {url} failed ({connection_problem(e)})") from None
            except requests.RequestException as e:
                problem = connection_problem(e)
            time.sleep(0.5)
    raise ConductorError(f"target {plan.target}: health check {url} failed ({problem}) within {timeout:.0f}s")


def default_hosts(plan: Plan, pid: int | None, process: str | None) -> list[HostPlan]:
    """The hosts to monitor: the plan's, else this machine watching --pid/--process, else the
    process listening on the target's port when the target is on loopback."""
    if plan.hosts:
        hosts = list(plan.hosts)
        if pid is not None or process is not None:
            local = [h for h in hosts if h.is_local]
            if not local:
                raise ConductorError("--pid/--process name a local process but the plan's [[hosts]] has no local entry")
            local[0].pid, local[0].process, local[0].port = pid, process, None
        return hosts
    if pid is not None or process is not None:
        return [HostPlan(name="local", pid=pid, process=process)]
    parsed = urllib.parse.urlsplit(plan.target)
    if parsed.hostname in ("127.0.0.1", "localhost", "::1"):
        return [HostPlan(name="local", port=parsed.port or (443 if parsed.scheme == "https" else 80))]
    return [HostPlan(name="local")]  # the load machine itself: vmstat only


def workers_connected(run: RunDir) -> int | None:
    """How many workers were connected to a master whose test never started (its own account,
    generator/master.json, kept from Locust's events by kneeswarm.locustfiles.plugin.MasterState), or None
    when the test started or the master left no account."""
    state = _read_json(run.generator_dir / MASTER_FILE)
    if not isinstance(state, dict) or state.get("test_started") is not False:
        return None
    n = state.get("workers_connected")
    return n if isinstance(n, int) else None


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("kneeswarm", "locust", "paramiko", "pandas", "kneed"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _import_analysis_meanwhile() -> None:
    """Import the analysis (~0.4 s) in a thread while the agents stop and their data is fetched
    (waits on other processes), not after; a failed import is retried, and said, by analyze_run."""
    def load() -> None:
        try:
            importlib.import_module("analysis")
        except Exception:  # noqa: BLE001 - analyze_run imports it again and reports the error
            pass
    threading.Thread(target=load, name="import-analysis", daemon=True).start()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Conductor:
    def __init__(self, plan: Plan, out: str | Path = "runs", accept_new_host_keys: bool = False,
                 quiet: bool = False, dist: Distribution | None = None, export: ExportOptions | None = None):
        if not plan.hosts:
            plan.hosts = default_hosts(plan, None, None)
        self.plan = plan
        self.out = Path(out)
        self.accept_new_host_keys = accept_new_host_keys
        self.quiet = quiet
        self.dist = dist or Distribution()
        self.export = export or ExportOptions()
        local = self.dist.local_workers
        self.workers = (plan.load.workers or os.cpu_count() or 1) if local is None else local
        remote = self.dist.remote.processes if self.dist.remote is not None else 0
        self.expect_workers = self.workers + remote if self.dist.expect_workers is None else self.dist.expect_workers
        if self.expect_workers < 1:
            raise ConductorError("no workers: --workers 0 needs --expect-workers N (workers started elsewhere)")
        self._procs: list[subprocess.Popen] = []
        self._interrupts = 0
        self.warnings = WarningLog()
        self.life: Lifecycle | None = None

    def _warn(self, text: str) -> None:
        """A problem that does not end the run: logged, and kept for meta.json["warnings"]."""
        logger.warning("%s", text)
        self.warnings.add(text)

    def _recorder_outcome(self, run: RunDir) -> dict[str, int]:
        """The master's generator/recorder.json: its warnings join ours; returns meta.json's
        "lost" with the master's counts added (what it could not write)."""
        lost = dict(run.read_meta().get("lost") or {})
        rec = _read_json(run.generator_dir / RECORDER_FILE)
        if not isinstance(rec, dict):
            self._warn(f"the load generator left no {RECORDER_FILE}: what it could not write is unknown")
            return lost
        for what, n in (rec.get("lost") or {}).items():
            lost[what] = lost.get(what, 0) + int(n)
        for w in rec.get("warnings") or []:
            self._warn(f"load generator: {w}")
        if rec.get("workers_lost"):
            self._record_meta(run, workers_lost=rec["workers_lost"])
        if not rec.get("final"):
            self._warn(f"the load generator did not finish its {RECORDER_FILE}: its last rows may be missing, uncounted")
        return lost

    # -- the run -------------------------------------------------------------------------
    def run(self) -> RunResult:
        from kneeswarm.agents import AgentError

        check_target(self.plan)
        self._open_remote_workers()
        run = RunDir.create(self.out, self.plan.name)
        try:
            run.plan_path.write_text(self.plan.to_toml())
            started = time.time()
            run.update_meta(
                run_id=run.path.name, complete=False, ended=Ended.RUNNING, started=started,
                started_utc=dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(),
                launcher="kneeswarm run", target=self.plan.target, protocol=self.plan.protocol,
                load_host=socket.gethostname(), workers=self.workers, versions=versions(),
            )
            life = Lifecycle(self.plan, run, accept_new_host_keys=self.accept_new_host_keys)
            run.update_meta(hosts_preflight=life.open())
            life.start()
        except AgentError as e:
            shutil.rmtree(run.path, ignore_errors=True)  # nothing recorded yet: leave no half-run
            self._stop_remote_workers()
            raise ConductorError(str(e)) from None
        except BaseException:
            shutil.rmtree(run.path, ignore_errors=True)
            self._stop_remote_workers()
            raise
        # From here on the run is recorded: nothing below may end it early.
        self.life = life
        try:
            ended = self._load(run, life)
        finally:
            _import_analysis_meanwhile()
            self._stop_remote_workers()
            done = life.finish()
            for w in life.all_warnings():
                self.warnings.add(w)
            lost = self._recorder_outcome(run)
            self._record_meta(run, hosts=done["hosts"], target_metrics=done["target_metrics"], lost=lost,
                              warnings=self.warnings.to_list())
        finished = time.time()
        self._record_meta(run, ended=ended, complete=ended == Ended.COMPLETED, finished=finished,
                          worker_clocks=_read_json(run.generator_dir / CLOCKS_FILE))
        if self._interrupts >= 2:  # asked twice to stop: the data is safe, the report can wait
            print(f"kneeswarm: killed; no report written (`kneeswarm analyze {run.path}` writes it)",
                  file=sys.stderr, flush=True)
            return RunResult(run, ended, None)
        summary, error = analyze_run(run)
        problems = self.export.after_run(run)
        for problem in problems:  # the results stand; the export's loss is said and kept in meta.json
            print(f"kneeswarm: export: {problem}", file=sys.stderr, flush=True)
            self.warnings.add(f"export: {problem}")
        if problems:
            self._record_meta(run, warnings=self.warnings.to_list())
        return RunResult(run, ended, summary, error)

    def _record_meta(self, run: RunDir, **changes: Unpack[Meta]) -> None:
        """meta.json at the end of a run; a write that fails (a full disk) is said on stderr, and
        the run goes on to its analysis, which then fails too and says so in the exit code."""
        try:
            run.update_meta(**changes)
        except OSError as e:
            print(f"kneeswarm: could not write {run.meta_path}: {e}", file=sys.stderr, flush=True)

    def metrics_host(self) -> str:
        """hosts/<name>/ for the target's metrics (see Lifecycle.metrics_host)."""
        return Lifecycle(self.plan, RunDir(self.out)).metrics_host()

    # -- Locust processes ----------------------------------------------------------------
    def _locust(self, args: list[str], log: Path, wrapper: list[str] | None = None) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [*(wrapper or []), sys.executable, "-m", "locust", "-f", str(SWARM), *args]
        f = log.open("ab")
        # A session of its own: the terminal's Ctrl-C reaches the conductor only, which then
        # stops Locust in order (master first, so it collects the workers' last rows).  Tied to
        # this process: a conductor killed with SIGKILL takes its Locust processes along
        # (PR_SET_PDEATHSIG fires when the forking thread exits: _load runs on the main thread).
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=die_with_parent())
        f.close()
        self._procs.append(p)
        return p

    def _open_remote_workers(self) -> None:
        """Connect to the --worker-hosts and check their versions; ConductorError (one line) if not."""
        if self.dist.remote is None:
            return
        from kneeswarm.launch.remote_workers import WorkerHostsError

        try:
            self.dist.remote.open(versions())
        except WorkerHostsError as e:
            raise ConductorError(str(e)) from None

    def _stop_remote_workers(self) -> None:
        remote = self.dist.remote
        if remote is not None and remote.transports:
            remote.stop()
            for w in remote.warnings:
                self._warn(w)

    def _start_master(self, run: RunDir) -> tuple[subprocess.Popen, int]:
        d = self.dist
        port = d.port or free_port(d.bind_host if d.bind_host not in ("*", "0.0.0.0", "") else "127.0.0.1")
        told = [] if d.bind_host in ("127.0.0.1", "localhost", "::1") else ["--kneeswarm-insecure-web"]
        master = self._locust(
            ["--master", "--headless", "--master-bind-host", d.bind_host, "--master-bind-port", str(port),
             "--expect-workers", str(self.expect_workers), "--expect-workers-max-wait", str(int(d.wait)),
             "--host", self.plan.target, "--kneeswarm-plan", str(run.plan_path), *told,
             "--kneeswarm-run-dir", str(run.path), "--only-summary", "--loglevel", "INFO", *self.export.master_args()],
            run.path / "logs" / "master.log",
        )
        return master, port

    def _load(self, run: RunDir, life: Lifecycle) -> Ended:
        master, port = self._start_master(run)
        if self.dist.remote is not None:
            self.dist.remote.start(self.dist.bind_host, port, run.path.name)
        self._start_workers(run, port)

        deadline = time.monotonic() + self.dist.wait + self.plan.step_durations() * 2 + RUN_MARGIN
        ended = Ended.COMPLETED
        progress = None if self.quiet else Progress(run, self.plan)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            last_fetch = time.monotonic()
            while master.poll() is None:
                if self._interrupts == 1 and ended != Ended.INTERRUPTED:
                    ended = Ended.INTERRUPTED
                    self._say("stopping (Ctrl-C again to kill at once) ...")
                    master.send_signal(signal.SIGTERM)
                    deadline = min(deadline, time.monotonic() + STOP_GRACE)
                if self._interrupts >= 2:
                    self._kill_all()
                    ended = Ended.INTERRUPTED
                    break
                if time.monotonic() > deadline:
                    logger.error("the Locust master overran its time; killing it")
                    self._kill_all()
                    ended = Ended.LOAD_FAILED
                    break
                if time.monotonic() - last_fetch > lifecycle.FETCH_PERIOD:
                    life.fetch(parse=bool(self.export.prometheus or self.export.otel))  # the export's host samples
                    last_fetch = time.monotonic()
                if progress is not None:
                    progress.poll()
                try:  # 0.2 s between looks, but the master's exit is seen at once
                    master.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self._stop_workers()
            for s, h in old.items():
                signal.signal(s, h)
        if progress is not None:
            progress.finish()
        if ended == Ended.COMPLETED and not self._all_steps_ran(run):
            ended = Ended.LOAD_FAILED
            came = workers_connected(run)
            if came is not None and came < self.expect_workers:
                self._warn(f"only {came} of {self.expect_workers} workers connected within {self.dist.wait:.0f}s; "
                           f"no load was sent")
                print(f"kneeswarm: error: only {came} of {self.expect_workers} workers connected within "
                      f"{self.dist.wait:.0f}s", file=sys.stderr, flush=True)
            logger.error("the load stopped before all steps ran; see %s", run.path / "logs" / "master.log")
        return ended

    def _start_workers(self, run: RunDir, port: int) -> None:
        """The local workers, connected to the master on ``port``, and the line that says the load."""
        logs = run.path / "logs"
        for i in range(self.workers):
            self._locust(["--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *self.export.worker_args()],
                         logs / f"worker-{i}.log",
                         wrapper=WORKER_WRAPPER)
        remote = self.expect_workers - self.workers
        elsewhere = f" (+{remote} expected on {self.dist.bind_host}:{port})" if remote > 0 else ""
        load = self.plan.load
        steps = (f"search from {load.start:g} to {load.max:g} (at most" if load.mode == "search"
                 else f"steps {load.steps} (~")
        self._say(f"load: {self.workers} local workers{elsewhere}, {steps} {self.plan.step_durations():.0f}s); "
                  f"recording to {run.path}")

    def _all_steps_ran(self, run: RunDir) -> bool:
        steps = run.read_steps()
        if self.plan.load.mode == "search":  # the search ran to its own stop (generator/search.json says why)
            search = _read_json(run.generator_dir / SEARCH_FILE) or {}
            return bool(search.get("stopped_because")) and len(steps) > 0 and steps["t_end"].notna().all()
        return len(steps) == len(self.plan.load.steps) and steps["t_end"].notna().all()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._interrupts += 1

    def _stop_workers(self) -> None:
        deadline = time.monotonic() + 10
        for p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        self._kill_all(grace=5)

    def _kill_all(self, grace: float = 0.0) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    if grace:
                        p.wait(timeout=grace)
                        continue
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(f"kneeswarm: {text}", file=sys.stderr, flush=True)
