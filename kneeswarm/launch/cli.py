"""kneeswarm: find where an inference service stops scaling, and why.

    kneeswarm run [PLAN.toml] [flags]   stepped load + collectors + report
    kneeswarm demo                      the bundled target, a default plan, a report in ~2 minutes
    kneeswarm target [flags]            the bundled demo inference server
    kneeswarm analyze RUN_DIR           (re)write the report of a run directory (or a repeat's merged result)
    kneeswarm merge RUN_DIR...          merge runs of one plan into one repeated result (as run --repeat does)
    kneeswarm compare BASE NEW          did NEW regress against BASE?
    kneeswarm history RUNS_ROOT|RUN_DIR...   index the runs, trend report, drift test (kneeswarm.analysis.runs.history)
    kneeswarm worker --master HOST[:PORT] [--processes N]   a worker for a master on another machine

Exit codes (of `run`, `demo` and `analyze`): 0 the load completed and the report is written;
1 the load did not complete, no request succeeded, or the analysis failed (the reason on stderr,
one line); 2 bad input (plan, flags, target, host, process); 3 with --fail-on-sla: the SLA failed
(1 and 2 take precedence); 130 interrupted.  With --repeat N (or [load] repeat): 0 only when every
repetition completed; 1 when one did not (the series stops there), 130 when interrupted (a Ctrl-C
between runs ends the series; the runs so far are kept and merged), 3 with --fail-on-sla when the SLA
was missed in any repetition (the merged result says in how many).  `compare`: 0, 4 a regression with
--fail-on-regression, 2 bad input (not run directories, an unreadable plan.toml, no step valid in
both), 130 interrupted.  `history`: 0, 5 a figure drifted worse with --fail-on-drift
(kneeswarm.contracts.outcome.EXIT_DRIFT), 1 the report could not be written, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `kneeswarm --help` loads no analysis
    from kneeswarm.analysis.schema.summary import Summary

from kneeswarm.launch.lifeline import die_with_parent
from kneeswarm.contracts.outcome import (EXIT_BAD_INPUT, EXIT_DRIFT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REGRESSION, EXIT_SLA_FAILED, Ended)

logger = logging.getLogger(__name__)

DEMO_STEPS = [1, 2, 4, 8, 16]
DEMO_TARGET_ARGS = ["--mode", "onnx", "--request-threads", "4"]
DEMO_HOLD, DEMO_RAMP, DEMO_SETTLE = 16.0, 2.0, 2.0
DEMO_SOAK_USERS = 4
DEMO_SEARCH_MAX = 64  # demo --search: users at most
TARGET_START_TIMEOUT = 60.0


def _steps(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps must be comma-separated integers, got {text!r}") from None


def _hold(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'--hold must be seconds or "auto", got {text!r}') from None


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", nargs="?", help="plan TOML file; flags below override it")
    p.add_argument("--target", help="base URL of the inference server, e.g. http://127.0.0.1:8000")
    p.add_argument("--protocol", help="request protocol: kserve, openai, torchserve, tfserving or http; over gRPC "
                   "(target grpc://host:port): kserve-grpc, triton-stream, torchserve-grpc")
    p.add_argument("--model", help="model name in the request path")
    p.add_argument("--steps", type=_steps, help="user counts, e.g. 1,2,4,8,16,32")
    p.add_argument("--hold", type=_hold, help='seconds each step is held after its ramp, or "auto": until steady and '
                   "its QPS and P99 are known ([load] ci, min_hold, max_hold)")
    p.add_argument("--ramp", type=float, help="seconds to ramp from one step to the next")
    p.add_argument("--settle", type=float, help="seconds after each ramp left out of the step's statistics")
    _add_repeat_flags(p)
    p.add_argument("--workers", type=int, help="Locust worker processes on this machine (default: number of cores)")
    p.add_argument("--expect-workers", type=int, metavar="N",
                   help="workers the master waits for in all, those started elsewhere with `kneeswarm worker` included")
    p.add_argument("--expect-workers-wait", type=float, metavar="SECONDS",
                   help="how long the master waits for them (default 60)")
    p.add_argument("--master-bind-host", default="127.0.0.1", metavar="ADDR",
                   help="address the master's port listens on (default 127.0.0.1; that channel is unauthenticated: "
                        "use a private network or an SSH tunnel)")
    p.add_argument("--master-port", type=int, metavar="PORT", help="the master's port (default: a free one)")
    p.add_argument("--worker-hosts", metavar="USER@HOST[:SSHPORT][/N],...",
                   help="start N worker processes (default 1) on each load machine over SSH; they reach the master "
                        "on --master-bind-host")
    p.add_argument("--worker-command", default="kneeswarm", help="kneeswarm on the worker hosts (default: kneeswarm)")
    p.add_argument("--worker-key-file", help="SSH key for --worker-hosts (default: ssh-agent / ~/.ssh)")
    p.add_argument("--worker-known-hosts", help="known_hosts for --worker-hosts (default ~/.ssh/known_hosts)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, help="PID of the server process to monitor on this machine")
    who.add_argument("--process", help="regex on the command line of the server process to monitor")
    p.add_argument("--metrics-url", help="Prometheus /metrics of the target, scraped at 1 Hz")
    p.add_argument("--out", default="runs", help="where run directories go (default: runs)")
    p.add_argument("--name", help="run name (part of the run directory's name)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="record the SSH host key of a host seen for the first time (never a changed one)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the report path")
    _add_export_flags(p)


def _add_repeat_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeat", type=int, metavar="N", help="run the plan N times against the same server, a run "
                   "directory each, and merge them: the knee of each run and its spread, each step's interval "
                   "between the runs beside each run's own, each finding counted over the runs ([load] repeat)")
    p.add_argument("--cooldown", type=float, metavar="SECONDS",
                   help="--repeat: seconds between two runs ([load] cooldown, default 5)")


def _add_export_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--otel", action="store_true", help="Locust's OpenTelemetry export (OTEL_* environment) with "
                   "kneeswarm's figures; the final ones, findings included, pushed after the analysis")
    p.add_argument("--prometheus", default="", metavar="[HOST:]PORT",
                   help="kneeswarm's live figures for Prometheus on the master (loopback unless HOST is given)")
    p.add_argument("--prometheus-linger", type=float, default=0.0, metavar="SECONDS",
                   help="after the analysis, serve the final figures and findings on --prometheus this long")


def _export(args: argparse.Namespace) -> Any:
    from kneeswarm.launch.conductor import ConductorError
    from kneeswarm.launch.export import ExportError, ExportOptions

    try:
        return ExportOptions(args.otel, args.prometheus, args.prometheus_linger).check()
    except ExportError as e:
        raise ConductorError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kneeswarm", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_flags(sub.add_parser("run", help="run a stepped load test and write its report"))
    demo = sub.add_parser("demo", help="start the bundled target and run a ~2 minute stepped test against it")
    demo.add_argument("--out", default="runs", help="where run directories go (default: runs)")
    demo.add_argument("--hold", type=_hold, default=DEMO_HOLD, help=f"seconds per step, or auto (default {DEMO_HOLD:g})")
    demo.add_argument("--steps", type=_steps, default=DEMO_STEPS, help="user counts (default 1,2,4,8,16)")
    demo.add_argument("--search", action="store_true",
                      help='[load] mode = "search": probes chosen as the run goes, from 1 user to --max, '
                           'hold = "auto" (the knee located, not guessed from a grid)')
    demo.add_argument("--max", type=int, default=DEMO_SEARCH_MAX, help=f"--search: never beyond this many users (default {DEMO_SEARCH_MAX})")
    demo.add_argument("--min-hold", type=float, help="hold = auto: seconds each step is held at least")
    demo.add_argument("--max-hold", type=float, help="hold = auto: seconds each step is held at most")
    demo.add_argument("--target-args", metavar="FLAGS", help="the demo target's flags, e.g. --target-args='--mode knee "
                      "--slots 11' (default: ONNX Runtime, 4 request threads; see `kneeswarm target --help`)")
    _add_export_flags(demo)
    _add_repeat_flags(demo)
    soak = demo.add_argument_group("soak (instead of the steps: one load held, to catch leaks and drift)")
    soak.add_argument("--soak", type=float, metavar="SECONDS", help="hold --users users this long ([load] mode = \"soak\")")
    soak.add_argument("--users", type=int, default=DEMO_SOAK_USERS, help=f"users held by --soak (default {DEMO_SOAK_USERS})")
    soak.add_argument("--window", type=float, help="seconds per point of the soak's series (default 60)")
    sub.add_parser("target", help="the bundled demo inference server (see `kneeswarm target --help`)", add_help=False)
    wk = sub.add_parser("worker", help="a Locust worker for a master on another machine (kneeswarm's locustfile)")
    wk.add_argument("--master", metavar="HOST[:PORT]", help="the master (`kneeswarm run --expect-workers`)")
    wk.add_argument("--versions", action="store_true", help="print this machine's kneeswarm and Locust versions (JSON)")
    wk.add_argument("--processes", type=int, metavar="N", help="worker processes to fork (Locust's --processes)")
    an = sub.add_parser("analyze", help="(re)write report/ of a run directory, or a repeat's merged result")
    an.add_argument("run_dir", help="a run directory, or the <stamp>-<name>-repeat folder of `run --repeat`")
    me = sub.add_parser("merge", help="merge run directories of one plan into one repeated result")
    me.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the runs, in the order they ran")
    me.add_argument("--out", help="the merged result's folder (default: <stamp>-<name>-repeat beside the first run)")
    me.add_argument("--name", help="its name (default: the first run's plan name)")
    me.add_argument("--planned", type=int, metavar="N", help="runs the series asked for, when fewer ran (default: as many as given)")
    me.add_argument("-q", "--quiet", action="store_true", help="print only the report path")
    _add_gates(sub)
    _add_history(sub)
    return parser


def _add_history(sub: Any) -> None:
    """`history` (kneeswarm.analysis.runs.history; not imported here: the analysis package loads pandas)."""
    hi = sub.add_parser("history", help="index runs, trend report and drift test over them")
    hi.add_argument("paths", nargs="+", metavar="RUNS_ROOT|RUN_DIR", help="run directories or folders holding them")
    hi.add_argument("--index", help="the SQLite index (default: kneeswarm-history.sqlite next to the runs)")
    hi.add_argument("--out", help="where history.md/.html/.json go (default: history/ beside the index)")
    hi.add_argument("--since", help="only runs started at or after this ISO date or time (UTC unless it says)")
    hi.add_argument("--plan", help="only runs of this plan name")
    hi.add_argument("--last", type=int, help="runs per drift test (default: kneeswarm.analysis.runs.history.DRIFT_WINDOW, 20)")
    hi.add_argument("--figures", metavar="A,B", help="figures to trend: p50_ms, p95_ms, p99_ms, p999_ms, peak_qps (default all)")
    hi.add_argument("--fail-on-drift", action="store_true",
                    help=f"exit {EXIT_DRIFT} when a figure drifted worse")
    hi.add_argument("-q", "--quiet", action="store_true", help="print only the report path")


def _add_gates(sub: Any) -> None:
    """--fail-on-sla on run, demo and analyze; --sla-* overrides on run and demo; `compare`."""
    for name in ("run", "demo", "analyze"):
        sub.choices[name].add_argument("--fail-on-sla", action="store_true",
                                       help=f"exit {EXIT_SLA_FAILED} when the plan's [sla] is not met")
    for name in ("run", "demo"):
        sub.choices[name].add_argument("--sla-p99-ms", type=float, help="[sla] p99_ms: the P99 limit, ms")
        sub.choices[name].add_argument("--sla-error-rate", type=float, help="[sla] error_rate: the error limit, 0..1")
    co = sub.add_parser("compare", help="compare two runs: per-step QPS/P99 changes, verdict",
                        description="Compare two kneeswarm runs: per-step QPS and P99 changes with bootstrap "
                                    "confidence intervals, and a verdict.  A repeated run (`run --repeat`'s "
                                    "<stamp>-<name>-repeat folder) is one point per step, the mean of its runs, "
                                    "whose interval is how far its runs moved between each other.")
    co.add_argument("base", help="the base run directory, or a repeated run's folder")
    co.add_argument("new", help="the new run directory, or a repeated run's folder")
    co.add_argument("--fail-on-regression", action="store_true",
                    help=f"exit {EXIT_REGRESSION} when the verdict is 'regressed'")
    co.add_argument("--out", help="folder for compare.json, compare.md, compare.html, junit.xml "
                                  "(default: NEW/report/compare)")
    co.add_argument("-q", "--quiet", action="store_true", help="do not print the markdown summary")


def _gate_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {"sla.p99_ms": args.sla_p99_ms, "sla.error_rate": args.sla_error_rate}


def _require_sla(has_sla: bool, args: argparse.Namespace) -> None:
    """--fail-on-sla without an SLA is a mistake of the pipeline, said before any load is sent."""
    from kneeswarm.contracts.plan import PlanError

    if args.fail_on_sla and not has_sla:
        raise PlanError("--fail-on-sla needs an SLA: an [sla] table in the plan, or --sla-p99-ms / --sla-error-rate")


def sla_gate(code: int, run: Any, summary: Summary | None, fail_on_sla: bool) -> int:
    """The exit code after the SLA gate: ``code`` when it is not 0 (interrupted, incomplete) or
    without --fail-on-sla; 2 when the run has no SLA; 3 when the SLA failed (one line on stderr)."""
    if code != EXIT_OK or not fail_on_sla:
        return code
    sla = (summary or {}).get("sla") or {}
    if not sla.get("set"):
        print(f"kneeswarm: error: --fail-on-sla, but {run.plan_path} has no [sla] table", file=sys.stderr)
        return EXIT_BAD_INPUT
    if sla.get("passed") is not True:
        print(f"kneeswarm: SLA failed: {sla.get('text')} ({run.junit_path})", file=sys.stderr)
        return EXIT_SLA_FAILED
    return code


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "target": args.target, "protocol": args.protocol, "name": args.name, "metrics_url": args.metrics_url,
        "request.model": args.model, "load.steps": args.steps, "load.hold": args.hold,
        "load.ramp": args.ramp, "load.settle": args.settle, "load.workers": args.workers,
        "load.repeat": args.repeat, "load.cooldown": args.cooldown,
    }


def verdict(run: Any, summary: Summary | None, analysis_error: str | None,
            ended: str | None) -> tuple[int, str | None]:
    """The exit code of a run or an analysis, and the one-line reason when it is not 0.

    interrupted -> 130; the analysis failed, the load did not complete, or no request
    succeeded (counted from the request rows themselves) -> 1; otherwise 0."""
    if ended == Ended.INTERRUPTED:
        return EXIT_INTERRUPTED, None
    if analysis_error is not None or summary is None:
        return EXIT_FAILED, f"analysis failed: {analysis_error or 'no summary'}"
    if not summary.get("complete"):
        return EXIT_FAILED, _incomplete(summary)
    requests, ok, errors = request_outcomes(run)
    if not ok:
        by = ", ".join(f"{c} {n}" for c, n in sorted(errors.items(), key=lambda kv: -kv[1]))
        what = f"{requests} requests, all failed" + (f": {by}" if by else "") if requests else "no request was sent"
        return EXIT_FAILED, f"no request succeeded ({what})"
    return EXIT_OK, None


def _incomplete(summary: Summary) -> str:
    ended = summary.get("ended")
    if ended != Ended.COMPLETED:
        return f"the load did not complete (ended: {ended or 'unknown'})"
    lost = ", ".join(f"{what} {n}" for what, n in sorted((summary.get("lost") or {}).items()))
    why = f"lost: {lost}" if lost else "see the report's warnings"
    return f"the load completed but the run is incomplete ({why})"


def request_outcomes(run: Any) -> tuple[int, int, dict[str, int]]:
    """(requests, successes, {error category: count}) from the run's request parts (an
    unreadable part is left out here; the analysis reports it)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    requests, ok, errors = 0, 0, dict[str, int]()
    for part in run.request_parts():
        try:
            table = pq.read_table(part, columns=["ok", "error"])
        except Exception:  # noqa: BLE001 - a torn part: the analysis counts it
            continue
        requests += table.num_rows
        ok += int(pc.sum(table.column("ok")).as_py() or 0)
        for item in pc.value_counts(table.column("error").drop_null()).to_pylist():
            errors[item["values"]] = errors.get(item["values"], 0) + int(item["counts"])
    return requests, ok, errors


def _report(run: Any, summary: Summary | None, analysis_error: str | None, ended: str | None,
            quiet: bool) -> int:
    """Print summary.md (unless quiet) and the report's path when it was written; the reason of a
    non-zero exit goes to stderr, one line."""
    report = run.report_path
    if summary is not None:
        md = run.summary_md_path
        if not quiet and md.is_file():
            print(md.read_text())
        if report.is_file():
            print(f"report: {report}")
    code, reason = verdict(run, summary, analysis_error, ended)
    if reason:
        print(f"kneeswarm: error: {reason} ({run.path})", file=sys.stderr, flush=True)
    return code


def _print_result(result: Any, quiet: bool) -> int:
    from kneeswarm.launch.conductor import RunResult

    assert isinstance(result, RunResult)
    return _report(result.run, result.summary, result.analysis_error, result.ended, quiet)


def _distribution(args: argparse.Namespace) -> Any:
    from kneeswarm.launch.conductor import WORKER_WAIT, ConductorError, Distribution

    remote = None
    if args.worker_hosts:
        from kneeswarm.launch.remote_workers import RemoteWorkers, WorkerHostsError, parse_worker_hosts

        try:
            hosts = parse_worker_hosts(args.worker_hosts)
        except WorkerHostsError as e:
            raise ConductorError(str(e)) from None
        remote = RemoteWorkers(hosts, args.worker_command, args.worker_key_file, args.worker_known_hosts,
                               args.accept_new_host_keys)
    elsewhere = args.expect_workers or remote is not None
    local = args.workers if args.workers is not None and (args.workers > 0 or elsewhere) else None
    if local is None and remote is not None:
        local = 0  # the load machines are the workers
    return Distribution(local_workers=local, expect_workers=args.expect_workers, bind_host=args.master_bind_host,
                        port=args.master_port, wait=args.expect_workers_wait or WORKER_WAIT, remote=remote)


def cmd_run(args: argparse.Namespace) -> int:
    from kneeswarm.launch.conductor import Conductor, default_hosts
    from kneeswarm.contracts.planfile import load_plan

    plan = load_plan(args.plan, {**_overrides(args), **_gate_overrides(args)})
    _require_sla(plan.sla.is_set(), args)
    plan.hosts = default_hosts(plan, args.pid, args.process)
    if plan.load.shapes:
        return run_shapes(plan, args)
    if plan.load.repeat > 1:
        from kneeswarm.launch.repeat import run_repeat

        return run_repeat(plan, args.out, lambda p: Conductor(
            p, args.out, accept_new_host_keys=args.accept_new_host_keys, quiet=args.quiet, dist=_distribution(args),
            export=_export(args)).run(), lambda r: _print_result(r, args.quiet), args.fail_on_sla, args.quiet)
    result = Conductor(plan, args.out, accept_new_host_keys=args.accept_new_host_keys, quiet=args.quiet,
                       dist=_distribution(args), export=_export(args)).run()
    return sla_gate(_print_result(result, args.quiet), result.run, result.summary, args.fail_on_sla)


def run_shapes(plan: Any, args: argparse.Namespace) -> int:
    """``[load] shapes`` (knees move with lengths): the step plan once per [input, output] shape, one run directory
    each, then the sweep's Pareto report (kneeswarm.analysis.runs.shapes) beside them; the first failing exit code
    wins, and an interrupted shape ends the sweep."""
    import copy
    import datetime as dt

    from pathlib import Path

    from kneeswarm.analysis.runs.shapes import write_sweep
    from kneeswarm.launch.conductor import Conductor
    from kneeswarm.contracts.rundir import REPORT_HTML, safe_name

    runs, code = [], 0
    for shape in plan.load.shapes:
        p = copy.deepcopy(plan)
        p.name, p.load.shapes = f"{plan.name}-in{shape[0]}-out{shape[1]}", None
        p.request.prompt_tokens, p.request.max_tokens, p.request.ignore_eos = shape[0], shape[1], True
        result = Conductor(p, args.out, accept_new_host_keys=args.accept_new_host_keys, quiet=args.quiet,
                           dist=_distribution(args)).run()
        got = sla_gate(_print_result(result, args.quiet), result.run, result.summary, args.fail_on_sla)
        code = code or got
        runs.append((shape, result.run.path))
        if result.ended == Ended.INTERRUPTED:
            break
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = write_sweep(Path(args.out) / f"{stamp}-{safe_name(plan.name)}-shapes", plan.name, runs)
    if not args.quiet:
        print(f"kneeswarm: shapes sweep: {out / REPORT_HTML}")
    return code


def worker_argv(master: str, processes: int | None) -> list[str]:
    """The Locust worker command line of `kneeswarm worker --master HOST[:PORT]`; ValueError on a bad port."""
    from kneeswarm.launch.conductor import SWARM

    host, _, port = master.rpartition(":") if ":" in master else (master, "", "5557")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--master {master!r}: the port must be a number from 1 to 65535")
    argv = [sys.executable, "-m", "locust", "-f", str(SWARM), "--worker", "--master-host", host or master,
            "--master-port", port]
    return argv + (["--processes", str(processes)] if processes else [])


def cmd_worker(args: argparse.Namespace) -> int:
    """Becomes the Locust worker (exec): signals and the exit code are Locust's own."""
    import json
    import os

    if args.versions:
        from kneeswarm.launch.conductor import versions

        v = versions()
        print(json.dumps({k: v.get(k) for k in ("kneeswarm", "locust")}))
        return EXIT_OK
    if not args.master:
        print("kneeswarm: error: worker: --master HOST[:PORT] is required", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        argv = worker_argv(args.master, args.processes)
    except ValueError as e:
        print(f"kneeswarm: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return EXIT_FAILED  # not reached


def start_target(argv: list[str], timeout: float = TARGET_START_TIMEOUT) -> tuple[subprocess.Popen, str]:
    """Start the bundled target on a free port; returns the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kneeswarm.target", "--port", "0", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, preexec_fn=die_with_parent(),  # a killed `kneeswarm demo` takes it along
    )
    # The target prints its URL first; wait for that line, but never past the timeout (a
    # target stuck building its model must not hang `kneeswarm demo`).
    assert proc.stdout is not None  # stdout=PIPE
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    m = re.search(r"(http://\S+)", line)
    if not m:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the demo target did not start within {timeout:.0f}s (said: {line.strip()!r})")
    return proc, m.group(1)


def stop_target(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _demo_strategy(args: argparse.Namespace) -> dict[str, Any]:
    """demo's steps, or with --search the search's keys (hold "auto" unless --hold was given), or
    with --soak the soak's."""
    if args.soak is not None:
        return _demo_soak(args)
    if not args.search:
        return {"load.steps": args.steps}
    return {"load.mode": "search", "load.start": 1, "load.max": args.max,
            "load.hold": "auto" if args.hold == DEMO_HOLD else args.hold}


def cmd_demo(args: argparse.Namespace) -> int:
    from kneeswarm.launch.conductor import Conductor
    from kneeswarm.contracts.plan import HostPlan
    from kneeswarm.contracts.planfile import load_plan

    _require_sla(any(v is not None for v in _gate_overrides(args).values()), args)
    target_args = shlex.split(args.target_args) if args.target_args else DEMO_TARGET_ARGS
    export = _export(args)
    proc, url = start_target(target_args)
    try:
        print(f"kneeswarm: demo target {url} (pid {proc.pid}): {' '.join(target_args)}", file=sys.stderr)
        plan = load_plan(None, {
            "name": "demo", "target": url, "load.hold": args.hold, "load.ramp": DEMO_RAMP, "load.settle": DEMO_SETTLE,
            "metrics_url": f"{url}/metrics", "load.min_hold": args.min_hold, "load.max_hold": args.max_hold,
            **_demo_strategy(args), **_gate_overrides(args), "load.repeat": args.repeat, "load.cooldown": args.cooldown,
        })
        plan.hosts = [HostPlan(name="local", pid=proc.pid)]
        if plan.load.repeat > 1:
            from kneeswarm.launch.repeat import run_repeat

            return run_repeat(plan, args.out, lambda p: Conductor(p, args.out, export=export).run(),
                              lambda r: _print_result(r, False), args.fail_on_sla, False)
        result = Conductor(plan, args.out, export=export).run()
    finally:
        stop_target(proc)
    return sla_gate(_print_result(result, False), result.run, result.summary, args.fail_on_sla)


def _demo_soak(args: argparse.Namespace) -> dict[str, Any]:
    """The plan overrides of `demo --soak`: a soak of --users users (the steps are then its windows)."""
    if args.soak is None:
        return {}
    return {"load.mode": "soak", "load.users": args.users, "load.duration": args.soak, "load.window": args.window}


def cmd_analyze(args: argparse.Namespace) -> int:
    from kneeswarm.launch.conductor import analyze_run
    from kneeswarm.contracts.rundir import REPEAT_JSON, RunDir

    if (Path(args.run_dir) / REPEAT_JSON).is_file():  # a repeat's merged result: merged again from its runs
        from kneeswarm.analysis.runs.repeat import remerge

        return _merged(Path(args.run_dir), remerge(args.run_dir), args.fail_on_sla, quiet=False)
    run = RunDir.open(args.run_dir)
    summary, error = analyze_run(run)
    return sla_gate(_report(run, summary, error, None, quiet=False), run, summary, args.fail_on_sla)


def _merged(folder: Path, rep: Any, fail_on_sla: bool, quiet: bool) -> int:
    """Print a merged result (repeat.md unless quiet, its page's path) and give its exit code."""
    from kneeswarm.contracts.rundir import REPEAT_MD, REPORT_HTML
    from kneeswarm.launch.repeat import series_code

    if not quiet:
        print((folder / REPEAT_MD).read_text())
    print(f"repeat report: {folder / REPORT_HTML}")
    return series_code(rep, EXIT_OK, False, fail_on_sla)


def cmd_merge(args: argparse.Namespace) -> int:
    """`merge RUN_DIR...`: the runs (each a run directory, else bad input) into one repeated result."""
    import tomllib

    from kneeswarm.analysis.runs.repeat import repeat_folder, write_repeat
    from kneeswarm.contracts.rundir import RunDir

    runs = [RunDir.open(d) for d in args.run_dirs]  # RunDirError: bad input (main)
    name = args.name
    if name is None:
        try:
            name = str(tomllib.loads(runs[0].plan_path.read_text()).get("name") or "merged")
        except (OSError, ValueError):
            name = "merged"
    folder = Path(args.out) if args.out else repeat_folder(runs[0].path.parent, name)
    rep = write_repeat(folder, name, [r.path for r in runs], args.planned)
    return _merged(folder, rep, False, args.quiet)


def cmd_history(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kneeswarm.analysis.runs.history import HistoryError, run_history

    try:
        result, html_path = run_history(args.paths, args.index, args.out, args.since, args.plan, args.last,
                                        args.figures)
    except HistoryError as e:
        print(f"kneeswarm history: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"report: {html_path}" if args.quiet else Path(html_path).with_suffix(".md").read_text())
    if not (args.fail_on_drift and result["drift_worse"]):
        return EXIT_OK
    print("kneeswarm history: drifted worse: " + "; ".join(f"{d['plan']} {d['figure']} {d['rel_change']:+.0%} (p {d['p']:.2g})"
                                                          for d in result["drift_worse"]), file=sys.stderr)
    return EXIT_DRIFT


def cmd_compare(args: argparse.Namespace) -> int:
    """`compare BASE NEW` (kneeswarm.analysis.runs.compare; imported here: the analysis package loads pandas)."""
    from kneeswarm.analysis.runs.compare import (NOT_COMPARABLE, REGRESSED, compare_markdown, compare_runs, is_repeat,
                                                 write_outputs)
    from kneeswarm.contracts.rundir import COMPARE_DIR, RunDir

    result = compare_runs(args.base, args.new)  # RunDirError: bad input (main)
    if result["verdict"] == NOT_COMPARABLE:
        print(f"kneeswarm compare: {args.base} and {args.new}: no step is valid in both runs", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        default = Path(args.new) / COMPARE_DIR if is_repeat(args.new) else RunDir(args.new).report_dir / COMPARE_DIR
        write_outputs(result, Path(args.out) if args.out else default)
    except OSError as exc:  # the output folder cannot be written: the comparison did not complete
        print(f"kneeswarm compare: cannot write the comparison: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not args.quiet:
        print(compare_markdown(result))
    return EXIT_REGRESSION if args.fail_on_regression and result["verdict"] == REGRESSED else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "target":  # the target has its own parser; it stands apart
        from kneeswarm.target.server import main as target_main

        return target_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="kneeswarm: %(levelname)s %(name)s: %(message)s")
    from kneeswarm.agents import AgentError
    from kneeswarm.launch.conductor import ConductorError
    from kneeswarm.contracts.plan import PlanError
    from kneeswarm.contracts.rundir import RunDirError

    commands = {"run": cmd_run, "demo": cmd_demo, "analyze": cmd_analyze, "worker": cmd_worker, "history": cmd_history,
                "compare": cmd_compare, "merge": cmd_merge}
    try:
        return commands[args.command](args)
    except (PlanError, ConductorError, AgentError, RunDirError) as e:
        print(f"kneeswarm: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("kneeswarm: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # the machine's fault (a full disk, no free port), not the input's
        print(f"kneeswarm: error: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
