"""kneeswarm's wiring into Locust, as event listeners registered at ``init``.

Imported by the locustfile (swarm.py).  It adds the command-line options, loads the plan,
and connects the recorder: on workers a RowBuffer whose rows ride on the worker report; on
the master (or a local runner) the RequestWriter, the step log (steps.csv) and the
load-generator self-metrics (generator/*.csv).  Nothing here edits Locust's runners.
"""

from __future__ import annotations

import csv
import logging
import os
import socket
import time
from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from kneeswarm.plan import PlanError, load_plan, plan_from_dict
from kneeswarm.rundir import CLOCKS_FILE, GENERATOR_COLUMNS, RunDir, safe_name, write_json

from locustfiles import clocks, state
from locustfiles.recorder import (FLUSH_INTERVAL, GEN_KEY, RECORDER_FILE, REPORT_KEY, GeneratorSampler,
                                 RequestWriter, RowBuffer)
from locustfiles.shape import StepShape
from locustfiles.steps import StepSchedule
from locustfiles.users import InferenceUser

logger = logging.getLogger(__name__)

PLAN_MESSAGE = "kneeswarm_plan"


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--kneeswarm-plan", default="", include_in_web_ui=True, help="plan TOML file (steps, ramp, hold, request body)")
    parser.add_argument("--kneeswarm-run-dir", default="", help="run directory to write; default: a new one under --kneeswarm-out at each test start")
    parser.add_argument("--kneeswarm-out", default="runs", help="where new run directories go (default: runs)")


class Recording:
    """The master's (or local runner's) recording of one test: writer, steps, generator CSVs.

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
        self.schedule = StepSchedule(plan.load.steps, plan.load.ramp, plan.load.hold, on_change=self._write_steps)
        self.writer = RequestWriter(run, self.schedule.step_starts)
        self.failures: dict[str, list] = {}  # what -> [count, last error] of writes other than parts
        self.generator_rows_lost = 0
        self.local_sampler = GeneratorSampler(lambda: env.runner.user_count) if local_buffer is not None else None
        self._flusher = gevent.spawn(self._flush_loop)
        self._sampler = gevent.spawn(self.local_sampler.run_forever) if self.local_sampler else None

    def _failed(self, what: str, e: OSError) -> None:
        entry = self.failures.setdefault(what, [0, ""])
        entry[0] += 1
        entry[1] = " ".join(str(e).split())
        logger.error("kneeswarm: could not write %s: %s", what, e)

    def _write_steps(self, log: list) -> None:
        try:
            self.run.write_steps(s.row() for s in log)
        except OSError as e:  # the next change rewrites the whole file
            self._failed("steps.csv", e)

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

    def flush(self) -> None:
        if self.local_buffer is not None:
            self.writer.add("local", self.local_buffer.take())
            self.add_generator_rows("local", self.local_sampler.take())
        self.writer.flush()  # never raises: rows it cannot write are held, or counted lost

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(FLUSH_INTERVAL)
            self.flush()

    def lost(self) -> dict[str, int]:
        """What could not be written, for meta.json["lost"] (only what is not zero)."""
        counts = {"request_rows": self.writer.rows_lost, "generator_rows": self.generator_rows_lost}
        return {k: v for k, v in counts.items() if v}

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
        return out

    def write_outcome(self, final: bool) -> None:
        """generator/clocks.json and generator/recorder.json (the conductor copies both to meta.json);
        with no conductor, meta.json itself. A write that fails here is logged: nothing is left to hold it."""
        summary = {
            "request_rows": {"received": self.writer.rows_received, "written": self.writer.rows_written,
                             "held": self.writer.rows_held, "lost": self.writer.rows_lost},
            "lost": self.lost(), "warnings": self.warnings(), "final": final,
        }
        try:
            offsets = self.worker_clocks.summary()
            if offsets:
                write_json(self.run.generator_dir / CLOCKS_FILE, offsets)
            write_json(self.run.generator_dir / RECORDER_FILE, summary)
            if self.owns_meta:
                done = self.schedule.done and len(self.schedule.log) == len(self.schedule.steps)
                self.run.update_meta(ended="completed" if done else "stopped", complete=done, finished=time.time(),
                                     worker_clocks=offsets, lost=summary["lost"], warnings=summary["warnings"])
        except OSError as e:
            logger.error("kneeswarm: could not write the recording's outcome: %s (%s)", e, summary)

    def end(self) -> None:
        """The test stopped (shape finished, or Stop pressed): flush, and say how it ended."""
        self.flush()
        self.write_outcome(final=False)

    def stop(self) -> None:
        """The recording is over (Locust quits, or a new test starts): last flush, last step closed."""
        for g in (self._flusher, self._sampler):
            if g is not None:
                g.kill(block=False)
        self.flush()
        self.writer.abandon()  # rows whose last write failed: counted lost
        self.write_outcome(final=True)
        self.schedule.finish(time.time())  # a test cut short: its last step ends now in steps.csv
        logger.info("kneeswarm: %d request rows in %s", self.writer.rows_written, self.run.path)


_recording: Recording | None = None


def _load_plan(env: Environment) -> None:
    opts = env.parsed_options
    path = getattr(opts, "kneeswarm_plan", "") if opts else ""
    overrides = {"target": env.host} if env.host else {}
    try:
        state.set_plan(load_plan(path or None, overrides))
    except PlanError as e:
        logger.error("kneeswarm: %s", e)
        raise SystemExit(2) from None
    _apply_plan(env)


def _apply_plan(env: Environment) -> None:
    plan = state.plan()
    InferenceUser.network_timeout = InferenceUser.connection_timeout = plan.request.timeout
    if not env.host:
        env.host = plan.target
    InferenceUser.host = plan.target


def _worker_label(runner: MasterRunner, client_id: str) -> str:
    try:
        return f"worker-{runner.get_worker_index(client_id)}"
    except Exception:  # older Locust or an unknown client
        return client_id


@events.init.add_listener
def _on_init(environment: Environment, **_kw: Any) -> None:
    _load_plan(environment)
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        _init_worker(environment, runner)
    elif runner is not None:
        _init_master_or_local(environment, runner)


def _init_worker(env: Environment, runner: WorkerRunner) -> None:
    buffer = RowBuffer()
    sampler = GeneratorSampler(lambda: runner.user_count)
    env.events.request.add_listener(buffer.on_request)

    def on_report(client_id: str, data: dict) -> None:
        data[REPORT_KEY] = buffer.take()
        data[GEN_KEY] = sampler.take()

    def on_plan(environment: Environment, msg: Any, **_kw: Any) -> None:
        state.set_plan(plan_from_dict(msg.data["plan"], "plan from master"))
        state.set_worker_index(int(msg.data.get("index", 0)))
        _apply_plan(environment)

    def on_ping(environment: Environment, msg: Any, **_kw: Any) -> None:
        runner.send_message(clocks.PONG, clocks.pong(msg.data or {}))

    env.events.report_to_master.add_listener(on_report)
    runner.register_message(PLAN_MESSAGE, on_plan)
    runner.register_message(clocks.PING, on_ping)
    gevent.spawn(sampler.run_forever)


def _init_master_or_local(env: Environment, runner: Any) -> None:
    is_master = isinstance(runner, MasterRunner)
    worker_clocks = clocks.WorkerClocks()
    local_buffer = None if is_master else RowBuffer()
    if local_buffer is not None:
        env.events.request.add_listener(local_buffer.on_request)

    def new_test() -> StepSchedule:
        global _recording
        if _recording is not None:
            _recording.stop()
        run, owns_meta = _run_dir(env)
        _recording = Recording(env, run, local_buffer, owns_meta, worker_clocks)
        return _recording.schedule

    if isinstance(env.shape_class, StepShape):
        env.shape_class.new_test = new_test

    def on_test_start(environment: Environment, **_kw: Any) -> None:
        if is_master:
            for client in runner.clients.all:
                idx = runner.get_worker_index(client.id) if hasattr(runner, "get_worker_index") else 0
                runner.send_message(PLAN_MESSAGE, {"plan": state.plan().to_dict(), "index": idx}, client.id)
            gevent.spawn(ping_round)  # measured before the first request is sent

    def ping_round() -> None:
        """Measure every connected worker's clock (PINGS_PER_ROUND round trips each)."""
        for _ in range(clocks.PINGS_PER_ROUND):
            for client in list(runner.clients.all):
                runner.send_message(clocks.PING, worker_clocks.request(), client.id)
            gevent.sleep(clocks.PING_SPACING)

    def ping_loop() -> None:
        while True:
            if runner.clients.all:
                ping_round()
            gevent.sleep(clocks.ROUND_PERIOD if worker_clocks.summary() else 1.0)

    def on_pong(environment: Environment, msg: Any, **_kw: Any) -> None:
        worker_clocks.answered(_worker_label(runner, msg.node_id), msg.data or {})

    if is_master:
        runner.register_message(clocks.PONG, on_pong)
        gevent.spawn(ping_loop)

    def on_spawning_complete(user_count: int, **_kw: Any) -> None:
        if _recording is not None:
            _recording.schedule.spawned(time.time())

    def on_worker_report(client_id: str, data: dict) -> None:
        if _recording is None:
            return
        worker = _worker_label(runner, client_id)
        offset = worker_clocks.offset(worker)
        _recording.writer.add(worker, data.get(REPORT_KEY), offset)
        _recording.add_generator_rows(worker, [[t - offset, *rest] for t, *rest in data.get(GEN_KEY) or []])

    def on_test_stop(environment: Environment, **_kw: Any) -> None:
        # Workers send their last report after the master's stop; quitting flushes again.
        if _recording is not None:
            _recording.end()

    def on_quitting(environment: Environment, **_kw: Any) -> None:
        if _recording is not None:
            _recording.stop()

    env.events.test_start.add_listener(on_test_start)
    env.events.spawning_complete.add_listener(on_spawning_complete)
    env.events.worker_report.add_listener(on_worker_report)
    env.events.test_stop.add_listener(on_test_stop)
    env.events.quitting.add_listener(on_quitting)


def _run_dir(env: Environment) -> tuple[RunDir, bool]:
    """The conductor names the run directory (and owns its meta.json); a bare Locust (web UI)
    makes one per test and writes plan.toml and meta.json itself."""
    opts = env.parsed_options
    given = getattr(opts, "kneeswarm_run_dir", "") if opts else ""
    if given and _recording is None:
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

