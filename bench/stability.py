"""Do the verdicts repeat?  Each scenario of the real-run tests, run ``--repeat N`` times, one table per scenario.

kneeswarm judges each figure against the run's own noise (the knee's interval and stability, findings
confirmed or marginal, the verdict's root causes) and merges a repeated run
(kneeswarm.analysis.runs.repeat).  This bench asks whether what one run says is what the next run
says: for each scenario it starts the demo target as the real-run test named beside it does (and a
half-CPU cgroup where it needs one), runs ``kneeswarm run --repeat N --cooldown S`` with that test's
plan, and prints from the merged result (repeat.json, and each run's summary.json for the verdict's
text) one table: run, knee, knee interval, stability, root causes (the verdict), confirmed findings,
marginal findings, and whether the run said what the test asserts.  Then a line per scenario: the
same root causes in every run (yes/no), the knee intervals of all runs meeting (yes/no).

The machine is shared, and a loaded machine moves a run's figures: the load average (1, 5, 15 min)
at the start of each scenario is printed with it.

    nice python bench/stability.py [--only NAME[,NAME]] [--repeat 3] [--cooldown 2] [--keep DIR]
    python bench/stability.py --list                     # the scenarios, and which need root
    python bench/stability.py --from DIR [--only NAME]   # print again from the runs kept in DIR

The runs go one after another (about 1 min each on 2 shared cores; all of them 20-40 min).  The
half-CPU scenario makes a v1 cpu cgroup and needs root; without it that scenario says so in one line
and is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kneeswarm.analysis.runs.repeat import member_dirs, read_repeat  # noqa: E402
from kneeswarm.analysis.schema.repetition import Repetition, RepeatRun  # noqa: E402
from kneeswarm.contracts.rundir import REPEAT_JSON, RunDirError  # noqa: E402
from kneeswarm.launch.cli import start_target, stop_target  # noqa: E402

REPEAT = 3
COOLDOWN_S = 2.0
RUN_TIMEOUT_S = 300  # one repetition, on a loaded 2-core machine (they take ~1 min)
CPUS = len(os.sched_getaffinity(0))
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (tests/test_cgroup.py's)
HALF_CPU = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000",
            # shares well above the default: the quota caps the group at half a CPU however busy the host is
            "cpu.shares": "262144"}
KNEE_SLOTS = 4  # the knee target's slots of 50 ms: the knee at 4 users

Check = Callable[[RepeatRun, dict[str, Any]], bool]  # (the run in the merged result, its summary.json) -> held


@dataclass
class Scenario:
    about: str
    test: str  # the real-run test whose target, plan and assertion these are
    target: list[str]  # the demo target's flags
    plan: str  # the plan's TOML (no target, name or hosts: given as flags)
    expect: str  # what that test asserts of one run, in words
    check: Check
    pid: bool = True  # monitor the target's process (pidstat, vmstat, cgroup)
    metrics: bool = True  # scrape its /metrics
    cgroup: bool = False  # in a v1 cpu cgroup of half a CPU (needs root)
    extra: list[str] = field(default_factory=list)


def _verdict_text(summary: dict[str, Any]) -> str:
    v = summary.get("verdict")
    return str(v.get("text") or "") if isinstance(v, dict) else ""


def _covers(summary: dict[str, Any], users: float) -> bool:
    """The run's own knee interval (summary.json knee.interval; hi None: beyond the range) holds ``users``."""
    iv = (summary.get("knee") or {}).get("interval")
    return isinstance(iv, list) and len(iv) == 2 and iv[0] is not None and \
        iv[0] <= users <= (math.inf if iv[1] is None else iv[1])


def _plan(steps: list[int], hold: float, ramp: float, settle: float, tail: str = "") -> str:
    return f"[load]\nsteps = {steps}\nhold = {hold}\nramp = {ramp}\nsettle = {settle}\nworkers = 1\n{tail}"


SCENARIOS: dict[str, Scenario] = {
    "half-cpu": Scenario(
        "the demo target (ONNX, its defaults) in a cgroup of half a CPU, users thinking 40 ms",
        "tests/test_cgroup.py::test_half_cpu_quota_is_throttling_and_cpu_rules_count_half_a_cpu", [],
        _plan([1, 2, 4], 4.0, 1.0, 1.0, "wait_ms = 40.0\n[analysis]\nmin_requests = 20\n"),
        "cpu_throttled leads alone, the verdict names the quota (0.5 CPUs)",
        lambda r, s: r["causes"] == ["cpu_throttled"] and "quota (0.5 CPUs)" in _verdict_text(s),
        metrics=False, cgroup=True),
    "oversubscribed": Scenario(
        f"the seed's shape: ONNX, {4 * CPUS} request threads x 2 intra-op threads on {CPUS} CPUs",
        "tests/test_findings.py::test_real_oversubscribed_onnx_target_is_diagnosed",
        ["--mode", "onnx", "--request-threads", str(4 * CPUS), "--intra-op-threads", "2"],
        _plan([max(1, CPUS // 2), CPUS, 2 * CPUS], 4.0, 1.0, 1.0),
        "engine_oversubscribed leads the verdict",
        lambda r, s: r["causes"][:1] == ["engine_oversubscribed"]),
    "knee": Scenario(
        f"the knee target: {KNEE_SLOTS} slots of 50 ms (QPS = min(users, {KNEE_SLOTS}) x 20, the knee at {KNEE_SLOTS})",
        "tests/test_findings.py::test_real_knee_target_gives_exactly_waiting_not_computing_run_after_run (K3)",
        ["--mode", "knee", "--slots", str(KNEE_SLOTS), "--service-ms", "50"],
        _plan([1, 2, 4, 8, 16], 3.0, 0.5, 1.0),
        f"knee at {KNEE_SLOTS} users, waiting_not_computing the one root cause",
        lambda r, s: r["knee_users"] == KNEE_SLOTS and r["causes"] == ["waiting_not_computing"]),
    "llm-kv": Scenario(
        "the LLM engine model with a 200-token KV cache for sequences of 10 + 20 tokens (6-7 fit)",
        "tests/test_findings_llm_engine.py::test_each_engine_finding_fires_on_the_plan_built_to_cause_it_"
        "and_not_on_the_others[kv]",
        ["--mode", "knee", "--kv-tokens", "200", "--max-batch", "32", "--decode-ms", "10"],
        'protocol = "openai"\n' + _plan([1, 4, 8, 16], 4.0, 0.5, 0.5)
        + "[request]\nprompt_tokens = 10\nmax_tokens = 20\nignore_eos = true\nstream = true\n"
        "[analysis]\nmin_requests = 10\n",
        "kv_cache_full leads the verdict",
        lambda r, s: r["causes"][:1] == ["kv_cache_full"], pid=False),
    "usl-threshold": Scenario(
        "the USL target (σ 0.1, κ 0.112, 50 ms): QPS at 4 users ~5 % below its peak at 3, the retrograde threshold",
        "tests/test_findings_noise.py::test_a_drop_at_the_retrograde_threshold_is_marginal_not_critical",
        ["--mode", "usl", "--sigma", "0.1", "--kappa", "0.112", "--service-ms", "50"],
        _plan([1, 3, 4], 12.0, 1.0, 1.0, "[analysis]\nmin_requests = 20\n"),
        "retrograde marginal, not confirmed",
        lambda r, s: "retrograde" in r["findings_marginal"] and "retrograde" not in r["findings"],
        metrics=False),
    "usl-past": Scenario(
        "the USL target (σ 0.1, κ 0.1, 50 ms): the peak at 3 users, 34 % less at 8: well past the threshold",
        "tests/test_findings_real.py::test_a_curve_falling_past_its_peak_is_retrograde",
        ["--mode", "usl", "--sigma", "0.1", "--kappa", "0.1", "--service-ms", "50"],
        _plan([1, 3, 8, 10], 3.0, 1.0, 1.0, "[analysis]\nmin_requests = 20\n"),
        "retrograde confirmed",
        lambda r, s: "retrograde" in r["findings"], metrics=False),
    "knee-jitter": Scenario(
        f"the knee target ({KNEE_SLOTS} slots of 50 ms) made noisy: --jitter 0.3, a slow part every 0.5 s",
        "tests/test_repeat_runs.py::test_repeat_on_a_jittered_target_marks_the_findings_that_did_not_repeat",
        ["--mode", "knee", "--slots", str(KNEE_SLOTS), "--service-ms", "50", "--jitter", "0.3", "--jitter-period", "0.5"],
        _plan([2, 4, 6, 8], 6.0, 1.0, 1.0, "[analysis]\nmin_requests = 20\n"),
        f"the run's own knee interval covers the truth, {KNEE_SLOTS} users",
        lambda r, s: _covers(s, KNEE_SLOTS), metrics=False),
}


# -- running one scenario -------------------------------------------------------------------------------
class CgroupError(Exception):
    """The half-CPU cgroup cannot be made here (not root, no cgroup v1 cpu controller)."""


def cgroup_unavailable() -> str | None:
    """Why the half-CPU cgroup cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (it makes a v1 cpu cgroup of half a CPU)"
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        return f"needs cgroup v1's cpu controller at {CGROUP_CPU}"
    return None


class HalfCpuCgroup:
    """A v1 cpu cgroup with a quota of half a CPU; its processes go back to the root when closed."""

    def __init__(self) -> None:
        self.path = CGROUP_CPU / f"kneeswarm-bench-{uuid.uuid4().hex[:8]}"
        try:
            self.path.mkdir()
            for name, value in HALF_CPU.items():
                (self.path / name).write_text(value)
        except OSError as e:
            self.close()
            raise CgroupError(f"cannot make {self.path}: {e}") from None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        if not self.path.exists():
            return
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
            except OSError:  # exited meanwhile
                pass
        self.path.rmdir()


def run_scenario(name: str, sc: Scenario, work: Path, repeat: int, cooldown: float) -> str | None:
    """``kneeswarm run --repeat`` of one scenario into work/out; None, or why it did not finish."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "start.json").write_text(json.dumps({"loadavg": os.getloadavg(), "cpus": CPUS,
                                                 "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}))
    (work / "plan.toml").write_text(sc.plan)
    group = HalfCpuCgroup() if sc.cgroup else None
    proc = None
    try:
        proc, url = start_target(sc.target)
        if group is not None:
            group.add(proc.pid)
        cmd = [sys.executable, "-m", "kneeswarm.launch.cli", "run", str(work / "plan.toml"), "--target", url,
               "--name", name, "--out", str(work / "out"), "--repeat", str(repeat), "--cooldown", str(cooldown), "-q"]
        cmd += (["--pid", str(proc.pid)] if sc.pid else []) + (["--metrics-url", url + "/metrics"] if sc.metrics else [])
        res = subprocess.run(cmd + sc.extra, capture_output=True, text=True, timeout=RUN_TIMEOUT_S * repeat, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f"kneeswarm run did not end within {RUN_TIMEOUT_S * repeat} s"
    finally:
        if proc is not None:
            stop_target(proc)
        if group is not None:
            group.close()
    (work / "stderr.txt").write_text(res.stderr)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        return f"kneeswarm run exited {res.returncode}: {last}"
    return None


# -- the table ------------------------------------------------------------------------------------------
def merged(work: Path) -> tuple[Repetition, list[dict[str, Any]]]:
    """The merged result under work/out and each of its runs' summary.json ({} where unreadable)."""
    folders = sorted(p for p in (work / "out").glob("*") if (p / REPEAT_JSON).is_file()) if (work / "out").is_dir() else []
    if not folders:
        raise RunDirError(f"{work / 'out'}: no merged result (repeat.json)")
    rep = read_repeat(folders[-1])
    summaries = []
    for d in member_dirs(folders[-1], rep):
        try:
            summaries.append(json.loads((d / "report" / "summary.json").read_text()))
        except (OSError, ValueError):
            summaries.append({})
    return rep, summaries


def _users(v: float | None) -> str:
    return "–" if v is None else f"{v:g}"


def _interval(iv: list[Any] | None) -> str:
    if not iv:
        return "–"
    return f"[{_users(iv[0])}, {'beyond' if iv[1] is None else _users(iv[1])}]"


def _list(ids: list[str]) -> str:
    return ", ".join(ids) or "–"


def same_causes(rep: Repetition) -> str:
    """"yes (ids)" when every merged run named the same root causes, else "no (each run's)"."""
    runs = [r for r in rep["runs"] if r["merged"]]
    if not runs:
        return "no (no run merged)"
    causes = [tuple(r["causes"]) for r in runs]
    if len(set(causes)) == 1 and len(runs) == rep["planned"]:
        return f"yes ({_list(list(causes[0])) if causes[0] else 'no root cause in any run'})"
    if len(runs) < rep["planned"]:
        return f"no (only {len(runs)} of {rep['planned']} runs merged)"
    return "no (" + "; ".join(f"run {r['index']}: {_list(r['causes'])}" for r in runs) + ")"


def intervals_meet(rep: Repetition) -> str:
    """"yes (users every run's knee interval holds)" or "no (why)": the merged result's knee overlap."""
    runs = [r for r in rep["runs"] if r["merged"]]
    missing = [str(r["index"]) for r in runs if r["knee_interval"] is None]
    if not runs or len(runs) < rep["planned"]:
        return f"no (only {len(runs)} of {rep['planned']} runs merged)"
    if all(r["knee_users"] is None and r["knee_interval"] is None for r in runs):  # they agree: no knee
        none = ", ".join("?" if r["knee_stability"] is None else f"{r['knee_stability']:.0%}" for r in runs)
        return f"yes (no knee in any run, nor in {none} of their resamples)"
    if missing:
        return f"no (no knee interval in run {', '.join(missing)})"
    ov = rep["knee"]["overlap"]
    if ov is None:
        return "no (" + "; ".join(f"run {r['index']}: {_interval(r['knee_interval'])}" for r in runs) + ")"
    return f"yes (every run's interval holds {_interval(ov)} users)"


def scenario_lines(name: str, sc: Scenario, rep: Repetition, summaries: list[dict[str, Any]]) -> list[str]:
    """The scenario's table and its lines, from the merged result and its runs' summaries."""
    lines = [f"expected of each run ({sc.test}): {sc.expect}", "",
             "| run | knee | knee interval | stability | root causes (verdict) | confirmed findings | "
             "marginal findings | as expected |",
             "|---:|---:|---|---:|---|---|---|---|"]
    held = 0
    for r, s in zip(rep["runs"], summaries):
        ok = r["merged"] and sc.check(r, s)
        held += ok
        stab = "–" if r["knee_stability"] is None else f"{r['knee_stability']:.0%}"
        lines.append(f"| {r['index']} | {_users(r['knee_users'])} | {_interval(r['knee_interval'])} | {stab} | "
                     f"{_list(r['causes'])} | {_list(r['findings'])} | {_list(r['findings_marginal'])} | "
                     f"{'yes' if ok else 'no' if r['merged'] else 'not merged: ' + str(r['left_out'])} |")
    lines += ["", f"{name}: same root cause in every run: {same_causes(rep)}",
              f"{name}: knee intervals overlap in every run: {intervals_meet(rep)}",
              f"{name}: as expected in {held} of {rep['planned']} runs ({rep['knee']['text']})"]
    return lines


def print_scenario(name: str, sc: Scenario, work: Path, failed: str | None) -> None:
    start = json.loads((work / "start.json").read_text()) if (work / "start.json").is_file() else {}
    load = start.get("loadavg")
    print(f"\n### {name}: {sc.about}\n")
    if load:
        print(f"load average at the start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (1, 5, 15 min) on "
              f"{start.get('cpus')} CPUs, {start.get('started')}")
    if failed:
        print(f"{name}: {failed}")
    try:
        rep, summaries = merged(work)
    except RunDirError as e:
        print(f"{name}: nothing to print: {e}")
        return
    print("\n".join(scenario_lines(name, sc, rep, summaries)), flush=True)


# -- the command ----------------------------------------------------------------------------------------
def chosen(only: str | None) -> list[str]:
    names = list(SCENARIOS) if not only else [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"--only {only}: no scenario {', '.join(unknown)} (there are {', '.join(SCENARIOS)})")
    return names


@contextlib.contextmanager
def workdir(keep: Path | None) -> Iterator[Path]:
    """DIR (kept), or a temporary folder removed at the end."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="kneeswarm-bench-stability-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="run only these scenarios")
    ap.add_argument("--repeat", type=int, default=REPEAT, metavar="N", help="runs per scenario (default %(default)s)")
    ap.add_argument("--cooldown", type=float, default=COOLDOWN_S, metavar="S",
                    help="seconds between two runs (default %(default)s)")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the runs in DIR/<scenario>/ (created)")
    ap.add_argument("--from", dest="src", type=Path, metavar="DIR", help="print from the runs kept in DIR; run nothing")
    args = ap.parse_args(argv)
    if args.list:
        for name, sc in SCENARIOS.items():
            print(f"{name}: {sc.about}{' (needs root)' if sc.cgroup else ''}\n    {sc.test}\n    expected: {sc.expect}")
        return 0
    try:
        names = chosen(args.only)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.repeat < 2:
        print(f"--repeat {args.repeat}: must be at least 2 (one run cannot repeat)", file=sys.stderr)
        return 2
    if args.src is not None and not args.src.is_dir():
        print(f"--from {args.src}: not a directory", file=sys.stderr)
        return 2
    if args.src is not None:
        for name in names:
            if (args.src / name).is_dir():
                print_scenario(name, SCENARIOS[name], args.src / name, None)
        return 0
    print(f"bench/stability.py: --repeat {args.repeat} --cooldown {args.cooldown:g}, "
          f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {CPUS} CPUs", flush=True)
    with workdir(args.keep) as root:
        for name in names:
            sc = SCENARIOS[name]
            why = cgroup_unavailable() if sc.cgroup else None
            if why:
                print(f"\n### {name}: skipped, {why}", flush=True)
                continue
            try:
                failed = run_scenario(name, sc, root / name, args.repeat, args.cooldown)
            except (CgroupError, RuntimeError) as e:  # the cgroup or the target could not be made
                failed = str(e)
            print_scenario(name, sc, root / name, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
