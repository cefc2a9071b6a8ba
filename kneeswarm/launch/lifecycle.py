"""What happens during one test, around the load (floor 4): the one path every launcher uses.

    open     connect to the plan's [[hosts]] and preflight them (AgentError when one cannot be monitored)
    start    start their agents and the target's /metrics scraper (plan.metrics_url, 1 Hz)
    fetch    an incremental fetch of every agent, and the parsed CSVs brought up to date for the live
             view (what arrived since the last fetch: kneeswarm.collectors.parsed.LiveParse)
    live     the step table so far (from steps.csv and requests/*.parquet) and the latest server
             metrics per host (from the end of hosts/<host>/*.csv)
    finish   scraper stopped (hosts/target/prometheus.csv), agents stopped, fetched (verified),
             parsed; returns what meta.json gets
    report   the analysis: report/summary.json, summary.md, index.html

`kneeswarm run` (the conductor, not gevent-patched) drives a ``Lifecycle`` in its own process.
Inside a Locust master everything is gevent-monkey-patched, and SSH work there would delay the
workers' heartbeats, so the master drives the same class in a child process
(``python -m kneeswarm.launch.lifecycle``) through ``LifecycleProcess``: one JSON line per command on
its stdin, one JSON line per answer on its stdout.  A child whose stdin closes (its master died)
stops its agents and exits: nothing is left running on the servers.
"""

from __future__ import annotations

import io
import json
import logging
import math
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from kneeswarm.collectors.prometheus import PrometheusScraper, write_prometheus_csv
from kneeswarm.launch.lifeline import die_with_parent
from kneeswarm.contracts.plan import Plan
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.launch.progress import Progress, steady_from
from kneeswarm.contracts.rundir import PROMETHEUS_RAW, TARGET_HOST, RunDir, WarningLog, safe_name

logger = logging.getLogger(__name__)

METRICS_INTERVAL = 1.0  # seconds between scrapes of plan.metrics_url
#: seconds between incremental fetches of the host agents during a test, whoever drives it (the
#: conductor, or the Locust plugin without one); both read it at call time, so tests patch it here
FETCH_PERIOD = 5.0
ANSWER_TIMEOUT = {"open": 120.0, "start": 120.0, "fetch": 60.0, "live": 30.0, "finish": 300.0,
                  "report": 300.0, "quit": 10.0}  # seconds the child has to answer each command
LIVE_TABLES = ("vmstat", "threads", "gpu")  # hosts/<host>/<table>.csv read for the live view

if TYPE_CHECKING:  # the live rows are the Knee tab's (kneeswarm.locustfiles.webui); the child does not load flask
    from kneeswarm.locustfiles.webui import Live, LiveClass, LiveClassStep, LiveHost, LiveKnee, LiveStep
    from kneeswarm.analysis.schema.summary import Summary


# -- the child's protocol: one JSON line each way (LifecycleProcess.call -> Child.handle) ----------
class Command(TypedDict):
    op: str  # "open", "start", "fetch", "live", "finish", "report", "quit" (ANSWER_TIMEOUT)
    id: NotRequired[int]  # the answer carries it back
    plan: NotRequired[dict[str, Any]]  # open: Plan.to_dict()
    run: NotRequired[str]  # open: the run directory
    accept_new_host_keys: NotRequired[bool]  # open


class Answer(TypedDict, total=False):
    ok: bool  # False: ``error`` says why, in one line
    id: int | None
    error: str | None  # ok False: why, in one line; report: the analysis's error, None when it ran
    facts: dict[str, Any]  # open: what the preflight found per host (meta.json hosts_preflight)
    live: Live  # fetch, live
    hosts: dict[str, Any]  # finish: meta.json hosts
    target_metrics: dict[str, Any] | None  # finish: meta.json target_metrics
    warnings: list[str]  # finish
    summary: Summary | None  # report: summary.json, None when the analysis failed
    report: str | None  # report: index.html's path, None when not written


def analyze_run(run: RunDir) -> tuple[Summary | None, str | None]:
    """(summary, None), or (None, one line saying why) when the analysis raised; never raises.
    The recorded data stays either way: `kneeswarm analyze` can be re-run on it."""
    from kneeswarm import analysis

    try:
        return analysis.analyze(run.path), None
    except Exception as e:  # noqa: BLE001 - any failure of the analysis is reported, not raised
        logger.debug("analysis of %s failed", run.path, exc_info=True)
        text = " ".join(str(e).split()) or "no message"
        return None, f"{type(e).__name__}: {text}"


class Lifecycle:
    """The host agents, the metrics scraper and the live view of one test in one run directory."""

    def __init__(self, plan: Plan, run: RunDir, accept_new_host_keys: bool = False):
        self.plan, self.run = plan, run
        self.accept_new_host_keys = accept_new_host_keys
        self.agents: Any = None
        self.scraper: PrometheusScraper | None = None
        self.warnings = WarningLog()
        self.progress = Progress(run, plan, stream=io.StringIO(), live=False)
        self.finished: dict[str, Any] | None = None

    def warn(self, text: str) -> None:
        """A problem that does not end the run: logged, and kept for meta.json["warnings"]."""
        logger.warning("%s", text)
        self.warnings.add(text)

    def all_warnings(self) -> list[str]:
        """Ours, then every host agent's (prefixed with its label)."""
        out = WarningLog()
        for w in self.warnings:
            out.add(w)
        for a in self.agents or []:
            for w in a.warnings:
                out.add(f"{a.label}: {w}")
        out.dropped += self.warnings.dropped
        return out.to_list()

    # -- the verbs -----------------------------------------------------------------------
    def open(self) -> dict[str, Any]:
        """Connect and preflight every host; AgentError (closed again) if one cannot be monitored."""
        from kneeswarm.agents import HostAgents

        self.agents = HostAgents.open(self.plan, self.run, accept_new_host_keys=self.accept_new_host_keys)
        try:
            return self.agents.preflight_all()
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start the agents (AgentError, all stopped, if one fails), then the metrics scraper."""
        from kneeswarm.agents import AgentError

        try:
            self.agents.start_all()
        except AgentError:
            self.close()
            raise
        if self.plan.metrics_url:
            host = self.metrics_host()
            if host != TARGET_HOST:
                self.warn(f"a monitored host is called {TARGET_HOST!r}: the target's metrics go to hosts/{host}/")
            headers, tls = self.metrics_scrape()
            self.scraper = PrometheusScraper(self.plan.metrics_url, self.run.raw_dir(host) / PROMETHEUS_RAW,
                                             interval=METRICS_INTERVAL, headers=headers, tls=tls)
            self.scraper.start()

    def metrics_scrape(self) -> tuple[dict[str, str], dict[str, Any]]:
        """(headers, tls) of the scrape of metrics_url: the plan's [endpoint] TLS settings (verify,
        CA bundle, client certificate), and its headers and server_name where metrics_url is the
        target's origin (Plan.metrics_headers: a secret header never goes to another server)."""
        e = self.plan.endpoint
        tls: dict[str, Any] = {"verify": bool(e.verify), "cafile": e.ca_bundle, "cert": e.client_cert, "key": e.client_key}
        if self.plan.metrics_origin_is_target():
            tls["server_name"] = e.server_name
        headers: dict[str, str] = {}
        try:
            headers = self.plan.metrics_headers()
        except ValueError as err:  # an unset variable: the health check said it before; said again here
            self.warn(f"metrics {self.plan.metrics_url}: {err}")
        return headers, tls

    def fetch(self, parse: bool = False) -> None:
        """An incremental fetch of every agent (and, for the live view, their parsed CSVs
        rewritten from what arrived); a failure is a warning, the next fetch retries."""
        if self.agents is None or self.finished is not None:
            return
        try:
            self.agents.fetch_all()
        except Exception as e:  # noqa: BLE001 - an agent must never end the run after start
            self.warn(f"incremental fetch failed: {e}")
        if parse:
            for a in self.agents:
                try:
                    a.write_parsed(live=True)
                except Exception as e:  # noqa: BLE001 - the live view only; finish parses again
                    logger.debug("%s: live parse failed: %s", a.label, e)

    def finish(self) -> dict[str, Any]:
        """Stop and collect everything; never raises. Returns {"hosts", "target_metrics"} for meta.json."""
        if self.finished is None:
            target_metrics = self._stop_metrics()
            hosts = self._finish_agents()
            self.finished = {"hosts": hosts, "target_metrics": target_metrics}
        return self.finished

    def close(self) -> None:
        if self.agents is not None:
            self.agents.close_all()

    # -- inside finish -------------------------------------------------------------------
    def _finish_agents(self) -> dict[str, Any]:
        if self.agents is None:
            return {}
        try:
            return self.agents.finish_all()
        except Exception as e:  # noqa: BLE001 - the recorded data must still be reported
            self.warn(f"stopping the host agents failed: {e}")
            try:
                return self.agents.meta()
            except Exception as e2:  # noqa: BLE001
                self.warn(f"host agents' meta unavailable: {e2}")
                return {}
        finally:
            self.close()

    def metrics_host(self) -> str:
        """hosts/<name>/ for the target's metrics: TARGET_HOST unless a monitored host is called that."""
        taken = {safe_name(h.label) for h in self.plan.hosts}
        name = TARGET_HOST
        while name in taken:
            name += "-metrics"
        return name

    def _stop_metrics(self) -> dict[str, Any] | None:
        """Stop the scraper and write hosts/target/prometheus.csv; never raises."""
        if self.scraper is None:
            return None
        stats = self.scraper.stop()
        self.scraper = None
        host, url = self.metrics_host(), self.plan.metrics_url
        out: dict[str, Any] = {**stats, "host": host, "clock": "master"}
        try:
            out["parse"] = write_prometheus_csv(self.run.raw_dir(host) / PROMETHEUS_RAW,
                                                self.run.host_dir(host) / "prometheus.csv")
        except Exception as e:  # noqa: BLE001 - a bad scrape must not end the run; the raw file stays
            self.warn(f"metrics {url}: parse failed: {e}")
        if stats["failed"]:
            self.warn(f"metrics {url}: {stats['failed']} of {stats['scrapes']} scrapes failed "
                      f"(last: {stats['last_error']})")
        if stats["scrapes"] and not stats["ok"]:
            self.warn(f"metrics {url}: no scrape succeeded")
        return out

    # -- the live view -------------------------------------------------------------------
    def live(self) -> Live:
        """{"steps": [row per step so far], "hosts": [latest server metrics per host]}; never raises."""
        try:
            steps = live_steps(self.run, self.progress, self.plan)
            view: Live = {"steps": steps, "hosts": live_hosts(self.run), "knee": live_knee(self.run, steps, self.plan)}
            if self.plan.request.classes:
                view["classes"] = live_classes(self.run, self.progress, self.plan)
                view["class_steps"] = live_class_steps(self.run, self.progress, self.plan)
            return view
        except Exception as e:  # noqa: BLE001 - a display must never end a run
            logger.debug("live view: %s", e)
            return {"steps": [], "hosts": [], "knee": {}}


def _num(x: Any, digits: int = 1) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return round(f, digits) if math.isfinite(f) else None


def live_steps(run: RunDir, progress: Progress, plan: Plan) -> list[LiveStep]:
    """One row per step so far: users, requests, QPS and P50/P99 of its steady rows, errors."""
    progress.poll(force=True)  # reads the new request parts
    why = _search_whys(run) if plan.load.mode == "search" else {}
    out: list[LiveStep] = []
    for _, st in run.read_steps().iterrows():
        i = int(st["index"])
        so_far = progress._steps.get(i)  # noqa: SLF001 - Progress's own accumulator of rows per step
        t_from = steady_from(st, plan.load)
        requests, errors, qps, p99 = so_far.figures(t_from) if so_far else (0, 0, None, None)
        p50 = so_far.p50(t_from) if so_far else None
        state = "done" if st["t_end"] == st["t_end"] else ("steady" if st["t_steady"] == st["t_steady"] else "ramp")
        out.append({"name": f"step {i}", "step": i, "users": int(st["users"]), "state": state,
                    "requests": requests, "qps": _num(qps), "p50_ms": _num(p50), "p99_ms": _num(p99),
                    "errors": errors, "valid": "so far" if requests >= plan.analysis.min_requests else "too few",
                    "why": why.get(i, "")})
    return out


def live_classes(run: RunDir, progress: Progress, plan: Plan) -> list[LiveClass]:
    """A traffic mix: one row per class of the plan, its rows so far (every step) and their share
    against its weight's, and the current step's (the last begun) requests, QPS and P99 of its
    steady rows, errors; the rows as read by ``progress`` (live_steps polled it just before)."""
    weights = {str(c.get("name")): float(c.get("weight", 1.0)) for c in plan.request.classes or []}
    total_weight = sum(weights.values()) or 1.0
    total_rows = sum(progress.class_rows.values())
    steps = run.read_steps()
    now: dict[str, tuple[int, int, float | None, float | None]] = {}
    step: int | None = None
    users: float | None = None
    if len(steps):
        st = steps.iloc[-1]
        step, users = int(st["index"]), float(st["users"])
        so_far = progress._steps.get(step)  # noqa: SLF001 - Progress's own accumulator of rows per step
        now = so_far.by_class(steady_from(st, plan.load)) if so_far else {}
    out: list[LiveClass] = []
    for name in [*weights, *sorted(set(progress.class_rows) - set(weights))]:
        n = progress.class_rows.get(name, 0)
        step_n, errors, qps, p99 = now.get(name, (0, 0, None, None))
        out.append({"name": name, "class": name, "weight_pct": _num(100.0 * weights.get(name, 0.0) / total_weight),
                    "requests": n, "share_pct": _num(100.0 * n / total_rows) if total_rows else None,
                    "step": step, "users": int(users) if users is not None and users.is_integer() else users,
                    "step_requests": step_n, "qps": _num(qps), "p99_ms": _num(p99), "errors": errors,
                    "knee": "", "latency_knee": ""})
    return out


def live_class_steps(run: RunDir, progress: Progress, plan: Plan) -> list[LiveClassStep]:
    """A traffic mix: each class's QPS and P99 at each step so far (the Knee tab's chart draws a
    P99 line per class), from the rows ``progress`` read."""
    out: list[LiveClassStep] = []
    for _, st in run.read_steps().iterrows():
        so_far = progress._steps.get(int(st["index"]))  # noqa: SLF001 - Progress's own accumulator of rows per step
        users = float(st["users"])
        for name, (_n, _errors, qps, p99) in (so_far.by_class(steady_from(st, plan.load)) if so_far else {}).items():
            out.append({"class": name, "step": int(st["index"]), "users": int(users) if users.is_integer() else users,
                        "qps": _num(qps), "p99_ms": _num(p99)})
    return out


def live_knee(run: RunDir, steps: list[LiveStep], plan: Plan) -> LiveKnee:
    """The knee as far as it is known during the run, for the Knee tab's chart: mode = "search",
    the bracket the master has decided (generator/search.json); a grid, the knee detector
    (kneeswarm.analysis.models.knee.find_knee) on the steps done so far, once three are; {} before."""
    if plan.load.mode == "search":
        bracket = _search_doc(run).get("knee_bracket")
        if isinstance(bracket, list) and len(bracket) == 2 and bracket[0] is not None:
            return {"bracket": bracket, "how": "search: knee bracket so far"}
        return {}
    done = sorted((r["users"], r["qps"]) for r in steps if r["state"] == "done" and r["qps"] is not None)
    if len(done) < 3:
        return {}
    from kneeswarm.analysis.models.knee import find_knee

    knee = find_knee([u for u, _ in done], [q for _, q in done])
    return {"users": knee.get("users") or 0.0, "how": f"{knee['method']} on the {len(done)} steps done"} \
        if knee.get("users") is not None else {}


def _search_doc(run: RunDir) -> dict[str, Any]:
    """generator/search.json as the master last wrote it ({} when not there or unreadable)."""
    import json

    from kneeswarm.contracts.rundir import SEARCH_FILE

    try:
        doc = json.loads((run.generator_dir / SEARCH_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _search_whys(run: RunDir) -> dict[int, str]:
    """mode = "search": why each probe was chosen, as the master decided it (generator/search.json)."""
    try:
        return {int(r["index"]): str(r.get("why") or "") for r in _search_doc(run).get("probes") or []}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def live_hosts(run: RunDir) -> list[LiveHost]:
    """The latest parsed sample of each monitored host: CPU us/sy, cs/s, run queue, busiest thread, GPU."""
    out: list[LiveHost] = []
    for host in run.hosts():
        row: LiveHost = {"name": host, "host": host}
        vm = _last_rows(run, host, "vmstat")
        if vm is not None:
            last = vm.iloc[-1]
            row.update({"t": _num(last["t"], 1), "cpu_us": _num(last["us"]), "cpu_sy": _num(last["sy"]),
                        "cs_s": _num(last["cs"], 0), "run_queue": _num(last["r"], 0)})
        th = _last_rows(run, host, "threads")
        if th is not None:
            latest = th[th["t"] == th["t"].max()]
            top = latest.sort_values("cpu_pct", ascending=False).iloc[0]
            row["busiest_thread"] = f"{top['name']} {float(top['cpu_pct']):.0f}%"
        gpu = _last_rows(run, host, "gpu")
        if gpu is not None:
            row["gpu_sm_pct"] = _num(gpu[gpu["t"] == gpu["t"].max()]["sm_pct"].mean())
        if len(row) > 2:
            out.append(row)
    return out


def _last_rows(run: RunDir, host: str, table: str) -> Any:
    """The rows of the table's latest sample (read from the CSV's end: the file grows all run)."""
    df = run.read_host_csv_latest(host, table)
    return None if df is None or df.empty else df


# -- the child process: `python -m kneeswarm.launch.lifecycle` ---------------------------------------
class Child:
    """The child's side: one Lifecycle, commands in, answers out."""

    def __init__(self) -> None:
        self.life: Lifecycle | None = None

    def handle(self, msg: Command) -> Answer:
        op = msg.get("op")
        if op == "open":
            run = RunDir(msg["run"])
            self.life = Lifecycle(plan_from_dict(msg["plan"], "plan from the master"), run,
                                  bool(msg.get("accept_new_host_keys")))
            return {"facts": self.life.open()}
        life = self.life
        if life is None:
            raise RuntimeError(f"{op}: no test opened")
        if op == "start":
            life.start()
            return {}
        if op == "fetch":
            life.fetch(parse=True)
            return {"live": life.live()}
        if op == "live":
            return {"live": life.live()}
        if op == "finish":
            done = life.finish()
            return {"hosts": done["hosts"], "target_metrics": done["target_metrics"], "warnings": life.all_warnings()}
        if op == "report":
            summary, error = analyze_run(life.run)
            report = life.run.report_path
            return {"summary": summary, "error": error, "report": str(report) if report.is_file() else None}
        raise RuntimeError(f"unknown command {op!r}")


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def child_main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="kneeswarm lifecycle: %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _terminated)  # the master died (PR_SET_PDEATHSIG): still clean up
    child = Child()
    out = sys.stdout
    sys.stdout = sys.stderr  # only answers go to the pipe
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("op") == "quit":
                break
            try:
                answer = {"ok": True, **child.handle(msg)}
            except Exception as e:  # noqa: BLE001 - every failure is an answer; the master decides
                answer = {"ok": False, "error": " ".join(str(e).split()) or type(e).__name__}
            out.write(json.dumps({**answer, "id": msg.get("id")}, default=str) + "\n")
            out.flush()
    finally:
        if child.life is not None:  # stdin closed (the master is gone), quit, or SIGTERM: leave nothing running
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            child.life.finish()
    return 0


class LifecycleError(RuntimeError):
    """The child answered a command with an error, or did not answer in time; str() is one line."""


class LifecycleProcess:
    """The master's handle on a child ``python -m kneeswarm.launch.lifecycle`` (one per test).

    Works under gevent's monkey-patching (the pipe reads then yield to other greenlets)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kneeswarm.launch.lifecycle"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=None, preexec_fn=die_with_parent())
        if self.proc.stdin is None or self.proc.stdout is None:  # Popen makes both with PIPE
            raise LifecycleError("the lifecycle process started without pipes")
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.lock = threading.Lock()
        self.seq = 0

    def call(self, op: str, **args: Any) -> Answer:
        """Send one command, return its answer; LifecycleError if it failed or did not come in time.
        Answers carry their command's id: one left unread by a caller that was interrupted (a killed
        greenlet) is skipped, never taken for another command's."""
        with self.lock:
            if self.proc.poll() is not None:
                raise LifecycleError(f"{op}: the lifecycle process has exited ({self.proc.returncode})")
            self.seq += 1
            self.stdin.write((json.dumps({"op": op, "id": self.seq, **args}) + "\n").encode())
            self.stdin.flush()
            deadline = time.monotonic() + ANSWER_TIMEOUT.get(op, 60.0)
            answer: Answer = {}
            while answer.get("id") != self.seq:
                ready, _, _ = select.select([self.stdout], [], [], max(0.0, deadline - time.monotonic()))
                line = self.stdout.readline() if ready else b""
                if not line:
                    raise LifecycleError(f"{op}: no answer from the lifecycle process")
                answer = json.loads(line)
        if not answer.get("ok"):
            raise LifecycleError(answer.get("error") or f"{op} failed")
        return answer

    def close(self) -> None:
        """Ask the child to quit (it finishes its agents first), then make sure it is gone."""
        try:
            with self.lock:
                self.stdin.write(b'{"op": "quit"}\n')
                self.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=ANSWER_TIMEOUT["finish"])
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def open_in_child(plan: Plan, run: RunDir, accept_new_host_keys: bool = False) -> tuple[LifecycleProcess, dict]:
    """A child with its test opened (preflight facts returned); LifecycleError, child gone, if not."""
    child = LifecycleProcess()
    try:
        facts = child.call("open", plan=plan.to_dict(), run=str(run.path), accept_new_host_keys=accept_new_host_keys)
    except Exception:
        child.close()
        raise
    return child, facts["facts"]


if __name__ == "__main__":
    sys.exit(child_main())
