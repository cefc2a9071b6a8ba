"""The master's (or a local runner's) recording of one test: the request writer, steps.csv, the
generator CSVs, the step schedule it drives, and the outcome it writes (meta.json's ``ended`` and
generator/recorder.json).  Made by the plugin's MasterListeners for each test; free of Locust's
event wiring (that is the plugin's)."""

from __future__ import annotations

import csv
import logging
import time
from typing import Any, Callable

import gevent
from locust.env import Environment
from locust.runners import STATE_MISSING, WORKER_REPORT_INTERVAL, MasterRunner

from kneeswarm.contracts.outcome import EXIT_FAILED, Ended
from kneeswarm.contracts.plan import Plan
from kneeswarm.contracts.rundir import CLOCKS_FILE, GENERATOR_COLUMNS, META_FILE, STEPS_FILE, RunDir, safe_name, write_json
from kneeswarm.locustfiles import clocks, state
from kneeswarm.locustfiles.recorder import FLUSH_INTERVAL, RECORDER_FILE, GeneratorSampler, RequestWriter, RowBuffer
from kneeswarm.locustfiles.steady import AutoHold
from kneeswarm.locustfiles.steps import DRAIN_FACTOR, DRAIN_MIN_S, StepSchedule
from kneeswarm.locustfiles.watermark import IN_FLIGHT, LOCAL, Horizon

logger = logging.getLogger(__name__)

#: mode = "search": makes the driver the step schedule asks for each next probe, fed the rows as they
#: arrive and judging them up to ``horizon(now)`` (the plugin's, from kneeswarm.launch.search)
SearchFactory = Callable[[RunDir, Plan, Callable[[float], float]], Any]



AUTO_HOLD_MARGIN_S = 1.0  # hold = "auto": a row may arrive this much later than its report interval and flush


#: how far a worker's rows trail the master where it sends no watermark (watermark.Horizon's fallback)
ROW_LAG_S = WORKER_REPORT_INTERVAL + FLUSH_INTERVAL + AUTO_HOLD_MARGIN_S


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
                 worker_clocks: clocks.WorkerClocks, make_search: SearchFactory | None = None):
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
        self.search = make_search(run, plan, self.horizon) if make_search else None  # the steps chosen as the run goes
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
        ``workers_before``): meta.json ``workers_lost`` (read by kneeswarm.analysis.measure.workers, which flags
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


def worker_name(runner: MasterRunner, client_id: str) -> str:
    """The one name of a worker in the run directory (rows, generator/, clocks)."""
    return f"worker-{runner.get_worker_index(client_id)}"
