"""kneeswarm's wiring into Locust, as event listeners registered at ``init``.

Imported by the locustfile (swarm.py).  It adds the command-line options and loads the plan;
then, as Locust's own runners hold their state, one listener object per process role:

    WorkerListeners   a worker: a RowBuffer whose rows (and generator samples) ride on the
                      worker report; answers the master's clock pings; takes the plan
    MasterListeners   the master or a local runner: measures worker clocks, and for each test
                      a Recording (RequestWriter, steps.csv, generator/*.csv)

A worker has one name everywhere: ``worker-<i>``, where i is Locust's own index of it
(``MasterRunner.get_worker_index``; the worker sees the same number as ``runner.worker_index``).
Nothing here edits Locust's runners.
"""

from __future__ import annotations

import csv
import logging
import os
import socket
import time
from typing import Any, TypedDict

import gevent
from locust import events
from locust.env import Environment
from locust.runners import (HEARTBEAT_INTERVAL, HEARTBEAT_LIVENESS, STATE_MISSING, STATE_RUNNING, STATE_SPAWNING,
                            WORKER_REPORT_INTERVAL, MasterRunner, WorkerRunner)

from kneeswarm.outcome import EXIT_BAD_INPUT, EXIT_FAILED, Ended
from kneeswarm.plan import PlanError, load_plan, plan_from_dict
from kneeswarm.rundir import (CLOCKS_FILE, GENERATOR_COLUMNS, META_FILE, REPORT_HTML, STEPS_FILE, RunDir, safe_name,
                              write_json)

from kneeswarm import export, lifecycle
from kneeswarm.lifecycle import LifecycleError, open_in_child
from locustfiles import clocks, prompt, state, webui
from locustfiles.master_state import MasterState
from locustfiles.recorder import (FLUSH_INTERVAL, GEN_KEY, RECORDER_FILE, REPORT_KEY, GeneratorSampler,
                                  RequestWriter, RowBuffer, WorkerReport)
from locustfiles.shape import StepShape
from locustfiles.steady import AutoHold, ProbeMeter
from locustfiles.steps import DRAIN_FACTOR, DRAIN_MIN_S, StepSchedule
from locustfiles.users import InferenceUser
from locustfiles.watermark import IN_FLIGHT, LOCAL, WATERMARK_KEY, Horizon

logger = logging.getLogger(__name__)

PLAN_MESSAGE = "kneeswarm_plan"  # master -> each worker as it connects: PlanMessage
LIVE_PERIOD = 2.0  # seconds between live views asked of the lifecycle process
#: seconds after a web UI Stop before the recording closes (workers' last reports arrive)
REPORT_WAIT = 4.0
AUTO_HOLD_MARGIN_S = 1.0  # hold = "auto": a row may arrive this much later than its report interval and flush
#: how far a worker's rows trail the master where it sends no watermark (watermark.Horizon's fallback)
ROW_LAG_S = WORKER_REPORT_INTERVAL + FLUSH_INTERVAL + AUTO_HOLD_MARGIN_S
WORKER_WATCH_PERIOD = 1.0  # seconds between looks at the master's list of workers
# A step down (a search refining to fewer users, a grid going down) stops users: Locust kills them at
# once unless `stop_timeout` is set, and a request in flight is then cut without a row (the server
# still serves it, into the next step).  With it, a stopped user finishes the request it is in and
# stops before its next (Locust's User.stop(force=False); the ramp-down, and so the next step's
# spawning_complete, waits for it).  A request lasts at most request.timeout, then fails on its own:
# this much longer, and no request is ever cut by our own step change.  The test's own end stays at
# once (``_stop_at_once``): the last step drained already (steps.drain), and a worker's final report
# must reach a master that waits prompt.QUIT_WAIT (0.5 s) for it, which a worker still waiting on
# its users' requests would miss, losing its last rows.
STOP_MARGIN_S = 1.0
EXIT_OUTCOME_UNWRITTEN = EXIT_FAILED  # Locust's exit code when the recording's outcome could not be written


class PlanMessage(TypedDict):
    plan: dict[str, Any]  # kneeswarm.plan.Plan.to_dict(), read back with plan_from_dict


_plan_loaded = False  # the form shows the loaded plan's values once there is one


def _plan_value(key: str) -> str:
    """The loaded plan's value of "load.steps" etc., as the start form shows it."""
    if not _plan_loaded:
        return ""
    value: Any = state.plan()
    for part in key.split("."):
        value = getattr(value, part)
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--kneeswarm-plan", default="", include_in_web_ui=True, help="plan TOML file (steps, ramp, hold, request body)")
    webui.add_plan_arguments(parser, _plan_value)
    parser.add_argument("--kneeswarm-run-dir", default="", include_in_web_ui=False, help="run directory to write; default: a new one under --kneeswarm-out at each test start")
    parser.add_argument("--kneeswarm-out", default="runs", include_in_web_ui=False, help="where new run directories go (default: runs)")
    parser.add_argument("--kneeswarm-accept-new-host-keys", action="store_true", include_in_web_ui=False,
                        help="record the SSH host key of a monitored host seen for the first time")
    parser.add_argument("--kneeswarm-insecure-web", action="store_true", include_in_web_ui=False,
                        help="allow the web UI / master port on a non-loopback address without --web-login")
    export.add_locust_arguments(parser)


prompt.install()


@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    problem = webui.check_binding(environment) if not isinstance(environment.runner, WorkerRunner) else None
    if problem:
        logger.error("kneeswarm: %s", problem)
        raise SystemExit(EXIT_BAD_INPUT)
    try:
        _load_plan(environment)
    except PlanError as e:
        logger.error("kneeswarm: %s", e)
        raise SystemExit(EXIT_BAD_INPUT) from None
    runner = environment.runner
    environment.events.test_stopping.add_listener(_stop_at_once)
    if isinstance(runner, WorkerRunner):
        WorkerListeners(environment, runner)
    elif runner is not None:
        live = export.LocustExport(environment)  # first: its `quitting` (linger) then comes after the report
        listeners = MasterListeners(environment, runner)
        live.follow(lambda: listeners.recording.run if listeners.recording is not None else None)
        prompt.await_workers(environment)


def _load_plan(env: Environment, form: Any = None) -> None:
    """The plan file with the form's / command line's fields over it; PlanError if it is bad."""
    global _plan_loaded
    opts = env.parsed_options
    path = getattr(opts, "kneeswarm_plan", "") if opts else ""
    if form is not None and "kneeswarm_plan" in form:
        path = form.get("kneeswarm_plan", "")
    overrides = {"target": env.host} if env.host else {}
    try:
        overrides.update(webui.form_overrides(form if form is not None else opts))
    except ValueError as e:
        raise PlanError(str(e)) from None
    plan = load_plan(path or None, overrides)
    if form is not None:  # only checking the start form
        return
    state.set_plan(plan)
    _plan_loaded = True
    if opts is not None:
        for option, key, _ in webui.PLAN_FIELDS:
            setattr(opts, option, _plan_value(key))
    _apply_plan(env)


def _check_form(env: Environment, form: Any) -> str | None:
    """The start form's plan fields: None, or one line saying what is wrong."""
    try:
        _load_plan(env, form)
    except PlanError as e:
        return f"kneeswarm: {e}"
    return None


def _apply_plan(env: Environment) -> None:
    plan = state.plan()
    InferenceUser.network_timeout = InferenceUser.connection_timeout = plan.request.timeout
    if not env.host:
        env.host = plan.target
    InferenceUser.host = plan.target


def worker_name(runner: MasterRunner, client_id: str) -> str:
    """The one name of a worker in the run directory (rows, generator/, clocks)."""
    return f"worker-{runner.get_worker_index(client_id)}"


class WorkerListeners:
    """A worker's part: its rows and samples ride on Locust's worker report to the master."""

    def __init__(self, env: Environment, runner: WorkerRunner):
        self.env, self.runner = env, runner
        self.buffer = RowBuffer()
        self.sampler = GeneratorSampler(lambda: runner.user_count)
        env.events.request.add_listener(self.buffer.on_request)
        env.events.report_to_master.add_listener(self.on_report)
        runner.register_message(PLAN_MESSAGE, self.on_plan)
        runner.register_message(clocks.PING, self.on_ping)
        gevent.spawn(self.sampler.run_forever)

    def on_report(self, client_id: str, data: dict) -> None:
        # the watermark read with the rows taken, no greenlet switch between: every row not in this
        # report starts at or after it (watermark.py)
        report: WorkerReport = {REPORT_KEY: self.buffer.take(), WATERMARK_KEY: IN_FLIGHT.watermark(time.time()),
                                GEN_KEY: self.sampler.take()}
        data.update(report)

    def on_plan(self, environment: Environment, msg: Any, **_kw: Any) -> None:
        data: PlanMessage = msg.data
        state.set_plan(plan_from_dict(data["plan"], "plan from master"))
        _apply_plan(environment)

    def on_ping(self, environment: Environment, msg: Any, **_kw: Any) -> None:
        self.runner.send_message(clocks.PONG, dict(clocks.pong(msg.data or {})))


class MasterListeners:
    """The master's (or a local runner's) part: worker clocks, and one Recording per test."""

    def __init__(self, env: Environment, runner: Any):
        self.env, self.runner = env, runner
        self.is_master = isinstance(runner, MasterRunner)
        self.worker_clocks = clocks.WorkerClocks()
        self.local_buffer = None if self.is_master else RowBuffer()
        self.recording: Recording | None = None
        self.test: TestHosts | None = None  # the test's lifecycle when no conductor drives it
        if env.web_ui is not None:
            webui.KneeTab(env, live=self.live_view, out=lambda: getattr(env.parsed_options, "kneeswarm_out", "runs"),
                          validate=lambda form: _check_form(env, form))
        if self.local_buffer is not None:
            env.events.request.add_listener(self.local_buffer.on_request)
        if isinstance(env.shape_class, StepShape):
            env.shape_class.new_test = self.new_test
        if self.is_master:
            runner.register_message(clocks.PONG, self.on_pong)
            gevent.spawn(self.ping_loop)
            self.known_workers: dict[str, str] = {}  # client id -> worker name, of every worker seen
            self.last_heard: dict[str, float] = {}  # client id -> when its last heartbeat was seen
            self.state = MasterState(env)
            env.events.worker_connect.add_listener(self.on_worker_connect)
            gevent.spawn(self.watch_workers)
        env.events.test_start.add_listener(self.on_test_start)
        env.events.spawning_complete.add_listener(self.on_spawning_complete)
        env.events.worker_report.add_listener(self.on_worker_report)
        env.events.test_stop.add_listener(self.on_test_stop)
        env.events.quitting.add_listener(self.on_quitting)

    def new_test(self) -> StepSchedule:
        """A test starts (StepShape.reset_time): a new Recording, in a new run directory unless
        the conductor named one."""
        if self.test is not None:
            self.test.finish()
        if self.recording is not None:
            self.recording.stop()
        if self.recording is not None or self.env.web_ui is not None:
            try:  # a new Start: the form's plan fields (checked before the start was accepted)
                _load_plan(self.env)
            except PlanError as e:
                logger.error("kneeswarm: %s; the previous plan is used", e)
        run, owns_meta = _run_dir(self.env, first=self.recording is None)
        self.recording = Recording(self.env, run, self.local_buffer, owns_meta, self.worker_clocks)
        if owns_meta:  # no conductor: this process drives the test's host agents and report
            accept = bool(getattr(self.env.parsed_options, "kneeswarm_accept_new_host_keys", False))
            from kneeswarm.conductor import default_hosts

            plan = state.plan()
            if not plan.hosts:  # as `kneeswarm run` does: the process on the target's port, if local
                plan.hosts = default_hosts(plan, None, None)
            self.test = TestHosts(self.recording, plan, accept)
        return self.recording.schedule

    def live_view(self) -> webui.LiveJson:
        """What the Knee tabs show: the current (or last) test's tables and its report link."""
        return self.test.view() if self.test is not None else {"steps": [], "hosts": []}

    def on_worker_connect(self, client_id: str, **_kw: Any) -> None:
        self.state.connected(client_id)

    def on_test_start(self, environment: Environment, **_kw: Any) -> None:
        if self.is_master:
            self.state.test_started()
            for client in self.runner.clients.all:
                message: PlanMessage = {"plan": state.plan().to_dict()}
                self.runner.send_message(PLAN_MESSAGE, dict(message), client.id)
            gevent.spawn(self.ping_round)  # measured before the first request is sent

    def ping_round(self) -> None:
        """Measure every connected worker's clock (PINGS_PER_ROUND round trips each)."""
        for _ in range(clocks.PINGS_PER_ROUND):
            for client in list(self.runner.clients.all):
                self.runner.send_message(clocks.PING, self.worker_clocks.request(), client.id)
            gevent.sleep(clocks.PING_SPACING)

    def ping_loop(self) -> None:
        while True:
            if self.runner.clients.all:
                self.ping_round()
            gevent.sleep(clocks.ROUND_PERIOD if self.worker_clocks.summary() else 1.0)

    def watch_workers(self) -> None:
        """A worker that goes missing (killed, network gone) during a test: the run goes on with
        the others, and the loss is recorded (Recording.worker_lost) for the analysis to flag the
        steps it affected.  Locust marks a worker missing once its heartbeat counter (reset to
        HEARTBEAT_LIVENESS by each heartbeat, less one each HEARTBEAT_INTERVAL) runs out, some
        seconds after it went quiet; when it was last heard from is read off that counter here."""
        while True:
            gevent.sleep(WORKER_WATCH_PERIOD)
            now = time.time()
            clients = list(self.runner.clients.all)
            present = {c.id for c in clients if c.state != STATE_MISSING}
            for c in clients:
                if c.id in present and c.heartbeat >= 0:  # its last heartbeat came (LIVENESS - counter) s ago
                    heard = now - (HEARTBEAT_LIVENESS - min(c.heartbeat, HEARTBEAT_LIVENESS)) * HEARTBEAT_INTERVAL
                    self.last_heard[c.id] = max(heard, self.last_heard.get(c.id, heard))
            for cid in present:
                if cid not in self.known_workers:
                    self.known_workers[cid] = worker_name(self.runner, cid)
                    if self.recording is not None and not self.recording.stopped:
                        self.recording.worker_back(self.known_workers[cid], now)  # a lost one that healed
            loading = self.runner.state in (STATE_SPAWNING, STATE_RUNNING)  # a quit after the test is no loss
            before = len(self.known_workers)
            for cid, name in list(self.known_workers.items()):
                if cid not in present:
                    del self.known_workers[cid]
                    self.state.gone(cid)
                    if loading and self.recording is not None and not self.recording.stopped:
                        self.recording.worker_lost(name, now, self.last_heard.get(cid, now), before)

    def on_pong(self, environment: Environment, msg: Any, **_kw: Any) -> None:
        self.worker_clocks.answered(worker_name(self.runner, msg.node_id), msg.data or {})

    def on_spawning_complete(self, user_count: int, **_kw: Any) -> None:
        if self.recording is not None:
            self.recording.schedule.spawned(time.time(), self.runner.user_count)

    def on_worker_report(self, client_id: str, data: dict) -> None:
        if self.recording is not None:
            self.recording.gate.admit(worker_name(self.runner, client_id), data.get(REPORT_KEY), data.get(GEN_KEY),
                                      _watermark(data.get(WATERMARK_KEY)))
            if not self.recording.stopped:
                self.recording.take_in()

    def on_test_stop(self, environment: Environment, **_kw: Any) -> None:
        # Workers send their last report after the master's stop; quitting flushes again.
        if self.recording is not None:
            self.recording.end()
        headless = bool(getattr(environment.parsed_options, "headless", False))
        if self.test is not None and not headless:  # web UI: the report once the last rows are in
            self.test.finish_later(REPORT_WAIT)

    def on_quitting(self, environment: Environment, **_kw: Any) -> None:
        # The recording's last flush first: the lifecycle's finish (agents, report) takes seconds.
        if self.recording is not None:
            self.recording.stop()
        if self.test is not None:
            self.test.finish()


class TestHosts:
    """One test's lifecycle driven from the master (no conductor): the plan's host agents, the
    target's metrics and the report, in a child process (kneeswarm/lifecycle.py), so that no SSH
    work runs on the gevent loop that serves the workers' heartbeats."""

    def __init__(self, recording: Recording, plan: Any, accept_new_host_keys: bool):
        self.recording, self.run = recording, recording.run
        self.child: Any = None
        self.live: webui.Live = {"steps": [], "hosts": []}
        self.report: webui.ReportLink = {}
        self.finished = False
        self._later: Any = None
        try:
            self.child, facts = open_in_child(plan, self.run, accept_new_host_keys)
            self.run.update_meta(hosts_preflight=facts)
            self.child.call("start")
        except (LifecycleError, OSError) as e:
            recording.notes.append(f"host agents not started: {e}")
            logger.error("kneeswarm: host agents not started: %s", e)
            if self.child is not None:
                self.child.close()
                self.child = None
        self._poller = gevent.spawn(self._poll_loop)

    def view(self) -> webui.LiveJson:
        return {**self.live, **self.report, "run_id": self.run.path.name}

    def _poll_loop(self) -> None:
        last_fetch = time.monotonic()
        while not self.finished:
            gevent.sleep(LIVE_PERIOD)
            if self.finished:
                return
            fetch = self.child is not None and time.monotonic() - last_fetch >= lifecycle.FETCH_PERIOD
            self._ask("fetch" if fetch else "live")
            if fetch:
                last_fetch = time.monotonic()

    def _ask(self, op: str) -> None:
        if self.child is None:
            self.live = _live_here(self.run)
            return
        try:
            self.live = self.child.call(op)["live"]
        except LifecycleError as e:
            logger.warning("kneeswarm: live view: %s", e)

    def finish_later(self, delay: float) -> None:
        if self._later is None and not self.finished:
            self._later = gevent.spawn_later(delay, self.finish)

    def finish(self) -> None:
        """Recording closed, agents stopped and fetched, meta.json completed, report written; once."""
        if self.finished:
            return
        self.finished = True
        if self._later is not None and gevent.getcurrent() is not self._later:
            self._later.kill(block=False)
        self._poller.join(timeout=LIVE_PERIOD)  # it sees `finished` after its sleep (or its call)
        self._poller.kill(block=False)
        self.recording.stop()
        if self.child is not None:
            self._finish_child()
        else:
            self._report_here()
        logger.info("kneeswarm: report of %s: %s", self.run.path, self.report.get("report_url") or "not written")

    def _finish_child(self) -> None:
        try:
            done = self.child.call("finish")
            meta = self.run.read_meta()
            warnings = list(meta.get("warnings") or []) + [w for w in done["warnings"] if w not in (meta.get("warnings") or [])]
            self.run.update_meta(hosts=done["hosts"], target_metrics=done["target_metrics"], warnings=warnings)
            self.live = self.child.call("live")["live"]
            self._reported(self.child.call("report"))
        except (LifecycleError, OSError) as e:  # meta.json may lack the hosts: not only logged, exit 1
            logger.error("kneeswarm: finishing the test failed: %s", e)
            self.report = {"report_error": str(e)}
            env = self.recording.env
            if not env.process_exit_code:
                env.process_exit_code = EXIT_OUTCOME_UNWRITTEN
        finally:
            self.child.close()

    def _report_here(self) -> None:
        from kneeswarm.lifecycle import analyze_run

        summary, error = analyze_run(self.run)
        report = self.run.report_path
        self._reported({"error": error, "report": str(report) if report.is_file() else None})

    def _reported(self, answer: dict[str, Any]) -> None:
        """The report's link, and each step's final figures and validity from its summary."""
        summary = answer.get("summary") or {}
        final = {i: st for i, st in enumerate(summary.get("steps") or [])}
        for row in self.live.get("steps", []):
            st = final.get(row.get("step"))
            if st:
                row.update({"qps": _round(st.get("qps")), "p50_ms": _round(st.get("p50_ms")), "p99_ms": _round(st.get("p99_ms")),
                            "requests": st.get("requests", row.get("requests")),
                            "valid": "yes" if st.get("valid") else "no: " + "; ".join(st.get("reasons") or [])})
        self.live["knee"] = _report_knee(summary)
        if answer.get("report"):
            self.report = {"report_url": f"/kneeswarm/runs/{self.run.path.name}/report/{REPORT_HTML}"}
        else:
            self.report = {"report_error": answer.get("error") or "no report written"}


def _report_knee(summary: dict[str, Any]) -> webui.LiveKnee:
    """The knee the report found (and, mode = "search", the knee bracket), for the Knee tab's chart."""
    knee: webui.LiveKnee = {}
    found = summary.get("knee") or {}
    if found.get("users") is not None:
        knee["users"], knee["how"] = found["users"], f"report: {found.get('method')}"
    bracket = (summary.get("search") or {}).get("knee_bracket")
    if isinstance(bracket, list) and len(bracket) == 2 and bracket[0] is not None:
        knee["bracket"] = bracket
        knee.setdefault("how", "report: search bracket")
    return knee


def _round(x: Any) -> float | None:
    return round(float(x), 1) if isinstance(x, (int, float)) else None


def _live_here(run: RunDir) -> webui.Live:
    """The live step table without a lifecycle process (its agents could not start)."""
    from kneeswarm.lifecycle import live_hosts

    return {"steps": [], "hosts": live_hosts(run)}


class Recording:
    """The master's (or local runner's) recording of one test: writer, steps, generator CSVs.

    Workers' reports pass through ``gate`` (clocks.ClockGate), the one place where their times
    are put on the master's clock; a local runner's rows are on it already.

    A write that fails (a full disk) never stops the load: request rows are held and retried
    (RequestWriter), and whatever could not be written is counted.  The counts go to
    generator/recorder.json (RECORDER_FILE), which the conductor merges into meta.json; with no
    conductor (web UI) they go straight to meta.json["lost"] and ["warnings"].
    """

    def __init__(self, env: Environment, run: RunDir, local_buffer: RowBuffer | None, owns_meta: bool,
                 worker_clocks: clocks.WorkerClocks):
        self.env, self.run, self.local_buffer = env, run, local_buffer
        self.worker_clocks = worker_clocks
        self.owns_meta = owns_meta  # no conductor (web UI / bare locust): meta.json is ours to finish
        plan = state.plan()
        load = plan.load
        _let_stopped_users_finish(env, plan.request.timeout)
        # hold = "auto": the master judges each step on the rows as they arrive (steady.AutoHold), up
        # to the sources' watermark (watermark.Horizon: every row before it is in)
        self.rows_in = Horizon(ROW_LAG_S)
        self.auto_hold = (AutoHold(load.min_hold, load.max_hold, load.settle, load.ci, lag_s=ROW_LAG_S,
                                   open_loop=load.arrivals == "open", horizon=self.horizon)
                          if load.auto_hold else None)
        self.search = _search_driver(run, plan, self.horizon)  # mode = "search": the steps are chosen as the run goes
        steps = [self.search.first()] if self.search is not None else load.steps
        self.schedule = StepSchedule(steps, load.ramp, load.hold_s(), on_change=self._write_steps,
                                     auto=self.auto_hold, continuous=load.mode == "soak",
                                     chooser=self.search, drain=self.drain_s,
                                     early=self.search.may_end if self.search is not None else None)
        self.request_timeout = plan.request.timeout
        self.slowest_s = 0.0  # the slowest request seen so far (for the last step's drain)
        self.writer = RequestWriter(run, self.schedule.step_starts)
        self.gate = clocks.ClockGate(worker_clocks)
        self.failures: dict[str, list] = {}  # what -> [count, last error] of writes other than parts
        self.notes: list[str] = []  # other one-line problems of this test, for meta.json["warnings"]
        self.lost_workers: list[dict[str, Any]] = []  # workers that went missing: {worker, t, step}
        self.stopped = False
        self.generator_rows_lost = 0
        self.outcome_errors: list[tuple[str, str]] = []  # (file, why) of the last write_outcome's failures
        self.local_sampler = GeneratorSampler(self._user_count) if local_buffer is not None else None
        self._flusher = gevent.spawn(self._flush_loop)
        self._sampler = gevent.spawn(self.local_sampler.run_forever) if self.local_sampler else None

    def _user_count(self) -> int:
        """The users running now; 0 with no runner (as StepShape.tick reads it), not a crash of the sampler."""
        return self.env.runner.user_count if self.env.runner is not None else 0

    def _failed(self, what: str, e: OSError) -> None:
        entry = self.failures.setdefault(what, [0, ""])
        entry[0] += 1
        entry[1] = " ".join(str(e).split())
        logger.error("kneeswarm: could not write %s: %s", what, e)

    def worker_lost(self, worker: str, t: float, last_heard: float, workers_before: int) -> None:
        """A worker went missing at ``t`` (last heard from at ``last_heard``, one of
        ``workers_before``): meta.json ``workers_lost`` (read by analysis.workers, which flags
        the steps it affected) and a warning line."""
        step = self.schedule.log[-1] if self.schedule.log else None
        where = f"step {step.index} ({step.users} users)" if step else "before the first step"
        when = time.strftime("%H:%M:%S", time.gmtime(t)) + f"Z (t={t:.1f})"
        reported = self.gate.last_admitted.get(worker)
        kept = (f"its rows up to its last report, {t - reported:.1f}s earlier, are kept" if reported is not None
                else "it had sent no rows")
        self.notes.append(f"{worker} lost at {when} during {where}, last heard from {t - last_heard:.1f}s earlier: "
                          f"the run went on with {workers_before - 1} of {workers_before} workers; {kept}")
        self.lost_workers.append({"worker": worker, "t": round(t, 3), "step": step.index if step else None,
                                  "t_last_heard": round(last_heard, 3), "workers_before": workers_before,
                                  "t_last_report": None if reported is None else round(reported, 3)})
        logger.warning("kneeswarm: %s", self.notes[-1])

    def worker_back(self, worker: str, t: float) -> None:
        """A worker lost earlier in this test answers again (its network came back): ``t_back``."""
        for entry in reversed(self.lost_workers):
            if entry["worker"] == worker and entry.get("t_back") is None:
                entry["t_back"] = round(t, 3)
                self.notes.append(f"{worker} came back at {time.strftime('%H:%M:%S', time.gmtime(t))}Z (t={t:.1f})")
                return

    def _write_steps(self, log: list) -> None:
        try:
            self.run.write_steps(s.full_row() for s in log)
        except OSError as e:  # the next change rewrites the whole file
            self._failed(STEPS_FILE, e)

    def add_generator_rows(self, worker: str, rows: list) -> None:
        if not rows:
            return
        path = self.run.generator_dir / f"{safe_name(worker)}.csv"
        try:
            new = not path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", newline="") as f:
                w = csv.writer(f)
                if new:
                    w.writerow(GENERATOR_COLUMNS)
                w.writerows(rows)
        except OSError as e:
            self.generator_rows_lost += len(rows)
            self._failed("generator samples", e)

    def flush(self, final: bool = False) -> None:
        if self.local_buffer is not None:
            # the watermark read with the rows taken (no greenlet switch between), set once they are handed over
            local, mark = self.local_buffer.take(), IN_FLIGHT.watermark(time.time())
            self._rows(LOCAL, local)
            self.rows_in.update(LOCAL, mark)
        if self.local_sampler is not None:  # there is one exactly when there is a local buffer
            self.add_generator_rows(LOCAL, self.local_sampler.take())
        self.take_in(final)
        self.writer.flush()  # never raises: rows it cannot write are held, or counted lost

    def take_in(self, final: bool = False) -> None:
        """The workers' reports the clock gate lets through: rows to the writer (written at the next
        flush) and to what judges the steps, then their watermarks.  Called as each report arrives
        too, not only every FLUSH_INTERVAL: the horizon then moves as soon as the rows are in."""
        for worker, rows, samples in self.gate.release(final):
            self._rows(worker, rows)
            self.add_generator_rows(worker, samples)
        for worker, mark in self.gate.take_watermarks().items():  # after their rows were handed over
            self.rows_in.update(worker, mark)

    def horizon(self, now: float) -> float:
        """Up to when every row is in (master clock): the least watermark of the workers present (a
        lost one, marked missing, is not waited for), or the local runner's own (watermark.Horizon)."""
        runner = self.env.runner
        if isinstance(runner, MasterRunner):
            sources = [worker_name(runner, c.id) for c in runner.clients.all if c.state != STATE_MISSING]
        else:
            sources = [LOCAL]
        return self.rows_in.at(now, sources)

    def _rows(self, worker: str, rows: Any) -> None:
        """A batch of request rows (column lists): written, and seen by what judges the steps."""
        self.writer.add(worker, rows)
        if self.auto_hold is not None:
            self.auto_hold.add(rows)
        if self.search is not None:
            self.search.meter.add(rows)
        lat = [v for v in (rows or {}).get("latency_ms") or [] if isinstance(v, (int, float)) and v == v]
        if lat:
            self.slowest_s = max(self.slowest_s, max(lat) / 1000.0)

    def drain_s(self) -> float:
        """How long the last step's load goes on past its window's end: DRAIN_FACTOR x the slowest
        request seen, at least DRAIN_MIN_S, at most request.timeout (no request lasts longer)."""
        return min(self.request_timeout, max(DRAIN_MIN_S, DRAIN_FACTOR * self.slowest_s))

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(FLUSH_INTERVAL)
            self.flush()

    def lost(self) -> dict[str, int]:
        """What could not be written, for meta.json["lost"] (only what is not zero)."""
        counts = {"request_rows": self.writer.rows_lost, "generator_rows": self.generator_rows_lost}
        return {**{k: v for k, v in counts.items() if v}, **self.gate.lost()}

    def warnings(self) -> list[str]:
        """One line per kind of failed write, for meta.json["warnings"]."""
        w, out = self.writer, []
        if w.failed_writes:
            out.append(f"requests/: {w.failed_writes} part writes failed ({w.last_error}); their rows were held "
                       f"and retried")
        if w.rows_lost:
            out.append(f"requests/: {w.rows_lost} of {w.rows_received} request rows could not be written "
                       f"and were dropped ({w.last_error})")
        out += [f"{what}: {n} writes failed ({err})" for what, (n, err) in sorted(self.failures.items())]
        return out + self.gate.warnings() + self.notes

    def write_outcome(self, final: bool) -> None:
        """generator/clocks.json and generator/recorder.json (the conductor copies both to meta.json);
        with no conductor, meta.json itself.  A write that fails is not only logged: what could
        still be written says so, and the process exits 1 (``environment.process_exit_code``), so
        that a Locust-launched run ends with its ``ended`` in meta.json or a non-zero exit."""
        summary: dict[str, Any] = {
            "request_rows": {"received": self.writer.rows_received, "written": self.writer.rows_written,
                             "held": self.writer.rows_held, "lost": self.writer.rows_lost},
            "lost": self.lost(), "warnings": self.warnings(), "final": final,
            "workers_lost": self.lost_workers,
        }
        failed: list[tuple[str, str]] = []
        offsets = self.worker_clocks.summary()
        if offsets:
            self._try_write(failed, CLOCKS_FILE, lambda: write_json(self.run.generator_dir / CLOCKS_FILE, offsets))
        self._try_write(failed, RECORDER_FILE, lambda: write_json(self.run.generator_dir / RECORDER_FILE, summary))
        if self.owns_meta:
            done = self.schedule.done and len(self.schedule.log) == len(self.schedule.steps) and \
                (self.search is None or self.search.stopped_because is not None)
            warnings = summary["warnings"] + [f"load generator: could not write generator/{what} ({why})"
                                              for what, why in failed]
            self._try_write(failed, META_FILE, lambda: self.run.update_meta(
                ended=Ended.COMPLETED if done else Ended.STOPPED, complete=done and not failed, finished=time.time(),
                worker_clocks=offsets, lost=summary["lost"], warnings=warnings, workers_lost=self.lost_workers))
        self._outcome_failed(failed, summary)

    def _try_write(self, failed: list[tuple[str, str]], what: str, write: Any) -> None:
        try:
            write()
        except OSError as e:
            failed.append((what, " ".join(str(e).split())))
            logger.error("kneeswarm: could not write %s: %s", what, e)

    def _outcome_failed(self, failed: list[tuple[str, str]], summary: dict[str, Any]) -> None:
        """The exit code follows the last outcome written: 1 while any part of it could not be."""
        if failed:
            logger.error("kneeswarm: the recording's outcome, as far as it was not written: %s", summary)
            self.outcome_errors = failed
            if not self.env.process_exit_code:
                self.env.process_exit_code = EXIT_OUTCOME_UNWRITTEN
        elif self.outcome_errors:
            self.outcome_errors = []
            if self.env.process_exit_code == EXIT_OUTCOME_UNWRITTEN:
                self.env.process_exit_code = None

    def end(self) -> None:
        """The test stopped (shape finished, or Stop pressed): flush, and say how it ended."""
        self.flush()
        self.write_outcome(final=False)

    def stop(self) -> None:
        """The recording is over (Locust quits, or a new test starts): last flush, last step closed.
        Once: a second call does nothing."""
        if self.stopped:
            return
        self.stopped = True
        for g in (self._flusher, self._sampler):
            if g is not None:
                g.kill(block=False)
        self.flush(final=True)  # rows of a worker that never answered a clock ping go uncorrected
        self.writer.abandon()  # rows whose last write failed: counted lost
        self.write_outcome(final=True)
        self.schedule.finish(time.time())  # a test cut short: its last step ends now in steps.csv
        logger.info("kneeswarm: %d request rows in %s", self.writer.rows_written, self.run.path)


def _let_stopped_users_finish(env: Environment, request_timeout: float) -> None:
    """A user stopped by a step down finishes its request first (STOP_MARGIN_S): Locust's stop_timeout,
    which the master sends its workers with every spawn message; a --stop-timeout given is kept."""
    given = getattr(env.parsed_options, "stop_timeout", None) if env.parsed_options is not None else None
    try:
        given = float(given or 0.0)
    except (TypeError, ValueError):
        given = 0.0
    if given <= 0:
        env.stop_timeout = request_timeout + STOP_MARGIN_S


def _stop_at_once(environment: Environment, **_kw: Any) -> None:
    """The test stops (Runner.stop fires this before it stops the users): the stop_timeout that lets
    a step down's users finish (``_let_stopped_users_finish``; a worker has it from the master's spawn
    message) is not for the end of the test (STOP_MARGIN_S); a --stop-timeout of the user's own is kept."""
    if environment.stop_timeout == state.plan().request.timeout + STOP_MARGIN_S:
        environment.stop_timeout = 0.0


def _search_driver(run: RunDir, plan: Any, horizon: Any) -> Any:
    """mode = "search": the driver the step schedule asks for each next probe (kneeswarm.search),
    fed the rows as they arrive and judging them up to ``horizon(now)``; None for a grid."""
    if plan.load.mode != "search":
        return None
    from kneeswarm.search import SearchDriver, settings_of

    return SearchDriver(settings_of(plan), ProbeMeter(), run, settle=plan.load.settle, lag_s=ROW_LAG_S,
                        open_loop=plan.load.arrivals == "open", auto_hold=plan.load.auto_hold, horizon=horizon,
                        ci=plan.load.ci, min_rows=plan.analysis.min_requests)


def _watermark(value: Any) -> float | None:
    """A worker report's watermark: a number, or None (an older worker sends none; anything else is ignored)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _run_dir(env: Environment, first: bool) -> tuple[RunDir, bool]:
    """The conductor names the run directory of the first test (and owns its meta.json); a bare
    Locust (web UI) makes one per test and writes plan.toml and meta.json itself."""
    opts = env.parsed_options
    given = getattr(opts, "kneeswarm_run_dir", "") if opts else ""
    if given and first:
        run = RunDir(given)
        run.path.mkdir(parents=True, exist_ok=True)
        return run, False
    out = getattr(opts, "kneeswarm_out", "runs") if opts else "runs"
    plan = state.plan()
    run = RunDir.create(out, plan.name)
    run.plan_path.write_text(plan.to_toml())
    run.update_meta(
        run_id=run.path.name,
        started=time.time(),
        launcher="locust",
        load_host=socket.gethostname(),
        pid=os.getpid(),
        complete=False,
    )
    logger.info("kneeswarm: recording to %s", run.path)
    return run, True

