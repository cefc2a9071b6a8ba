"""Findings on real runs where the host is shared (as where services run): a rule must blame the service only
for what the service did.  Real processes throughout: the conductor, Locust, the demo target,
pidstat and vmstat, and the kernel's cgroups (v1 here: blkio, cpu, memory) to shape what the
service may use; the expected numbers come from the kernel's or the target's own counters."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import release_cgroups

CGROUP_ROOT = Path("/sys/fs/cgroup")
DELAYACCT = Path("/proc/sys/kernel/task_delayacct")
WRITE_KB = 64  # the target's fsynced write per request (--write-kb)
WRITE_BPS = 1 << 20  # the blkio cgroup's write limit: 1 MiB/s, so every fsync waits on the disk


def ids(summary: dict) -> set[str]:
    return {f["id"] for f in summary["findings"]}


def only(summary: dict, fid: str) -> dict:
    [f] = [f for f in summary["findings"] if f["id"] == fid]
    return f


def short_run(target, tmp_path: Path, name: str, steps: list[int], collectors: list[str] | None = None,
              **plan: object) -> tuple[dict, Path]:
    """A real run of a few seconds against ``target`` (its pid monitored: pidstat, vmstat, cgroup;
    or ``collectors``)."""
    from kneeswarm.launch.conductor import Conductor
    from kneeswarm.contracts.plan import HostPlan
    from kneeswarm.contracts.planfile import load_plan

    keys = {"name": name, "target": target.url, "load.steps": steps, "load.hold": 3.0, "load.ramp": 1.0,
            "load.settle": 1.0, "load.workers": 1, "analysis.min_requests": 20, **plan}
    p = load_plan(None, keys)
    p.hosts = [HostPlan(name="local", pid=target.pid, collectors=collectors)]
    out = tmp_path / name
    result = Conductor(p, out, quiet=True).run()
    assert result.ended == "completed" and result.summary is not None
    [run_dir] = [d for d in out.iterdir() if d.is_dir()]
    return result.summary, run_dir


@pytest.fixture
def cgroup_v1():
    """make(controller) -> a fresh v1 cgroup directory (removed at teardown, its processes moved back
    to the root); skipped where root cannot create one."""
    made: list[Path] = []

    def make(controller: str) -> Path:
        path = CGROUP_ROOT / controller / f"kneeswarm-test-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
        except OSError as e:
            pytest.skip(f"cannot create a cgroup under {path.parent} (needs root and cgroup v1's {controller}): {e}")
        made.append(path)
        return path

    yield make
    release_cgroups(made)


@pytest.fixture
def delay_accounting():
    """The kernel's per-task delay accounting on for the test (pidstat's iodelay counts only then)."""
    try:
        before = DELAYACCT.read_text().strip()
        DELAYACCT.write_text("1")
    except OSError as e:
        pytest.skip(f"cannot turn on kernel.task_delayacct (needs root): {e}")
    yield
    DELAYACCT.write_text(before)


def block_device(path: Path) -> str:
    """major:minor of the whole disk holding ``path`` (blkio limits name a disk, not a partition)."""
    dev = os.stat(path).st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (sys_dev / "partition").exists():
        return (sys_dev.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


@pytest.mark.long
@pytest.mark.slow
def test_io_wait_when_the_service_itself_waits_on_its_disk_writes(cgroup_v1, delay_accounting, start_demo_target, tmp_path):
    # The knee-mode target (5 ms slots) appends 64 KiB and fsyncs before every request, in a blkio
    # cgroup limited to 1 MiB/s of writes: its request threads spend most of their time blocked on
    # the disk.  vmstat's wa may read 0 on this shared 2-core machine (wa counts idle CPU time only),
    # so the finding stands on the service's own IO delay (pidstat iodelay, delay accounting on).
    blkio = cgroup_v1("blkio")
    (blkio / "blkio.throttle.write_bps_device").write_text(f"{block_device(tmp_path)} {WRITE_BPS}")
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "5",
                               "--write-kb", str(WRITE_KB), "--write-file", str(tmp_path / "writes.bin"))
    (blkio / "cgroup.procs").write_text(str(target.pid))
    summary, run_dir = short_run(target, tmp_path, "io-own", [1, 2])
    writes = target.metrics()['kneeswarm_target_faults_total{kind="write"}']
    # the kernel's count of what the cgroup wrote to the disk: at least the target's fsynced writes
    written = sum(int(line.split()[2]) for line in (blkio / "blkio.throttle.io_service_bytes").read_text().splitlines()
                  if len(line.split()) == 3 and line.split()[1] == "Write")
    assert written >= writes * WRITE_KB * 1024 > 0, (written, writes)
    assert (tmp_path / "writes.bin").stat().st_size == writes * WRITE_KB * 1024
    assert "io_wait" in ids(summary), summary["findings"]
    f = only(summary, "io_wait")
    ev = f["evidence"]
    step = next(s for s in summary["steps"] if s["users"] == ev["users"])
    [server] = step["server"].values()
    # the service's own writes, as pidstat read them: its fsynced KiB per request x its requests/s
    assert server["io_write_kb_s"] == pytest.approx(WRITE_KB * step["qps"], rel=0.35), (server, step["qps"])
    assert ev["service_io_recorded"] is True and ev["io_delay_share"] >= 0.10, ev
    # its threads' blocked time over the request-seconds in flight, recomputed from process.csv
    proc = pd.read_csv(next(run_dir.glob("hosts/*/process.csv")))
    window = proc[(proc["t"] >= step["t_lo"]) & (proc["t"] < step["t_hi"])]
    in_flight = step["rps"] * step["mean_ms"] / 1000.0
    assert ev["io_delay_share"] == pytest.approx(window["io_delay_pct"].mean() / 100.0 / in_flight, rel=0.01)
    print("io_wait evidence:", ev, "writes:", writes, "bytes written:", written)


@pytest.mark.long
@pytest.mark.slow
def test_no_io_wait_when_only_another_process_writes(start_demo_target, delay_accounting, tmp_path):
    # The knee-mode target does no disk IO; beside it a process appends and fsyncs 256 KiB in a loop.
    # The host's disk is busy (vmstat bo), maybe its wa too; the service's own IO is nil: no io_wait.
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "other.bin")])
    try:
        target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
        summary, _ = short_run(target, tmp_path, "io-other", [1, 2])
    finally:
        writer.kill()
        writer.wait()
    assert "io_wait" not in ids(summary), summary["findings"]
    for step in summary["steps"]:
        [server] = step["server"].values()
        assert server["io_write_kb_s"] == 0.0 and server["io_read_kb_s"] == 0.0, server
        assert server["bo"] > 1000.0, server  # the other process's writes reached the disk meanwhile
    print("host wa per step:", [(s["users"], next(iter(s["server"].values())).get("wa")) for s in summary["steps"]])


@pytest.mark.long
@pytest.mark.slow
def test_no_io_wait_from_another_process_with_the_proc_sampler_alone(start_demo_target, tmp_path):
    # As above, with the /proc sampler in pidstat's place (a host without sysstat): it reads the
    # service's disk IO from /proc/PID/io, so the service's part is recorded (nil), not unknown --
    # unknown would leave io_wait to the host's wa alone, which the other process's writes raise.
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "other.bin")])
    try:
        target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
        summary, run_dir = short_run(target, tmp_path, "io-procfs", [1, 2], collectors=["vmstat", "procfs"])
    finally:
        writer.kill()
        writer.wait()
    raw = {p.name for p in run_dir.glob("hosts/*/raw/*")}
    assert "procfs.jsonl" in raw and not any(n.startswith("pidstat") for n in raw), raw  # the sampler alone
    assert "io_wait" not in ids(summary), summary["findings"]
    for step in summary["steps"]:
        [server] = step["server"].values()
        assert server["io_write_kb_s"] == 0.0 and server["io_read_kb_s"] == 0.0, server
        assert server["bo"] > 1000.0, server  # the other process's writes reached the disk meanwhile


WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
while True:
    os.write(fd, b"x" * 262144); os.fsync(fd)
"""


BURNER = "while True: pass"


@pytest.mark.long
@pytest.mark.slow
def test_a_cpu_burner_beside_the_service_is_not_the_service_saturating_the_cpu(start_demo_target, tmp_path):
    # Two processes spinning beside the ONNX target (one request thread, one ONNX thread) at 1 user:
    # the host's 2 CPUs are full, but the target does only a part of that (one thread among three
    # or more runnable): the CPU is not "the bottleneck" of the service (cpu_saturated was once
    # given at 25-35 %); a full host that kept the target waiting is host_contended.
    burners = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(2)]
    try:
        target = start_demo_target("--mode", "onnx", "--request-threads", "1", "--intra-op-threads", "1")
        summary, _ = short_run(target, tmp_path, "burner", [1])
    finally:
        for b in burners:
            b.kill()
            b.wait()
    [step] = summary["steps"]
    [server] = step["server"].values()
    busy, share = server["us"] + server["sy"], server["cpu_pct"] / 2 / (server["us"] + server["sy"])
    print(f"host busy {busy:.0f} %, the target's share of it {share:.0%}:", summary["findings"])
    assert busy >= 90.0 and share < 0.5, server  # the burners filled the host; the target did the lesser part
    assert "cpu_saturated" not in ids(summary), summary["findings"]
    if "host_contended" in ids(summary):
        assert only(summary, "host_contended")["evidence"]["process_share"] == pytest.approx(share, rel=0.01)


def run_delay_s(pid: int) -> float:
    """The kernel's time ``pid``'s live threads spent runnable but waiting for a CPU
    (/proc/PID/task/TID/schedstat, second field, ns), seconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


@pytest.mark.long
@pytest.mark.slow
def test_a_service_the_scheduler_keeps_waiting_behind_other_work_is_host_contended(cgroup_v1, start_demo_target,
                                                                                     tmp_path):
    # The real positive of host_contended, made certain: the ONNX target (one request thread, one
    # ONNX thread) in a v1 cpu cgroup whose weight (cpu.shares 256) is a quarter of each of the two
    # burners' beside it (1024 each, in the root), so its one busy thread gets about a fifth of a
    # CPU and waits for one most of its requests' time.  (Without the cgroup the scheduler's sleeper
    # credit lets it in at once and it waits little: the test above.)  The kernel's own run delay
    # is the truth that it waited.
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.shares").write_text("256")
    burners = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(2)]
    try:
        target = start_demo_target("--mode", "onnx", "--request-threads", "1", "--intra-op-threads", "1")
        (cpu / "cgroup.procs").write_text(str(target.pid))
        waited0 = run_delay_s(target.pid)
        summary, run_dir = short_run(target, tmp_path, "starved", [1])
        waited = run_delay_s(target.pid) - waited0
    finally:
        for b in burners:
            b.kill()
            b.wait()
    from kneeswarm.contracts.rundir import RunDir
    in_flight = RunDir(run_dir).read_requests()["latency_ms"].sum() / 1000.0  # request-seconds, every row
    [step] = summary["steps"]
    [server] = step["server"].values()
    busy, share = server["us"] + server["sy"], server["cpu_pct"] / 2 / (server["us"] + server["sy"])
    print(f"host busy {busy:.0f} %, the target's share {share:.0%}, the kernel's run delay {waited:.2f} s over "
          f"{in_flight:.2f} request-seconds:", summary["findings"])
    assert busy >= 90.0 and share < 0.5, server
    assert waited / in_flight >= 0.10  # the kernel: it waited for a CPU a tenth of its requests' time or more
    assert "host_contended" in ids(summary), summary["findings"]
    assert "cpu_saturated" not in ids(summary), summary["findings"]
    ev = only(summary, "host_contended")["evidence"]
    assert ev["process_share"] == pytest.approx(share, rel=0.01) and ev["cpu_wait_share"] >= 0.10, ev


def vm_rss_mb(pid: int) -> float:
    """The kernel's resident set of ``pid`` (/proc/PID/status VmRSS), MiB."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024.0


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("limit_over_rss,near", [(1.0 / 0.92, True), (4.0, False)], ids=["tight", "roomy"])
def test_memory_limit_near_against_the_kernels_limit_and_rss(cgroup_v1, start_demo_target, tmp_path, limit_over_rss, near):
    # The knee-mode target in a v1 memory cgroup whose limit is set from its RSS before the run:
    # 92 % of it (within MEMORY_LIMIT_MARGIN, 15 %) or a quarter.  The cgroup is charged only for
    # what the target allocates after joining it (no move_charge_at_immigrate): no OOM risk.
    memory = cgroup_v1("memory")
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "20")
    rss0 = vm_rss_mb(target.pid)
    (memory / "memory.limit_in_bytes").write_text(str(int(rss0 * limit_over_rss * 2**20)))
    limit_mb = int((memory / "memory.limit_in_bytes").read_text()) / 2**20  # as the kernel rounded it
    (memory / "cgroup.procs").write_text(str(target.pid))
    summary, _ = short_run(target, tmp_path, "mem", [1, 2])
    rss1 = vm_rss_mb(target.pid)
    [facts] = [f["service"] for f in summary["hosts"].values() if "service" in f]
    assert facts["memory_limit_mb"] == pytest.approx(limit_mb, rel=1e-6)
    print(f"VmRSS {rss0:.1f} -> {rss1:.1f} MiB, limit {limit_mb:.1f} MiB:", summary["findings"])
    assert ("memory_limit_near" in ids(summary)) is near, summary["findings"]
    if near:
        ev = only(summary, "memory_limit_near")["evidence"]
        assert ev["memory_limit_mb"] == pytest.approx(limit_mb, rel=1e-3)
        assert min(rss0, rss1) * 0.97 <= ev["rss_mb"] <= max(rss0, rss1) * 1.03, (ev, rss0, rss1)
        assert ev["share"] == pytest.approx(ev["rss_mb"] / limit_mb, rel=1e-3) and ev["share"] >= 0.85


def target_in_cpu_quota(cgroup_v1, start_demo_target, period_us: int, quota_us: int, *flags: str):
    """A knee-mode demo target (``flags``) moved into a fresh v1 cpu cgroup allowed ``quota_us`` of
    CPU every ``period_us`` (cpu.shares high, so that it gets them on this shared machine)."""
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.cfs_period_us").write_text(str(period_us))
    (cpu / "cpu.cfs_quota_us").write_text(str(quota_us))
    (cpu / "cpu.shares").write_text("262144")
    target = start_demo_target("--mode", "knee", *flags)
    (cpu / "cgroup.procs").write_text(str(target.pid))
    return target


@pytest.mark.long
@pytest.mark.slow
def test_efficiency_falling_when_each_request_costs_more_cpu_with_more_in_flight(cgroup_v1, start_demo_target, tmp_path):
    # The knee-mode target (5 ms slots) with --cpu-work-per-inflight 50: each request computes
    # 50 x (requests in flight) units of numpy work, so at 4 users an answer costs up to 4 times the
    # CPU of 1 user's.  In a v1 cpu cgroup of 1.5 CPUs (cpu.shares high, so that it gets them on
    # this shared machine, and the load generator keeps the rest): at 1 user it uses under 1 CPU,
    # at 4 users up to its 1.5, for about the same QPS: QPS per CPU-second (1 / the CPU cost of a
    # request) falls while its CPU still rises.  (At 2 users the cost rose only 1.2-2x: on this
    # busy host a user spends much of its time in the load generator, not in flight.)
    target = target_in_cpu_quota(cgroup_v1, start_demo_target, 100_000, 150_000,
                                 "--slots", "4", "--service-ms", "5", "--cpu-work-per-inflight", "50")
    summary, _ = short_run(target, tmp_path, "wall", [1, 4])
    units = target.metrics()['kneeswarm_target_faults_total{kind="cpu_work_units"}']
    eff = [(s["users"], s["qps"], next(iter(s["server"].values()))["cpu_pct"] / 100.0) for s in summary["steps"]]
    print("units:", units, "(users, QPS, CPUs):", eff, summary["findings"])
    assert "efficiency_falling" in ids(summary), summary["findings"]
    ev = only(summary, "efficiency_falling")["evidence"]
    (u0, q0, c0), (u1, q1, c1) = eff  # independent of the rule: QPS / process CPUs per step
    assert (ev["from_users"], ev["users"]) == (u0, u1)
    assert ev["drop"] == pytest.approx(1 - (q1 / c1) / (q0 / c0), abs=1e-3) and ev["drop"] >= 0.20


@pytest.mark.long
@pytest.mark.slow
def test_latency_swinging_when_a_full_quota_stalls_requests_of_unequal_cost(cgroup_v1, start_demo_target, tmp_path):
    # The knee-mode target (10 ms slots) with --cpu-work-per-inflight 10 in a v1 cpu cgroup of half
    # a CPU in long periods (250 ms of CPU every 500 ms): at 1 user each request costs the same
    # ~4 ms of CPU and the quota is not reached (P99 near P50); at 4 users requests cost 1 to 4
    # times that, the quota is spent (the service's CPUs full) and the requests that meet the
    # throttled part of a period wait up to 250 ms for the next: P99 swings far above P50 (measured
    # in four runs: 9.4-11.7x at 4 users against 1.6-5.6x at 1 user on this shared host; 1 s
    # periods swung more but left too few requests per period for a steady step).
    target = target_in_cpu_quota(cgroup_v1, start_demo_target, 500_000, 250_000,
                                 "--slots", "4", "--service-ms", "10", "--cpu-work-per-inflight", "10")
    summary, _ = short_run(target, tmp_path, "swing", [1, 4])
    spread = [(s["users"], s["p99_ms"] / s["p50_ms"], next(iter(s["server"].values())).get("throttled_share"))
              for s in summary["steps"]]
    print("(users, P99/P50, throttled share):", spread, summary["findings"], [(s["users"], s.get("valid"), s.get("reasons"), s.get("qps"), s.get("requests")) for s in summary["steps"]], summary.get("knee"))
    # fired, confirmed or within this run's noise: a 4-user step of a few seconds whose P99 is made by
    # 250-ms stalls moves with the 2-s blocks it is drawn from (measured: P99/P50 6.8x at 4 users against
    # 1.1x at 1, the rule holding on 72 % of the resamples: marginal, at the point)
    swinging = [f for f in summary["findings"] + [m for m in summary["findings_marginal"] if m.get("at_point")]
                if f["id"] == "latency_swinging"]
    assert len(swinging) == 1, (summary["findings"], summary["findings_marginal"])
    ev = swinging[0]["evidence"]
    (u0, s0, _), (u1, s1, t1) = spread  # from the steps' own percentiles, independent of the rule
    assert (ev["from_users"], ev["users"]) == (u0, u1) and t1 > 0.25
    assert ev["spread"] == pytest.approx(s1, rel=1e-3) and ev["spread_from"] == pytest.approx(s0, rel=1e-3)
    assert s1 >= 2.0 and s1 >= 1.5 * s0


@pytest.mark.parametrize("args", [["--write-kb", "4"], ["--write-kb", "-1"], ["--cpu-work-per-inflight", "x"], ["--spin-wait", "-1"],
                                  ["--write-kb", "4", "--write-file", "/nonexistent-dir/w.bin"]])
def test_the_targets_disk_and_cpu_knobs_reject_bad_input_with_one_line(args):
    # --write-kb without a file, or a file that cannot be opened: one line, exit code 2
    proc = subprocess.run([sys.executable, "-m", "kneeswarm.target", "--mode", "knee", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def window_means(run_dir: Path, step: dict, columns: list[str]) -> pd.Series:
    """The means of pidstat's own rows (process.csv) in a step's steady window [t_lo, t_hi)."""
    proc = pd.read_csv(next(run_dir.glob("hosts/*/process.csv")))
    return proc[(proc["t"] >= step["t_lo"]) & (proc["t"] < step["t_hi"])][columns].mean()


def task_counters(pid: int) -> tuple[int, int, int]:
    """The kernel's (utime + stime ticks, stime ticks, context switches) of ``pid``'s live threads."""
    ut = st = cs = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text().splitlines()
        except OSError:
            continue
        ut, st = ut + int(fields[11]), st + int(fields[12])
        cs += sum(int(x.split()[1]) for x in status if x.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
    return ut + st, st, cs


@pytest.mark.long
@pytest.mark.slow
def test_threads_spinning_for_a_lock_are_a_switch_storm_in_the_kernel(cgroup_v1, start_demo_target, tmp_path):
    # The knee-mode target (4 slots of 50 ms) behind --spin-wait 4: at most 4 requests let through
    # at once, the others wait by spinning on a try-lock with sched_yield() between tries.  At 2
    # users nothing waits; at 8, 4 threads spin: their switches and their kernel time grow with no
    # more answers (QPS is held at 80/s by the slots).  In a v1 cpu cgroup with a high cpu.shares
    # (no quota: the service may use the host's 2 CPUs) so that the spinners get the CPU on this
    # shared machine (without it they got 42 % of a host others kept full, the kernel's share
    # of that 50 %).  Expected numbers: pidstat's own rows and the kernel's per-thread counters.
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.shares").write_text("262144")
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "50", "--spin-wait", "4")
    (cpu / "cgroup.procs").write_text(str(target.pid))
    before = task_counters(target.pid)
    summary, run_dir = short_run(target, tmp_path, "spin", [2, 4, 8])
    after = task_counters(target.pid)
    yields = target.metrics()['kneeswarm_target_faults_total{kind="spin_yield"}']
    steps = {s["users"]: s for s in summary["steps"]}
    own = {u: window_means(run_dir, s, ["usr_pct", "sys_pct", "cswch_s", "nvcswch_s"]) for u, s in steps.items()}
    ticks, sys_ticks, switches = (a - b for a, b in zip(after, before))
    print(f"yields {yields:.0f}, the kernel's: {switches} switches, {sys_ticks}/{ticks} ticks in the kernel;",
          {u: (round(s["qps"], 1), own[u].round(1).to_dict()) for u, s in steps.items()}, ids(summary))
    assert summary["knee"]["users"] == 4 and yields > 0 and sys_ticks / ticks > 0.10
    storm = only(summary, "switch_storm")["evidence"]
    cs = {u: own[u]["cswch_s"] + own[u]["nvcswch_s"] for u in (2, 8)}
    assert (storm["from_users"], storm["to_users"]) == (2, 8)
    assert storm["cs_from"] == pytest.approx(cs[2], rel=1e-3) and storm["cs_to"] == pytest.approx(cs[8], rel=1e-3)
    per_request = (cs[8] / steps[8]["qps"]) / (cs[2] / steps[2]["qps"])
    assert cs[8] / cs[2] >= 3.0 and per_request >= 2.0, (cs, per_request)
    kernel = only(summary, "kernel_time_high")["evidence"]
    k = own[kernel["users"]]
    assert kernel["of"] == "process" and kernel["users"] in (4, 8)
    assert kernel["sy_share"] == pytest.approx(k["sys_pct"] / (k["usr_pct"] + k["sys_pct"]), rel=1e-3)
    assert kernel["sy_share"] > 0.10


QUOTA_CPUS = 1.8  # the container's CPU limit in the one-thread test


def top_thread_means(run_dir: Path, step: dict) -> float:
    """pidstat's busiest thread per sample (threads.csv), averaged over a step's steady window."""
    thr = pd.read_csv(next(run_dir.glob("hosts/*/threads.csv")))
    w = thr[(thr["t"] >= step["t_lo"]) & (thr["t"] < step["t_hi"])]
    return float(w.groupby("t")["cpu_pct"].max().mean())


@pytest.mark.long
@pytest.mark.slow
def test_one_busy_request_thread_is_single_thread_bound(cgroup_v1, start_demo_target, tmp_path):
    # The ONNX target with ONE request thread and one intra-op thread: every inference runs on that
    # thread, so past 1 user it computes all the time (~95 % of a core) while the process's other
    # threads (the event loop) use little.  In a v1 cpu cgroup with a quota of 1.8 CPUs (a
    # container's limit; cpu.shares high, so that the thread gets its core on this shared machine,
    # where others kept the host's 2 CPUs full and the host's idle time read nil): the service may
    # use 1.8 CPUs and uses about one.  Expected numbers: pidstat's own rows (threads.csv, process.csv).
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.cfs_period_us").write_text("100000")
    (cpu / "cpu.cfs_quota_us").write_text(str(int(QUOTA_CPUS * 100000)))
    (cpu / "cpu.shares").write_text("262144")
    target = start_demo_target("--mode", "onnx", "--request-threads", "1", "--intra-op-threads", "1")
    (cpu / "cgroup.procs").write_text(str(target.pid))
    summary, run_dir = short_run(target, tmp_path, "one-thread", [1, 2, 4])
    steps = {s["users"]: s for s in summary["steps"]}
    top = {u: top_thread_means(run_dir, s) for u, s in steps.items()}
    # the CPUs it used: the cgroup's counters where the cpuacct controller records them, else pidstat's
    used = {u: next(iter(s["server"].values())).get("cgroup_cpus") or window_means(run_dir, s, ["cpu_pct"])["cpu_pct"] / 100
            for u, s in steps.items()}
    print("busiest thread %CPU:", top, "cgroup CPUs used:", used, summary["findings"])
    ev = only(summary, "single_thread_bound")["evidence"]
    u = ev["users"]
    assert ev["service_cpus"] == pytest.approx(QUOTA_CPUS) and u >= 2
    assert ev["top_thread_cpu_pct"] == pytest.approx(top[u], rel=1e-3) and top[u] >= 90.0
    assert ev["idle_cpus"] == pytest.approx(QUOTA_CPUS - used[u], rel=1e-2) and ev["idle_cpus"] >= 0.5
    assert "cpu_saturated" not in ids(summary)  # the service had CPU to spare: one thread, not the CPU


WEIGHTS_MIB = 32 * (1024 * 1024 + 1024) * 4 / 2**20  # the demo model's hidden layers (--work 32, --hidden 1024)


@pytest.mark.long
@pytest.mark.slow
def test_a_model_copy_per_concurrent_request_is_model_copies(cgroup_v1, start_demo_target, tmp_path):
    # The ONNX target (4 request threads, one intra-op thread each) with --model-copy-per-request:
    # a request runs on a session of its own, from a pool that opens one more whenever none is free,
    # so the model's weights (32 layers of 1024 x 1024 float32: 128 MiB, more once ONNX Runtime has
    # packed them) are in memory once per request served at the same time: at 1, 2, 3 users, 1, 2,
    # 3 copies.  One token per request and a quota of 1 CPU keep the other CPU for the load generator
    # (at 4 users on this shared machine it could not hold the load: Little's law off by 15-27 %, the
    # step not valid); the longer settle lets the copy opened at a step's start land before its window.
    # Expected numbers: the kernel's RSS as pidstat read it per step, fitted with numpy, and the
    # sessions the target says it opened.
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.cfs_period_us").write_text("100000")
    (cpu / "cpu.cfs_quota_us").write_text("100000")
    target = start_demo_target("--mode", "onnx", "--request-threads", "4", "--intra-op-threads", "1",
                               "--tokens", "1", "--model-copy-per-request")
    (cpu / "cgroup.procs").write_text(str(target.pid))
    summary, run_dir = short_run(target, tmp_path, "copies", [1, 2, 3], **{"load.hold": 5.0, "load.settle": 2.0})
    copies = target.metrics()['kneeswarm_target_faults_total{kind="model_copy"}']
    rss = [(s["users"], window_means(run_dir, s, ["rss_mb"])["rss_mb"]) for s in summary["steps"]]
    print("copies opened:", copies, "(users, RSS MiB):", rss, ids(summary))
    assert copies == 2 and all(s["valid"] for s in summary["steps"]), [s["reasons"] for s in summary["steps"]]
    users, mib = np.array([u for u, _ in rss], dtype=float), np.array([m for _, m in rss])
    slope = np.polyfit(users, mib, 1)[0]
    assert (mib[-1] - mib[0]) / copies >= 0.95 * WEIGHTS_MIB  # each copy holds at least the weights
    ev = only(summary, "model_copies")["evidence"]
    assert ev["metric"] == "rss_mb" and (ev["from_users"], ev["to_users"]) == (1, 3)
    assert ev["mb_per_user"] == pytest.approx(slope, rel=1e-3) and ev["r2"] >= 0.9


@pytest.mark.long
@pytest.mark.slow
def test_a_bounded_queue_that_refuses_past_its_capacity_is_queue_pushback(start_demo_target, tmp_path):
    # The knee-mode target (4 slots of 50 ms: 80/s) with a queue of 2 in front, users thinking 50 ms
    # between requests: 4 users ask for 40/s and are never refused; 10 ask for 100/s, past what the
    # slots serve, and the full queue answers 503 (without think time a refused user retries at
    # once, 95 % of the requests fail and the step is not valid).  Expected numbers: the 503 rows,
    # the target's own rejection counter; unbounded_queue stays silent (the queue has a bound).
    target = start_demo_target("--mode", "knee", "--slots", "4", "--service-ms", "50", "--queue-size", "2")
    # held 8 s, not short_run's 3: at ~1 refusal/s a 3-s window holds ~3, and the counter's once-a-second
    # scrapes may take or leave a second's refusals at each end (CI saw 0.5/s against the rows' 1.03/s);
    # over ~7 s those ends are ~25 % of the count, inside the bound below
    summary, _ = short_run(target, tmp_path, "pushback", [4, 10],
                           **{"metrics_url": target.url + "/metrics", "load.wait_ms": 50.0, "load.hold": 8.0})
    rejected = target.metrics()["kneeswarm_target_rejected_total"]
    refused = {s["users"]: (s.get("errors") or {}).get("http_5xx", 0) / s["window_s"] for s in summary["steps"]}
    print("503/s in the rows per step:", refused, "rejected in all:", rejected, summary["findings"])
    assert rejected > 0 and refused[4] == 0 and refused[10] > 0
    ev = only(summary, "queue_pushback")["evidence"]
    assert (ev["from_users"], ev["to_users"]) == (4, 10) and ev["rejected_s_from"] == 0
    # the target's counter, scraped once a second, over a ~7 s window: within a scrape's worth of the rows'
    assert ev["rejected_s_to"] == pytest.approx(refused[10], rel=0.5), (ev, refused)
    assert "unbounded_queue" not in ids(summary)


def window_p99(run_dir: Path, step: dict) -> float:
    """numpy's P99 of the answered requests' latency (the rows) sent in a step's steady window."""
    import pyarrow.parquet as pq

    t = pd.concat([pq.read_table(p, columns=["t_start", "latency_ms", "ok"]).to_pandas()
                   for p in sorted((run_dir / "requests").glob("part-*.parquet"))])
    w = t[(t["t_start"] >= step["t_lo"]) & (t["t_start"] < step["t_hi"]) & t["ok"].astype(bool)]
    return float(np.percentile(w["latency_ms"], 99))


@pytest.mark.long
@pytest.mark.slow
def test_open_loop_past_capacity_into_an_unbounded_queue_is_unbounded_queue(start_demo_target, tmp_path):
    # The knee-mode target (2 slots of 50 ms: 40/s) with no bound on its queue, offered 10/s and then
    # 80/s on an open loop (arrivals on a schedule, latency from the intended send time): past
    # capacity the queue grows by ~40 a second and every request waits longer than the one before,
    # none refused.  Expected numbers: the target's refusals (none) and queue length (/metrics),
    # numpy's P99 over the rows.
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "50")
    summary, run_dir = short_run(target, tmp_path, "unbounded", [1, 8],
                                 **{"load.arrivals": "open", "load.rates": [10, 80], "load.source_rate": 10.0,
                                    "metrics_url": target.url + "/metrics"})
    m = target.metrics()
    first, last = summary["steps"]
    p99 = [window_p99(run_dir, s) for s in (first, last)]
    print("QPS:", [s["qps"] for s in summary["steps"]], "P99 (numpy):", p99, summary["findings"])
    assert m["kneeswarm_target_rejected_total"] == 0
    ev = only(summary, "unbounded_queue")["evidence"]
    assert ev["p99_ms_from"] == pytest.approx(p99[0], rel=0.02) and ev["p99_ms_to"] == pytest.approx(p99[1], rel=0.02)
    assert p99[1] >= 10 * p99[0] and ev["rejected"] == 0 and ev["queue_length"] > 2
    assert "queue_pushback" not in ids(summary)


USL_T_MS, USL_S, USL_K = 50.0, 0.1, 0.1  # the USL target's T, σ, κ: N* = √((1 − σ)/κ) = 3 users


def usl_qps(n: int) -> float:
    """The USL target's closed-loop QPS at n users: n / (T (1 + σ(n − 1) + κ n (n − 1)))."""
    return n / (USL_T_MS / 1000.0 * (1 + USL_S * (n - 1) + USL_K * n * (n - 1)))


@pytest.mark.long
@pytest.mark.slow
def test_a_curve_falling_past_its_peak_is_retrograde(start_demo_target, tmp_path):
    # The USL target with a large coherency cost (κ 0.1): QPS peaks at N* = 3 users (33/s) and falls
    # to 22/s at 8 (the closed form: 34 % less), well beyond the steps' counting resolution (users /
    # window, ~3/s here; the suite's USL fit test, at 10/s and κ 0.02, falls 8-11 %: within it).
    # Expected numbers: the closed form for where the peak is, the steps' own QPS for the drop.
    target = start_demo_target("--mode", "usl", "--sigma", str(USL_S), "--kappa", str(USL_K),
                               "--service-ms", str(USL_T_MS))
    # 10 users: a tail step (when the load stops, its requests still in flight are never recorded,
    # and Little's law may mark it not valid: measured 89 % at a last step of 8), not required
    summary, _ = short_run(target, tmp_path, "retro", [1, 3, 8, 10])
    qps = {s["users"]: s["qps"] for s in summary["steps"]}
    print("QPS:", qps, "closed form:", {n: round(usl_qps(n), 1) for n in qps}, summary["findings"],
          [(s["users"], s["reasons"]) for s in summary["steps"]])
    valid = {s["users"]: s["qps"] for s in summary["steps"] if s["valid"]}
    assert max(qps, key=qps.get) == 3 and {1, 3, 8} <= set(valid), summary["steps"]
    # the client's own turn-around per request (1-10 ms on this busy host) reads as a few % less QPS
    assert all(qps[n] == pytest.approx(usl_qps(n), rel=0.15) for n in (1, 3, 8)), qps
    assert only(summary, "retrograde")["support"] == 1.0  # confirmed: past the threshold in every resample
    ev = only(summary, "retrograde")["evidence"]
    worst = min((u for u in valid if u > 3), key=valid.get)
    assert (ev["peak_users"], ev["users"]) == (3, worst)
    assert ev["drop"] == pytest.approx(1 - qps[worst] / qps[3], rel=1e-3) and ev["drop"] >= 0.05


def kernel_migration_count(pid: int) -> int:
    """The kernel's migrations of ``pid``'s live threads: se.nr_migrations of each
    /proc/PID/task/TID/sched, summed (read here, independently of the agent's sampler)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "sched").read_text()
        except OSError:
            continue  # the thread exited
        total += int(next(x for x in text.splitlines() if x.startswith("se.nr_migrations ")).split(":")[1])
    return total


class AffinityFlipper(threading.Thread):
    """Moves every thread of ``pid`` to the other CPU (sched_setaffinity; half of them on each,
    so that the process keeps both) every ``period`` seconds when ``flip``, and records (time,
    the kernel's migration count) every RECORD_PERIOD seconds."""

    RECORD_PERIOD = 0.05

    def __init__(self, pid: int, flip: bool, cpu_group: Path, period: float = 0.004):
        super().__init__(daemon=True)
        self.pid, self.flip, self.period, self.cpu_group = pid, flip, period, cpu_group
        self.stop = threading.Event()
        self.series: list[tuple[float, int]] = []

    def run(self) -> None:
        # this thread alone joins the target's cpu group (v1 "tasks" takes a thread id): with
        # the target's weight it is not starved by the target it moves
        (self.cpu_group / "tasks").write_text(str(threading.get_native_id()))
        k, next_record = 0, 0.0
        while not self.stop.is_set():
            if self.flip:
                for i, task in enumerate(Path(f"/proc/{self.pid}/task").iterdir()):
                    try:
                        os.sched_setaffinity(int(task.name), {(i + k) % 2})
                    except OSError:
                        pass  # the thread exited
                k += 1
            if time.monotonic() >= next_record:
                self.series.append((time.time(), kernel_migration_count(self.pid)))
                next_record = time.monotonic() + self.RECORD_PERIOD
            self.stop.wait(self.period)
        for task in Path(f"/proc/{self.pid}/task").iterdir():  # back to every CPU
            try:
                os.sched_setaffinity(int(task.name), range(os.cpu_count() or 1))
            except OSError:
                pass


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("flip", [True, False], ids=["moved", "left-alone"])
def test_threads_moved_between_cpus_are_migrations_high_by_the_kernels_count(cgroup_v1, start_demo_target, tmp_path,
                                                                              flip):
    # The ONNX target computing for 1 and 2 users, its threads moved to the other CPU every 4 ms by
    # the test (sched_setaffinity) or left to the scheduler.  The agent's /proc sampler reads each
    # thread's se.nr_migrations; the test reads the same counters itself meanwhile, and every row's
    # migrations/s must be the kernel's increase over that row's span.  Moved: migrations_high, its
    # figure per CPU-second the service used; left alone: silent.  In a v1 cpu cgroup with a high
    # cpu.shares (no quota), so that the target computes on this shared machine: the rule reads
    # only a process using half a CPU or more (without it: 26-49 % CPU while other tests ran).
    if not Path(f"/proc/{os.getpid()}/sched").exists() or (os.cpu_count() or 1) < 2:
        pytest.skip("needs /proc/PID/sched (CONFIG_SCHED_DEBUG) and 2 CPUs")
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.shares").write_text("262144")
    target = start_demo_target("--mode", "onnx", "--request-threads", "2", "--intra-op-threads", "1")
    (cpu / "cgroup.procs").write_text(str(target.pid))
    flipper = AffinityFlipper(target.pid, flip, cpu)
    flipper.start()
    try:
        summary, run_dir = short_run(target, tmp_path, f"migr-{flip}", [1, 2], collectors=["vmstat", "procfs"])
    finally:
        flipper.stop.set()
        flipper.join()
    proc = pd.read_csv(next(run_dir.glob("hosts/*/process*.csv")))
    rows = proc[np.isfinite(proc["migrations_s"])]
    assert (rows["migrations_counted"] == 1.0).all()  # the kernel's counter, not the sampled one
    t, count = np.array(flipper.series).T
    spans = [(a, b, m) for a, b, m in zip(rows["t"][:-1], rows["t"][1:], rows["migrations_s"][1:])
             if t[0] <= a and b <= t[-1]]
    assert len(spans) >= 4, spans
    for a, b, m in spans:  # the kernel's increase over the row's span, per second
        expected = (np.interp(b, t, count) - np.interp(a, t, count)) / (b - a)
        assert m == pytest.approx(expected, rel=0.1, abs=2.0), (a, b, m, expected)
    host = next(iter(summary["hosts"].values()))
    assert host["migrations_counted"] == "kernel"
    assert "migrations/s: the kernel's count (se.nr_migrations" in (run_dir / "report" / "summary.md").read_text()
    servers = {s["users"]: next(iter(s["server"].values())) for s in summary["steps"]}
    per_cpu = {u: m["migrations_s"] / (m["cpu_pct"] / 100) for u, m in servers.items()}
    print(f"flip={flip}: by step (users: migrations/s, CPU %, per CPU-second) "
          f"{[(u, round(m['migrations_s']), round(m['cpu_pct']), round(per_cpu[u])) for u, m in servers.items()]}; "
          f"findings {sorted(ids(summary))}")
    if flip:
        assert "migrations_high" in ids(summary), (per_cpu, summary["findings"])
        ev = only(summary, "migrations_high")["evidence"]
        assert ev["per_cpu_s"] == pytest.approx(per_cpu[ev["users"]], rel=0.01)
    else:
        assert "migrations_high" not in ids(summary), (per_cpu, summary["findings"])


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")  # /proc/PID/stat's utime and stime are in clock ticks


class WorkerWatch:
    """The Locust workers this test's run starts, watched from outside: every 0.1 s the kernel's
    CPU time of each (/proc/PID/stat utime + stime, all its threads); with ``cgroup``, each worker
    is moved into it as soon as it is seen.  A context manager: watches while the run runs."""

    def __init__(self, cgroup: Path | None = None):
        import threading

        self.cgroup, self.samples = cgroup, {}  # {pid: [(t, cpu seconds)]}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> WorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        import psutil

        while not self._stop.wait(0.1):
            for p in psutil.Process().children(recursive=True):
                try:
                    if "--worker" not in p.cmdline():
                        continue
                    fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
                except (psutil.Error, OSError):
                    continue
                if p.pid not in self.samples and self.cgroup is not None:
                    (self.cgroup / "cgroup.procs").write_text(str(p.pid))
                self.samples.setdefault(p.pid, []).append((time.time(), (int(fields[11]) + int(fields[12])) * TICK_S))

    def cpu_pct(self, lo: float, hi: float) -> dict[int, float]:
        """Each worker's CPU over [lo, hi], % of one core, from the kernel's counts (interpolated);
        only the workers watched over all of it."""
        out = {}
        for pid, s in self.samples.items():
            t, cpu = np.array(s).T
            if t[0] <= lo and t[-1] >= hi:
                out[pid] = 100.0 * (np.interp(hi, t, cpu) - np.interp(lo, t, cpu)) / (hi - lo)
        return out


def generator_span(run_dir: Path, step: dict) -> tuple[float, float]:
    """The seconds the step's generator samples cover: each sample is the CPU since the one before
    (the worker's first, since the sampler began: a second before it)."""
    t = pd.read_csv(run_dir / "generator" / "worker-0.csv")["t"].to_numpy()
    inside = np.flatnonzero((t >= step["t_lo"]) & (t < step["t_hi"]))
    first, last = inside[0], inside[-1]
    return (t[first - 1] if first > 0 else t[first] - 1.0), t[last]


def test_the_generators_cpu_is_the_kernels_count_of_its_worker(start_demo_target, tmp_path):
    # Reported: a worker at 1,580 QPS read only 19 % CPU.  Measured here: 32 users against a fast
    # knee target (64 slots of 1 ms); the step's generator_cpu_max (the worker's own psutil samples)
    # against the kernel's utime + stime of the worker over the same seconds, read from outside.
    target = start_demo_target("--mode", "knee", "--slots", "64", "--service-ms", "1")
    with WorkerWatch() as watch:
        summary, run_dir = short_run(target, tmp_path, "gencpu", [32])
    step = summary["steps"][0]
    (kernel,) = watch.cpu_pct(*generator_span(run_dir, step)).values()
    print(f"{step['qps']:.0f} QPS: generator_cpu_max {step['generator_cpu_max']:.1f} %, the kernel {kernel:.1f} %")
    assert step["generator_cpu_max"] == pytest.approx(kernel, abs=3.0)


GENERATOR_QUOTA = 0.2  # cores the worker's cgroup may use: about half what 32 users need here


def test_a_worker_held_to_its_cpu_quota_is_generator_bound(cgroup_v1, start_demo_target, tmp_path):
    # The worker (not the target) in a v1 cpu cgroup of 0.2 core (cpu.shares high, so that it gets
    # them on this shared machine): unconfined it needs ~0.4 core for 32 users, so the generator is
    # the bottleneck.  Measured before the fix: 1,572 QPS at 19 % of a core -- silent, as reported.
    # Expected numbers: the kernel's utime + stime of the worker over the samples' seconds, divided
    # by the quota written here.
    cpu = cgroup_v1("cpu")
    (cpu / "cpu.cfs_period_us").write_text("100000")
    (cpu / "cpu.cfs_quota_us").write_text(str(int(GENERATOR_QUOTA * 100000)))
    (cpu / "cpu.shares").write_text("262144")
    # the target with the same weight and no quota: other work on this machine must not slow it
    # into the bottleneck instead (measured: a worker at 89 % of its quota, waiting on the target)
    target = target_in_cpu_quota(cgroup_v1, start_demo_target, 100000, -1, "--slots", "64", "--service-ms", "1")
    with WorkerWatch(cgroup=cpu) as watch:
        summary, run_dir = short_run(target, tmp_path, "genquota", [32])
    step = summary["steps"][0]
    (kernel,) = watch.cpu_pct(*generator_span(run_dir, step)).values()
    share = kernel / GENERATOR_QUOTA
    print(f"{step['qps']:.0f} QPS: generator_cpu_max {step['generator_cpu_max']:.1f} %, the kernel {kernel:.1f} % "
          f"of a core = {share:.1f} % of the quota; {summary['findings']}")
    assert share > 90, "the quota did not bind: the worker used less than it may"  # the setup, not the code
    # generator_cpu_max is the largest of the worker's 1-s samples, the kernel's figure the mean over them:
    # a 1-s sample may hold the quota's runtime of 11 CFS periods of 100 ms (one split at each end), 110 %,
    # and a 10-ms tick is 5 % of a sample's 0.2 s (seen here: 102.3 against a mean of 96.0); one tick below it
    assert share - 6.0 <= step["generator_cpu_max"] <= share + 16.0, (step["generator_cpu_max"], share)
    ev = only(summary, "generator_bound")["evidence"]
    assert ev["worker"] == "worker-0" and ev["cpu_pct"] == pytest.approx(step["generator_cpu_max"], abs=0.1)
    assert step["valid"] is False and any("load generator CPU" in r for r in step["reasons"])
