"""kneeswarm's wiring into Locust, as event listeners registered at ``init``.

Imported by the locustfile (swarm.py).  It adds the command-line options and loads the plan;
then, as Locust's own runners hold their state, one listener object per process role:

    WorkerListeners   a worker: a RowBuffer whose rows (and generator samples) ride on the
                      worker report; answers the master's clock pings; takes the plan
    MasterListeners   the master or a local runner: measures worker clocks, and for each test
                      a Recording (locustfiles/recording.py: RequestWriter, steps.csv, generator/*.csv)

A worker has one name everywhere: ``worker-<i>``, where i is Locust's own index of it
(``MasterRunner.get_worker_index``; the worker sees the same number as ``runner.worker_index``).
Everything is an event listener but one edit of Locust's runner, made at import
(``prompt.install``): ``MasterRunner.quit`` is replaced by a copy whose fixed 0.5 s sleep for the
workers' final reports is a wait that ends when they have all said goodbye (Locust has no event for
it; the copy is checked against the installed Locust's source by a test).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, TypedDict

import gevent
from locust import events
from locust.env import Environment
from locust.runners import (HEARTBEAT_INTERVAL, HEARTBEAT_LIVENESS, STATE_MISSING, STATE_RUNNING, STATE_SPAWNING,
                            MasterRunner, WorkerRunner)

from kneeswarm.contracts.outcome import EXIT_BAD_INPUT, Ended
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import load_plan, plan_from_dict
from kneeswarm.contracts.rundir import (REPORT_HTML, RunDir)

from kneeswarm.launch import export, lifecycle
from kneeswarm.launch.lifecycle import LifecycleError, open_in_child
from kneeswarm.locustfiles import clocks, prompt, state, webui
from kneeswarm.locustfiles.master_state import MasterState
from kneeswarm.locustfiles.recording import EXIT_OUTCOME_UNWRITTEN, ROW_LAG_S, STOP_MARGIN_S, Recording, worker_name
from kneeswarm.locustfiles.recorder import (GEN_KEY, REPORT_KEY, GeneratorSampler, RowBuffer, WorkerReport)
from kneeswarm.locustfiles.series import Series, merge_in_child, wants_series
from kneeswarm.locustfiles.shape import StepShape
from kneeswarm.locustfiles.steady import ProbeMeter
from kneeswarm.locustfiles.steps import StepSchedule
from kneeswarm.locustfiles.users import InferenceUser
from kneeswarm.locustfiles.watermark import IN_FLIGHT, WATERMARK_KEY

logger = logging.getLogger(__name__)

PLAN_MESSAGE = "kneeswarm_plan"  # master -> each worker as it connects: PlanMessage
LIVE_PERIOD = 2.0  # seconds between live views asked of the lifecycle process
#: seconds after a web UI Stop before the recording closes (workers' last reports arrive)
REPORT_WAIT = 4.0
WORKER_WATCH_PERIOD = 1.0  # seconds between looks at the master's list of workers


class PlanMessage(TypedDict):
    plan: dict[str, Any]  # kneeswarm.contracts.plan.Plan.to_dict(), read back with plan_from_dict


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
        self.series: Series | None = None  # a web UI Start of a plan with repeat > 1 (locustfiles/series.py)
        if env.web_ui is not None:
            webui.KneeTab(env, live=self.live_view, out=lambda: getattr(env.parsed_options, "kneeswarm_out", "runs"),
                          validate=lambda form: _check_form(env, form), on_stop=self.stop_series,
                          mixed=bool(state.plan().request.classes))
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
        if self.series is not None and self.series.continuing:  # the series' next repetition
            self.series.started_next()
        else:  # a Start: a series of its own when the plan repeats
            if self.series is not None:
                self.series.cancel()
            plan = state.plan()
            self.series = Series(plan.load.repeat, plan.load.cooldown) \
                if wants_series(plan, owns_meta, self.env.web_ui) else None
        self.recording = Recording(self.env, run, self.local_buffer, owns_meta, self.worker_clocks, _search_driver)
        if owns_meta:  # no conductor: this process drives the test's host agents and report
            accept = bool(getattr(self.env.parsed_options, "kneeswarm_accept_new_host_keys", False))
            from kneeswarm.launch.conductor import default_hosts

            plan = state.plan()
            if not plan.hosts:  # as `kneeswarm run` does: the process on the target's port, if local
                plan.hosts = default_hosts(plan, None, None)
            self.test = TestHosts(self.recording, plan, accept)
        return self.recording.schedule

    def live_view(self) -> webui.LiveJson:
        """What the Knee tabs show: the current (or last) test's tables and its report link, and
        which repetition of a series is running."""
        view: webui.LiveJson = self.test.view() if self.test is not None else {"steps": [], "hosts": []}
        if self.series is not None:
            view["repeat"] = self.series.view()
        return view

    def stop_series(self) -> None:
        if self.series is not None:
            self.series.cancel()

    def next_in_series(self, test: TestHosts, series: Series) -> None:
        """A test of a series stopped: its report, then the cooldown and the next test's start, or,
        when the series is over, the merged result."""
        gevent.sleep(REPORT_WAIT)  # the workers' last rows (as finish_later)
        test.finish()
        if series.ran(test.run.path, test.run.read_meta().get("ended") == Ended.COMPLETED) and series.wait_cooldown() \
                and self.series is series:
            series.continuing = True
            self.runner.start_shape()  # new_test: the next repetition
            return
        series.finish(merge_in_child)

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
        if self.test is not None and not headless and self.series is not None:  # web UI, repeat: the series goes on
            gevent.spawn(self.next_in_series, self.test, self.series)
        elif self.test is not None and not headless:  # web UI: the report once the last rows are in
            self.test.finish_later(REPORT_WAIT)

    def on_quitting(self, environment: Environment, **_kw: Any) -> None:
        # The recording's last flush first: the lifecycle's finish (agents, report) takes seconds.
        if self.recording is not None:
            self.recording.stop()
        if self.test is not None:
            self.test.finish()


class TestHosts:
    """One test's lifecycle driven from the master (no conductor): the plan's host agents, the
    target's metrics and the report, in a child process (kneeswarm/launch/lifecycle.py), so that no SSH
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
        from kneeswarm.launch.lifecycle import analyze_run

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
        _report_class_knees(self.live.get("classes") or [], summary)
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


def _report_class_knees(rows: list[webui.LiveClass], summary: dict[str, Any]) -> None:
    """Each class's own knees from the summary's ``mix`` (users, "none" where it found none) into
    its row of the Knee classes tab."""
    figures = {c.get("name"): c for c in (summary.get("mix") or {}).get("classes") or []}
    for row in rows:
        c = figures.get(row["class"])
        if c is not None:
            row["knee"], row["latency_knee"] = _knee_users(c.get("knee")), _knee_users(c.get("latency_knee"))


def _knee_users(knee: Any) -> str | float:
    users = knee.get("users") if isinstance(knee, dict) else None
    return users if isinstance(users, (int, float)) else "none"


def _round(x: Any) -> float | None:
    return round(float(x), 1) if isinstance(x, (int, float)) else None


def _live_here(run: RunDir) -> webui.Live:
    """The live step table without a lifecycle process (its agents could not start)."""
    from kneeswarm.launch.lifecycle import live_hosts

    return {"steps": [], "hosts": live_hosts(run)}






def _stop_at_once(environment: Environment, **_kw: Any) -> None:
    """The test stops (Runner.stop fires this before it stops the users): the stop_timeout that lets
    a step down's users finish (``_let_stopped_users_finish``; a worker has it from the master's spawn
    message) is not for the end of the test (STOP_MARGIN_S); a --stop-timeout of the user's own is kept."""
    if environment.stop_timeout == state.plan().request.timeout + STOP_MARGIN_S:
        environment.stop_timeout = 0.0


def _search_driver(run: RunDir, plan: Any, horizon: Any) -> Any:
    """mode = "search": the driver the step schedule asks for each next probe (kneeswarm.launch.search),
    fed the rows as they arrive and judging them up to ``horizon(now)``; None for a grid."""
    if plan.load.mode != "search":
        return None
    from kneeswarm.launch.search import SearchDriver, settings_of

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

