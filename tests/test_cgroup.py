"""Containers and CPU quotas (a service CPU-bound at its quota): the agent's cgroup sampler, its parser, the CPUs
the service may use, and the rules ``cpu_throttled`` and ``memory_limit_near``.

The real runs put the demo target in a v1 cgroup created here (root, the cpu controller writable)
with a quota of half a CPU; the truth is the kernel's own cpu.stat, read by the test itself. The
v2 files are hand-written from the kernel's documented formats (tests/fixtures/cgroup-v2/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kneeswarm.analysis.findings import explain
from kneeswarm.analysis.measure.hostfacts import host_facts, service_limits
from kneeswarm.collectors import get
from tests.conftest import release_cgroups

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agents"))
import remote  # noqa: E402  (the agent package, imported under the name its zipapp gives it)

FIX = Path(__file__).parent / "fixtures"
V2 = FIX / "cgroup-v2"
V1_RECORDED = FIX / "collectors" / "cgroup-v1-recorded.jsonl"
POD = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7f3c.slice"
GIB = 1 << 30


# -- reading the hierarchy --------------------------------------------------------------------
def v2_sampler(tmp_path: Path) -> tuple[remote.CgroupSampler, dict[str, str], Path]:
    root = tmp_path / "fs"
    shutil.copytree(V2 / "fs", root)
    s = remote.CgroupSampler("cgroup", str(tmp_path / "cgroup.jsonl"), 1.0, threading.Event(), pid=1)
    s.mounts = remote.cgroup_mounts((V2 / "mountinfo").read_text().replace("/sys/fs/cgroup", str(root)))
    return s, remote.cgroup_paths((V2 / "proc-pid-cgroup").read_text()), root


def test_v2_files_give_the_tightest_quota_its_counters_cpuset_and_memory_limit(tmp_path):
    s, paths, root = v2_sampler(tmp_path)
    row: dict = {}
    s.read(paths, row)
    # the pod's 150000/100000 is tighter than the container's 200000/100000: its level's counters
    assert row["version"] == 2 and row["cpu_dir"] == str(root / POD)
    assert (row["quota_us"], row["period_us"]) == (150000, 100000)
    assert (row["nr_periods"], row["nr_throttled"], row["throttled_ns"]) == (1200, 300, 45_000_000_000)
    assert row["usage_ns"] == 81_234_567_000
    assert (row["cpuset"], row["cpuset_n"]) == ("0-3", 4)
    assert row["mem_limit"] == GIB and row["mem_usage"] == 805306368  # the container's 1 GiB < the pod's 2


def test_v2_samples_parse_into_throttled_periods_and_the_service_cpus(tmp_path):
    s, paths, root = v2_sampler(tmp_path)
    lines = []
    for t, (periods, throttled, usec) in enumerate([(1200, 300, 45_000_000), (1210, 308, 45_400_000)]):
        (root / POD / "cpu.stat").write_text(f"usage_usec {81234567 + t * 1_500_000}\nuser_usec 1\nsystem_usec 1\n"
                                             f"nr_periods {periods}\nnr_throttled {throttled}\n"
                                             f"throttled_usec {usec}\nnr_bursts 0\nburst_usec 0\n")
        row = {"t": 1000.0 + t, "pid": 1, "ncpu": 64}
        s.read(paths, row)
        lines.append(json.dumps(row))
    df = get("cgroup").parse("\n".join(lines)).frames["cgroup"]
    last = df.iloc[-1]
    assert (last["periods"], last["throttled_periods"]) == (10, 8)
    assert last["throttled_s"] == pytest.approx(0.4) and last["usage_cpus"] == pytest.approx(1.5)
    assert last["quota_cpus"] == 1.5 and last["cpuset_cpus"] == 4 and last["memory_limit_mb"] == 1024
    assert np.isnan(df.iloc[0]["periods"])  # no interval before the first sample
    assert service_limits(df, 64.0) == {"cpus": 1.5, "bound": "quota", "quota_cpus": 1.5, "cpuset_cpus": 4.0,
                                        "host_cpus": 64.0, "memory_limit_mb": 1024.0, "cgroup_version": 2}


def test_under_a_quota_it_samples_every_period_and_reads_the_counters_alone_between_full_samples(tmp_path):
    from kneeswarm.analysis.measure.serverstats import throttled_shares
    from kneeswarm.collectors.cgroup import THROTTLE_INTERVAL

    s, _, root = v2_sampler(tmp_path)
    (tmp_path / "mountinfo").write_text((V2 / "mountinfo").read_text().replace("/sys/fs/cgroup", str(root)))
    s.mountinfo_file, s.cgroup_file = str(tmp_path / "mountinfo"), str(V2 / "proc-pid-cgroup")
    s.throttle_interval = THROTTLE_INTERVAL
    s.setup()
    assert s.interval == pytest.approx(THROTTLE_INTERVAL) and s.full_every == 10
    lines, periods, throttled = [], 1200, 300
    for k in range(21):  # 2 s at 0.1 s: 1 period a sample, throttled in the second half only
        periods, throttled = periods + 1, throttled + (k >= 10)
        (root / POD / "cpu.stat").write_text(f"usage_usec 1\nnr_periods {periods}\nnr_throttled {throttled}\n"
                                             "throttled_usec 0\n")
        lines += [json.dumps(r) for r in s.sample(1000.0 + k / 10)]
    rows = [json.loads(x) for x in lines]
    assert [("quota_us" in r) for r in rows] == [k % 10 == 0 for k in range(21)]  # full at 1 s, counters between
    df = get("cgroup").parse("\n".join(lines)).frames["cgroup"]
    assert df["throttled_periods"].sum() == 11 and set(df["quota_cpus"].dropna()) == {1.5}
    # from 0.5 s to 1.5 s: the periods counted by samples 6..15, those of samples 10..15 throttled
    assert throttled_shares(df, np.array([1000.5]), np.array([1001.5])) == [pytest.approx(6 / 10)]
    # half-way between samples: the counters interpolated (0.55 -> 1.45 s: 9 periods, 5.5 throttled)
    assert throttled_shares(df, np.array([1000.55]), np.array([1001.45])) == [pytest.approx(5.5 / 9)]
    s_none = remote.CgroupSampler("cgroup", "/dev/null", 1.0, threading.Event(), pid=1, throttle_interval=0.1)
    s_none.setup()  # this machine's pid 1: no quota, so the monitor's interval
    assert s_none.interval == 1.0 and s_none.full_every == 1


def test_v1_container_mount_shows_the_container_cgroup_at_its_mount_point():
    # docker without a cgroup namespace: /proc/PID/cgroup names the host path, the mount's root is it
    mounts = remote.cgroup_mounts("31 25 0:27 /docker/4b1e /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup "
                                  "rw,cpu,cpuacct\n32 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                                  "33 25 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n")
    assert mounts["cpu"] == mounts["cpuacct"] == ("/docker/4b1e", "/sys/fs/cgroup/cpu,cpuacct")
    assert "name=systemd" not in mounts and "" not in mounts
    paths = remote.cgroup_paths("12:memory:/docker/4b1e\n4:cpu,cpuacct:/docker/4b1e/sub\n1:name=systemd:/x\n")
    assert remote.cgroup_dir(mounts, paths, "cpu", "cpu.max") == (1, "/sys/fs/cgroup/cpu,cpuacct/sub")
    assert remote.cgroup_dir(mounts, paths, "memory", "memory.max") == (1, "/sys/fs/cgroup/memory/docker/4b1e")
    assert remote.cgroup_dir(mounts, {"cpu": "/elsewhere"}, "cpu", "cpu.max") == (1, "/sys/fs/cgroup/cpu,cpuacct")
    assert remote.cgroup_dir(mounts, paths, "cpuset", "cpuset.cpus.effective") == (None, None)


@pytest.mark.parametrize("text,n", [("0-3,8,10-11", 7), ("0", 1), ("0-63\n", 64), ("", None), ("x-1", None)])
def test_cpuset_lists_are_counted(text, n):
    assert remote.cpuset_count(text) == n


def test_recorded_v1_samples_difference_the_kernel_counters():
    """Recorded here: a busy loop in a v1 cgroup (quota 50000/100000, cpuset 0, 512 MiB), sampled
    by CgroupSampler each second; the process's exit gives the last line, an error."""
    raw = [json.loads(x) for x in V1_RECORDED.read_text().splitlines()]
    parsed = get("cgroup").parse(V1_RECORDED.read_text())
    df = parsed.frames["cgroup"]
    counted = [r for r in raw if "error" not in r]
    assert len(df) == len(counted) and parsed.skipped == 0
    assert list(df["periods"][1:]) == [b["nr_periods"] - a["nr_periods"] for a, b in zip(counted, counted[1:])]
    assert list(df["throttled_periods"][1:]) == [b["nr_throttled"] - a["nr_throttled"]
                                                for a, b in zip(counted, counted[1:])]
    assert set(df["quota_cpus"]) == {0.5} and set(df["cpuset_cpus"]) == {1} and set(df["memory_limit_mb"]) == {512}
    assert service_limits(df, 2.0)["cpus"] == 0.5 and service_limits(df, 2.0)["bound"] == "quota"


@pytest.mark.parametrize("quota,cpuset,host,bound", [(0.5, 2, 2, "quota"), (4.0, 2, 64, "cpuset"),
                                                     (None, None, 2, "host"), (8.0, 16, 8, "host"),
                                                     (None, 2, 2, "host"), (2.0, 2, 8, "quota")])
def test_the_service_may_use_the_smallest_of_quota_cpuset_and_host(quota, cpuset, host, bound):
    df = pd.DataFrame({"t": [1.0, 2.0], "quota_cpus": [quota or np.nan] * 2, "cpuset_cpus": [cpuset or np.nan] * 2})
    got = service_limits(df, float(host))
    assert got["bound"] == bound and got["cpus"] == min(x for x in (quota, cpuset, host) if x)
    assert host_facts({"hosts": {"h": {"facts": {"cpu": {"logical_cpus": host}}}}})["h"]["service"] == {
        "cpus": host, "bound": "host", "host_cpus": host}  # no cgroup table: the host bounds it


# -- the rules on summaries -------------------------------------------------------------------
def summary(server_per_step, service):
    steps = [{"index": i, "users": u, "requests": 400, "qps": 20.0, "rps": 20.0, "p50_ms": 40.0, "p99_ms": 80.0 * u,
              "mean_ms": 40.0, "valid": True, "reasons": [], "errors": {}, "window_s": 20.0,
              "server": {"srv": m}} for i, (u, m) in enumerate(server_per_step)]
    return {"steps": steps, "knee": {"users": None}, "analysis": {"generator_cpu_max": 90.0},
            "hosts": {"srv": {"cpu": {"logical_cpus": 64, "physical_cores": 32}, "service": service}}}


QUOTA = {"cpus": 4.0, "bound": "quota", "quota_cpus": 4.0, "host_cpus": 64.0, "memory_limit_mb": 2048.0}


def test_cpu_throttled_above_its_threshold_only():
    from kneeswarm.analysis.findings.cgroup import CPU_THROTTLED_SHARE

    hot = explain(summary([(1, {"throttled_share": 0.0}), (8, {"throttled_share": 0.62})], QUOTA))
    [f] = [f for f in hot["findings"] if f["id"] == "cpu_throttled"]
    assert f["evidence"]["throttled_share"] == 0.62 and f["evidence"]["service_cpus"] == 4.0
    assert "4 CPUs" in f["text"] and "P99" in f["advice"]
    for share in (CPU_THROTTLED_SHARE, 0.0):
        cold = explain(summary([(1, {"throttled_share": 0.0}), (8, {"throttled_share": share})], QUOTA))
        assert "cpu_throttled" not in {f["id"] for f in cold["findings"]}


def test_memory_limit_near_within_its_margin_only():
    from kneeswarm.analysis.findings.cgroup import MEMORY_LIMIT_MARGIN

    near = 2048.0 * (1 - MEMORY_LIMIT_MARGIN)
    hit = explain(summary([(1, {"rss_mb": 900.0}), (8, {"rss_mb": near + 1})], QUOTA))
    [f] = [f for f in hit["findings"] if f["id"] == "memory_limit_near"]
    assert f["evidence"]["memory_limit_mb"] == 2048 and f["steps"] == [8]
    for service in (QUOTA, {**QUOTA, "memory_limit_mb": None}):
        rss = near - 1 if service is QUOTA else 1e9
        quiet = explain(summary([(1, {"rss_mb": 900.0}), (8, {"rss_mb": rss})], service))
        assert "memory_limit_near" not in {f["id"] for f in quiet["findings"]}


def test_cpu_rules_judge_against_the_cpus_the_service_may_use():
    # 0.48 CPUs of work: idle on a 64-CPU host, saturated under a half-CPU quota
    m = {"us": 1.0, "sy": 0.5, "cpu_pct": 48.0, "r": 1.2, "threads": 4.0}
    half = {"cpus": 0.5, "bound": "quota", "quota_cpus": 0.5, "host_cpus": 64.0}
    got = explain(summary([(1, m), (4, m)], half))
    [sat] = [f for f in got["findings"] if f["id"] == "cpu_saturated"]
    assert sat["evidence"]["service_cpus"] == 0.5 and sat["evidence"]["busy_pct"] == 96.0
    host = explain(summary([(1, m), (4, m)], {"cpus": 64.0, "bound": "host", "host_cpus": 64.0}))
    assert not {"cpu_saturated", "run_queue_over_cores"} & {f["id"] for f in host["findings"]}
    # a period is throttled only once its quota is spent: a quota throttled in every period was full,
    # whatever the sampled CPU (here 0.40 of 0.5)
    full = explain(summary([(1, {**m, "cpu_pct": 40.0}), (4, {**m, "cpu_pct": 40.0, "throttled_share": 1.0})], half))
    [sat] = [f for f in full["findings"] if f["id"] == "cpu_saturated"]
    assert sat["evidence"]["busy_pct"] == 100.0 and sat["steps"] == [4]


# -- real runs --------------------------------------------------------------------------------
CGROUP_V1 = Path("/sys/fs/cgroup")
CPU_CGROUP = CGROUP_V1 / "cpu"
HALF_CPU_QUOTA_US, PERIOD_US = 50000, 100000
# cpu.shares well above the default 1024: the quota still caps the group at half a CPU, but on
# this shared 2-core machine the group reaches that cap however busy the other tests keep it
# (with the default weight a busy host can hold it below 0.5 CPU, and then nothing is throttled).
SHARES = 262144
SETTLE = 1.0
# Users thinking THINK_MS between requests: one leaves the quota unspent (measured: share 0), two
# spend it in some periods only (0.21-0.44: a ratio that a wrong sum would miss), four in all.
THINK_MS = 40.0
HALF_CPU_PLAN = f"""name = "half-cpu"
[load]
steps = [1, 2, 4]
ramp = 1.0
hold = 4.0
settle = {SETTLE}
workers = 1
wait_ms = {THINK_MS}
[analysis]
min_requests = 20
"""
STAT_POLL_S = 0.1
SHARE_TOLERANCE = 0.02  # required: the kernel's share over the step windows, within 2 % (of all periods)


class CpuStatLog:
    """The kernel's cpu.stat of one cgroup read every STAT_POLL_S seconds, stamped with time.time()."""

    def __init__(self, path: Path):
        self.path, self.rows = path, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            kv = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
            self.rows.append((time.time(), int(kv["nr_periods"]), int(kv["nr_throttled"])))
            self.stop.wait(STAT_POLL_S)

    def share(self, t0: float, t1: float) -> float:
        """Throttled periods / periods between t0 and t1 (counters interpolated at both ends)."""
        t, periods, throttled = (np.array(c, dtype=float) for c in zip(*self.rows))
        dp = np.interp(t1, t, periods) - np.interp(t0, t, periods)
        return (np.interp(t1, t, throttled) - np.interp(t0, t, throttled)) / dp


@pytest.fixture
def half_cpu_cgroup():
    """A v1 cpu cgroup with a quota of half a CPU (removed at teardown); skipped where it cannot be made."""
    path = CPU_CGROUP / f"kneeswarm-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {CPU_CGROUP} (needs root and cgroup v1's cpu controller): {e}")
    try:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(HALF_CPU_QUOTA_US))
        (path / "cpu.shares").write_text(str(SHARES))
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():  # anything left goes back to the root
            try:
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        path.rmdir()
    assert not path.exists()


def kernel_vs_summary(run_dir: Path, log: CpuStatLog, summary: dict) -> list[tuple[int, float, float]]:
    """(users, throttled share in summary.json, the kernel's over the step's steady window) per step."""
    steps = pd.read_csv(run_dir / "steps.csv")
    out = []
    for rec, (_, st) in zip(summary["steps"], steps.iterrows()):
        share = next((m.get("throttled_share") for m in rec["server"].values() if "throttled_share" in m), None)
        out.append((rec["users"], share, log.share(st["t_steady"] + SETTLE, st["t_end"])))
    return out


@pytest.mark.long
@pytest.mark.slow
def test_half_cpu_quota_is_throttling_and_cpu_rules_count_half_a_cpu(half_cpu_cgroup, start_demo_target, tmp_path):
    from tests.conftest import read_summary, run_cli

    plan = tmp_path / "half-cpu.toml"
    plan.write_text(HALF_CPU_PLAN)
    target = start_demo_target()
    (half_cpu_cgroup / "cgroup.procs").write_text(str(target.pid))
    log = CpuStatLog(half_cpu_cgroup)
    log.thread.start()
    try:
        res = run_cli("run", str(plan), "--target", target.url, "--pid", str(target.pid), "--out", str(tmp_path),
                      "-q", timeout=180)
    finally:
        log.stop.set()
        log.thread.join()
    assert res.returncode == 0, res.stderr[-3000:]
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = read_summary(run_dir)
    [(host, facts)] = [(h, f) for h, f in summary["hosts"].items() if "cgroup_version" in f.get("service", {})]
    assert facts["service"]["cpus"] == 0.5 and facts["service"]["bound"] == "quota"
    assert facts["service"]["quota_cpus"] == 0.5 and facts["service"]["cgroup_version"] == 1
    pd.DataFrame(log.rows, columns=["t", "nr_periods", "nr_throttled"]).to_csv(tmp_path / "kernel-cpu-stat.csv")
    compared = kernel_vs_summary(run_dir, log, summary)
    print("throttled share (users, summary.json, kernel):", compared)
    for users, ours, kernel in compared:  # the kernel's counters over each step's steady window
        assert ours is not None and abs(ours - kernel) <= SHARE_TOLERANCE, compared
    found = {f["id"]: f for f in summary["findings"]}
    assert "cpu_throttled" in found, summary["findings"]
    ev = found["cpu_throttled"]["evidence"]
    kernel = dict((u, k) for u, _, k in compared)[ev["users"]]
    assert abs(ev["throttled_share"] - kernel) <= SHARE_TOLERANCE and ev["service_cpus"] == 0.5
    print("process CPU per step, % of the half CPU (users, %):",
          [(st["users"], m.get("cpu_pct", 0) / 0.5) for st in summary["steps"] for m in st["server"].values()])
    for fid in ("cpu_saturated", "run_queue_over_cores"):  # ~0.5 CPU of work: full at half a CPU, not at 2
        assert fid in found, summary["findings"]
        ev = found[fid]["evidence"]
        assert ev["service_cpus"] == 0.5 and ev["cpus_bound"] == "quota" and ev["busy_pct"] >= 90, (fid, ev)
    # the cause first: the quota leads, the verdict names it, the rest are folded under it
    assert summary["verdict"]["causes"] == ["cpu_throttled"], (summary["verdict"], summary["findings"])
    assert "quota (0.5 CPUs)" in summary["verdict"]["text"] and summary["findings"][0]["id"] == "cpu_throttled"
    assert all(f.get("explained_by") for f in summary["findings"][1:]), summary["findings"]
    md = (run_dir / "report" / "summary.md").read_text()
    assert "**Cause: `cpu_throttled`" in md
    assert "CPUs the service may use: 0.5 (bound by the cgroup's CPU quota" in md
    assert "CPUs the service may use: 0.5" in (run_dir / "report" / "index.html").read_text()


def _own_cpu_quota() -> bool:
    """Whether this process's v1 cpu cgroup, or v2 cgroup, has a CPU quota (read from the kernel's files)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            q = CPU_CGROUP / path.lstrip("/") / "cpu.cfs_quota_us"
            return q.exists() and int(q.read_text()) > 0
        if controllers == "":
            m = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max"
            return m.exists() and not m.read_text().startswith("max")
    return False


@pytest.mark.slow
def test_no_quota_no_throttling(knee_run):
    """The shared knee-mode run: its target in the root cpu cgroup (no quota) gives no cpu_throttled,
    and the host bounds the CPUs it may use."""
    from tests.conftest import read_summary

    if _own_cpu_quota():
        pytest.skip("the suite itself runs under a CPU quota (a CI container's): the target inherits it")
    summary = read_summary(knee_run.run_dir)
    cgroup = [p for p in knee_run.run_dir.glob("hosts/*/cgroup.csv")]
    assert cgroup, list(knee_run.run_dir.glob("hosts/*/*"))  # the sampler ran on the target's process
    df = pd.read_csv(cgroup[0])
    assert len(df) >= 5 and df["quota_cpus"].isna().all() and (df["periods"].fillna(0) == 0).all()
    services = [f["service"] for f in summary["hosts"].values() if "cgroup_version" in f.get("service", {})]
    assert services and all(s["bound"] == "host" and s["cpus"] == os.cpu_count() for s in services)
    assert "cpu_throttled" not in {f["id"] for f in summary["findings"]}


@pytest.fixture
def cpu_and_cpuacct_apart():
    """The same new group in the v1 cpu and cpuacct hierarchies, mounted apart (as on this
    machine: /sys/fs/cgroup/cpu and /sys/fs/cgroup/cpuacct), the cpu one with half a CPU of quota;
    skipped where they are not two hierarchies or root cannot make the groups."""
    acct_root = CGROUP_V1 / "cpuacct"
    if not (acct_root / "cpuacct.usage").exists() or (CPU_CGROUP / "cpuacct.usage").exists():
        pytest.skip("needs cgroup v1 with cpu and cpuacct mounted apart")
    name = f"kneeswarm-test-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        for root in (CPU_CGROUP, acct_root):
            (root / name).mkdir()
            made.append(root / name)
    except OSError as e:
        pytest.skip(f"cannot create cgroups (needs root): {e}")
    try:
        (CPU_CGROUP / name / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (CPU_CGROUP / name / "cpu.cfs_quota_us").write_text(str(HALF_CPU_QUOTA_US))
        yield made[0], made[1]
    finally:
        release_cgroups(made)


def test_v1_cpu_and_cpuacct_mounted_apart_give_the_quota_and_the_groups_cpu_time(cpu_and_cpuacct_apart, tmp_path):
    # A busy process under half a CPU.  Joined to the cpu group alone (its cpuacct group the root:
    # the whole host's time) the sampler reads the quota and no CPU time; joined to the same group
    # in both it reads that group's cpuacct.usage: the kernel's counter, read by the test around it.
    cpu_dir, acct_dir = cpu_and_cpuacct_apart
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (cpu_dir / "cgroup.procs").write_text(str(burner.pid))
        s = remote.CgroupSampler("cgroup", str(tmp_path / "cgroup.jsonl"), 1.0, threading.Event(), pid=burner.pid)
        s.setup()
        [alone] = s.sample(time.time())
        assert alone["quota_us"] == HALF_CPU_QUOTA_US and alone["cpu_dir"] == str(cpu_dir)
        assert "usage_ns" not in alone, alone  # not the root's (the host's) time
        (acct_dir / "cgroup.procs").write_text(str(burner.pid))
        rows, kernel = [], []
        for _ in range(2):
            before = int((acct_dir / "cpuacct.usage").read_text())
            [row] = s.sample(time.time())
            kernel.append((before, int((acct_dir / "cpuacct.usage").read_text())))
            rows.append(row)
            time.sleep(1.0)
    finally:
        burner.kill()
        burner.wait()
    for row, (lo, hi) in zip(rows, kernel):
        assert row["quota_us"] == HALF_CPU_QUOTA_US and lo <= row["usage_ns"] <= hi, (row, lo, hi)
    table = get("cgroup").parse("\n".join(json.dumps(r) for r in rows)).frames["cgroup"]
    used = table["usage_cpus"].iloc[-1]
    assert used == pytest.approx((rows[1]["usage_ns"] - rows[0]["usage_ns"]) / 1e9 / (rows[1]["t"] - rows[0]["t"]))
    assert 0.2 < used <= 0.55, used  # at most the half CPU of its quota (less on this busy host)
