"""Collectors: golden tests on recorded output, the live tools, and parsers that never raise."""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta, timezone
from pathlib import Path

import pandas as pd
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collectors
from agents.remote import SAMPLERS
from collectors import COLLECTORS, Parsed, get, parse_raw
from collectors.base import (GPU_COLUMNS, GPU_PROC_COLUMNS, PROCESS_COLUMNS, THREAD_COLUMNS,
                             VMSTAT_COLUMNS)
from collectors.prometheus import parse_exposition, scrapes_to_frame
from conftest import wait_for

FIX = Path(__file__).parent / "fixtures" / "collectors"
GPU = Path(__file__).parent / "fixtures" / "gpu"
UTC = timezone.utc

FIXTURES: dict[str, list[Path]] = {
    "pidstat": [FIX / "pidstat-12.6.1-t.txt", FIX / "pidstat-12.6.1.txt",
                FIX / "pidstat-12.6.1-sections.txt", FIX / "pidstat-10.1.5-t-handmade.txt"],
    "vmstat": [FIX / "vmstat-procps-4.0.2.txt", FIX / "vmstat-procps-4.0.2-narrow-CET.txt",
               FIX / "vmstat-procps-3.3.10-handmade.txt"],
    "dmon": [GPU / "dmon-pucvmet-DT.txt", GPU / "dmon-pucm.txt"],
    "query_gpu": [GPU / "query-gpu.csv"],
    "nvml": [GPU / "nvml.jsonl"],
    "procfs": [FIX / "procfs-psutil.jsonl"],
    "prometheus": [FIX / "prometheus-client-0.x.jsonl"],
    "cgroup": [FIX / "cgroup-v1-recorded.jsonl"],
}


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def at(df: pd.DataFrame, t: float) -> pd.DataFrame:
    return df[(df["t"] - t).abs() < 0.5]


# ---- registry and interface ------------------------------------------------------------------

def test_registry_holds_every_collector_with_the_same_interface():
    assert set(COLLECTORS) == set(FIXTURES)
    for name, c in COLLECTORS.items():
        assert c.name == name and c.raw_file and c.kind in ("command", "sampler")
        assert get(name) is c and collectors.by_raw_file(c.raw_file) is c
        if c.kind == "command":
            argv, env = c.command(1234, 1.0)
            assert argv[0] in ("pidstat", "vmstat", "nvidia-smi") and env["LC_ALL"] == "C"
            assert c.check_argv()
        else:
            assert c.command(1234, 1.0) is None and c.check_argv() is None
            assert (c.sampler or c.name) in SAMPLERS  # the remote agent implements it
    with pytest.raises(KeyError, match="unknown collector 'iostat'"):
        get("iostat")


def test_commands_are_the_documented_ones():
    argv, env = get("pidstat").command(42, 1)
    assert argv == ["pidstat", "-H", "-h", "-u", "-r", "-w", "-t", "-p", "42", "1"]
    assert env["S_TIME_FORMAT"] == "ISO" and env["LC_ALL"] == "C"
    assert get("pidstat").command(42, 2.0, version="11.2.0")[0][1] == "-h"  # no -H before 11.6
    assert get("vmstat").command(None, 1)[0] == ["vmstat", "-n", "-t", "-w", "1"]
    assert get("dmon").command(None, 1)[0] == ["nvidia-smi", "dmon", "-d", "1", "-o", "DT",
                                               "-s", "pucvmet"]
    assert get("query_gpu").command(None, 1)[0][-2:] == ["-lms", "1000"]


def test_version_parsers():
    assert get("pidstat").version_from("sysstat version 12.6.1\n(C) Sebastien Godard") == "12.6.1"
    assert get("vmstat").version_from("vmstat from procps-ng 4.0.2\n") == "4.0.2"
    assert get("vmstat").version_from("procps-ng version 3.3.10\n") == "3.3.10"
    assert get("dmon").version_from(read(GPU / "nvidia-smi-info.txt")) == "580.159.04"
    assert get("dmon").version_from("NVIDIA System Management Interface -- v470.57.02") == \
        "470.57.02"
    assert get("vmstat").version_from("garbage") is None


# ---- pidstat ---------------------------------------------------------------------------------

def test_pidstat_threads_fixture_process_and_thread_tables():
    p = parse_raw("pidstat", read(FIX / "pidstat-12.6.1-t.txt"))
    assert p.skipped == 0 and p.lines == 44
    proc, thr = p.frames["process"], p.frames["threads"]
    assert list(proc.columns) == PROCESS_COLUMNS and list(thr.columns) == THREAD_COLUMNS
    assert len(proc) == 6 and (proc["pid"] == 4041).all()
    first = proc.iloc[0]
    assert first["t"] == 1796002081.0 and first["cpu_pct"] == 96.0 and first["threads"] == 4
    assert first["rss_mb"] == pytest.approx(11320 / 1024)
    # context switches and %wait (run delay): the process row holds the main thread's only (its
    # %wait 0.00 while spin0-2 waited 3.00 each); the table sums threads
    assert first["wait_pct"] == 3.0 + 3.0 + 3.0
    assert first["cswch_s"] == 115 + 99 + 108 and first["nvcswch_s"] == 60 + 51 + 47
    assert math.isnan(first["migrations_s"])
    spin0 = thr[(thr["name"] == "spin0") & (thr["t"] == 1796002081.0)].iloc[0]
    assert spin0["tid"] == 4043 and spin0["cpu_pct"] == 48.0 and spin0["core"] == 0
    assert set(thr["name"]) == {"python", "spin0", "spin1", "spin2"}
    assert len(thr) == 24


def test_pidstat_migrations_count_threads_that_changed_core():
    p = parse_raw("pidstat", read(FIX / "pidstat-12.6.1-t.txt"))
    thr, proc = p.frames["threads"], p.frames["process"]
    cores = thr.pivot(index="t", columns="tid", values="core")
    expected = (cores.diff().iloc[1:] != 0).sum(axis=1).to_numpy()
    assert list(proc["migrations_s"].iloc[1:]) == list(expected.astype(float))
    assert proc["migrations_s"].iloc[1] == 2.0  # 01:28:02: spin0 0->1, spin2 1->0


def test_pidstat_migrations_on_crafted_text_with_gap():
    text = textwrap.dedent("""\
        Linux 6.1.0 (h) \t2026-01-01 \t_x86_64_\t(8 CPU)

        # Time        UID      TGID       TID    %usr %system  %guest   %wait    %CPU   CPU  Command
        1000      0       10         -   50.00   10.00    0.00    0.00   60.00     0  srv
        1000      0         -        10    0.00    0.00    0.00    0.00    0.00     0  |__srv
        1000      0         -        11   30.00    5.00    0.00    0.00   35.00     1  |__worker 1
        1000      0         -        12   20.00    5.00    0.00    0.00   25.00     2  |__worker 2

        # Time        UID      TGID       TID    %usr %system  %guest   %wait    %CPU   CPU  Command
        1002      0       10         -   50.00   10.00    0.00    0.00   60.00     0  srv
        1002      0         -        10    0.00    0.00    0.00    0.00    0.00     3  |__srv
        1002      0         -        11   30.00    5.00    0.00    0.00   35.00     1  |__worker 1
        1002      0         -        12   20.00    5.00    0.00    0.00   25.00     5  |__worker 2
        1002      0         -        13   20.00    5.00    0.00    0.00   25.00     6  |__new
        """)
    p = parse_raw("pidstat", text)
    proc = p.frames["process"]
    assert p.skipped == 0 and list(proc["threads"]) == [3.0, 4.0]
    # tids 10 and 12 moved, 11 stayed, 13 is new: 2 migrations over 2 s
    assert proc["migrations_s"].iloc[1] == pytest.approx(1.0)
    assert "worker 1" in set(p.frames["threads"]["name"])  # command names may hold spaces
    assert math.isnan(proc["rss_mb"].iloc[0])  # no -r: NaN, not an error


def test_pidstat_without_threads_option():
    p = parse_raw("pidstat", read(FIX / "pidstat-12.6.1.txt"))
    proc = p.frames["process"]
    assert p.skipped == 0 and len(proc) == 6 and p.frames["threads"].empty
    assert list(proc["cpu_pct"]) == [96.0, 100.0, 91.0, 89.0, 86.0, 79.0]
    assert proc["threads"].isna().all() and proc["migrations_s"].isna().all()


def test_pidstat_sectioned_output_is_merged_by_time_and_task():
    p = parse_raw("pidstat", read(FIX / "pidstat-12.6.1-sections.txt"))
    proc, thr = p.frames["process"], p.frames["threads"]
    assert p.skipped == 0 and len(proc) == 3
    row = proc.iloc[0]
    assert row["t"] == 1796002341.0  # 01:32:21 on the banner's date, UTC
    assert row["cpu_pct"] == 64.0 and row["rss_mb"] == pytest.approx(11432 / 1024)
    assert row["cswch_s"] == 71 + 57 + 68 and row["nvcswch_s"] == 139 + 88 + 69
    spin0 = thr[(thr["tid"] == 5903)].iloc[0]
    assert spin0["cpu_pct"] == 35.0 and spin0["cswch_s"] == 71.0 and spin0["core"] == 1
    # HH:MM:SS is read in the zone given
    shifted = parse_raw("pidstat", read(FIX / "pidstat-12.6.1-sections.txt"),
                        tz=timezone(timedelta(hours=2)))
    assert shifted.frames["process"]["t"].iloc[0] == 1796002341.0 - 7200


def test_pidstat_sysstat10_format_handmade():
    p = parse_raw("pidstat", read(FIX / "pidstat-10.1.5-t-handmade.txt"))
    proc = p.frames["process"]
    assert p.skipped == 0 and len(proc) == 3 and (proc["pid"] == 9591).all()
    assert proc["t"].iloc[0] == 1530099976.0 and proc["cpu_pct"].iloc[0] == 152.0
    assert proc["wait_pct"].isna().all()  # no %wait before sysstat 11.5.5
    assert list(proc["threads"]) == [4.0, 4.0, 4.0]
    assert proc["migrations_s"].iloc[1:].tolist() == [2.0, 1.0]
    assert proc["cswch_s"].iloc[0] == 120 + 230 + 40


# ---- vmstat ----------------------------------------------------------------------------------

def test_vmstat_wide_procps4():
    p = parse_raw("vmstat", read(FIX / "vmstat-procps-4.0.2.txt"))
    v = p.frames["vmstat"]
    assert p.skipped == 0 and list(v.columns) == VMSTAT_COLUMNS + ["gu"]
    assert len(v) == 5  # the since-boot line is dropped
    assert v["t"].iloc[0] == 1796002081.0
    third = v.iloc[2]
    assert third["t"] == 1796002083.0 and third["cs"] == 714 and third["in"] == 610
    assert third["r"] == 1 and third["us"] == 46 and third["id"] == 55


def test_vmstat_zone_named_in_header_beats_local_zone(monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        v = get("vmstat").parse(read(FIX / "vmstat-procps-4.0.2.txt")).frames["vmstat"]
        assert v["t"].iloc[0] == 1796002081.0  # header says UTC
        cet = get("vmstat").parse(read(FIX / "vmstat-procps-4.0.2-narrow-CET.txt"))
        # 02:29:30 read as New York time (UTC-5) = 07:29:30 UTC
        assert cet.frames["vmstat"]["t"].iloc[0] == 1796002170.0 + 6 * 3600
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_vmstat_narrow_cet_without_gu():
    p = parse_raw("vmstat", read(FIX / "vmstat-procps-4.0.2-narrow-CET.txt"),
                  tz=timezone(timedelta(hours=1)))
    v = p.frames["vmstat"]
    assert "gu" not in v.columns and len(v) == 3
    assert v["t"].iloc[0] == 1796002170.0  # 02:29:30 CET = 01:29:30 UTC
    assert v["id"].tolist() == [100.0, 100.0, 100.0] and v["cs"].tolist() == [88.0, 98.0, 70.0]


def test_vmstat_procps3_handmade_and_untimed():
    v = parse_raw("vmstat", read(FIX / "vmstat-procps-3.3.10-handmade.txt")).frames["vmstat"]
    assert list(v.columns) == VMSTAT_COLUMNS and len(v) == 3
    assert v["t"].iloc[1] == 1530099977.0 and v["cs"].iloc[1] == 3120 and v["r"].iloc[1] == 5
    untimed = "\n".join(line[:-20] for line in read(FIX / "vmstat-procps-3.3.10-handmade.txt")
                        .splitlines()[1:])
    u = get("vmstat").parse(untimed, t0=100.0).frames["vmstat"]
    assert u["t"].tolist() == [100.0, 101.0, 102.0]
    assert get("vmstat").parse(untimed).frames["vmstat"]["t"].isna().all()


# ---- GPU -------------------------------------------------------------------------------------

def test_dmon_with_date_time():
    p = parse_raw("dmon", read(GPU / "dmon-pucvmet-DT.txt"))
    g = p.frames["gpu"]
    assert p.skipped == 0 and list(g.columns) == GPU_COLUMNS and len(g) == 23
    row = at(g, 1796001890.0).iloc[0]  # 20261130 01:24:50
    assert row["sm_pct"] == 100 and row["power_w"] == 367 and row["fb_used_mb"] == 1011
    assert row["sm_clock_mhz"] == 1500 and row["mem_clock_mhz"] == 3201 and row["temp_c"] == 52
    assert g["gpu"].dtype.kind == "i"
    assert at(p.frames["dmon"], 1796001891.0)["pviol"].iloc[0] == 99


def test_dmon_dash_is_nan_and_columns_found_by_name():
    text = textwrap.dedent("""\
        #Date       Time        gpu     sm    pwr   fb  gtemp
        #YYYYMMDD   HH:MM:SS    Idx      %      W   MB      C
         20261130   01:24:50      0    100      -  1011     52
         20261130   01:24:50      1      -     80     0      -
        """)
    g = get("dmon").parse(text, tz=UTC).frames["gpu"]
    assert g["sm_pct"].iloc[0] == 100 and math.isnan(g["power_w"].iloc[0])
    assert math.isnan(g["sm_pct"].iloc[1]) and g["power_w"].iloc[1] == 80
    assert math.isnan(g["mem_pct"].iloc[0])  # column not printed at all
    assert (g["t"] == 1796001890.0).all()


def test_dmon_without_timestamps_needs_t0():
    text = read(GPU / "dmon-pucm.txt")
    g = parse_raw("dmon", text).frames["gpu"]
    assert len(g) == 25 and g["t"].isna().all()
    assert g["power_w"].iloc[0] == 95 and g["sm_pct"].iloc[6] == 99
    g0 = parse_raw("dmon", text, t0=1000.0).frames["gpu"]
    assert g0["t"].iloc[0] == 1000.0 and g0["t"].iloc[24] == 1024.0
    two_gpus = "# gpu sm\n# Idx %\n 0 1\n 1 2\n 0 3\n 1 4\n"
    assert get("dmon").parse(two_gpus, t0=0.0).frames["gpu"]["t"].tolist() == [0, 0, 1, 1]


def test_query_gpu_csv():
    p = parse_raw("query_gpu", read(GPU / "query-gpu.csv"))
    g = p.frames["gpu"]
    assert p.skipped == 0 and len(g) == 24
    row = at(g, 1796001890.095).iloc[0]
    assert row["t"] == pytest.approx(1796001890.095)
    assert row["power_w"] == 177.93 and row["sm_pct"] == 66 and row["fb_used_mb"] == 1011
    assert row["sm_clock_mhz"] == 1515 and math.isnan(row["mem_clock_mhz"])  # not queried
    na = "timestamp, index, power.draw [W]\n2026/11/30 01:24:45.085, 0, [N/A]\n"
    assert math.isnan(get("query_gpu").parse(na, tz=UTC).frames["gpu"]["power_w"].iloc[0])


def test_nvml_jsonl():
    p = parse_raw("nvml", read(GPU / "nvml.jsonl"))
    g, procs = p.frames["gpu"], p.frames["gpu_procs"]
    assert p.skipped == 0 and len(g) == 22 and list(procs.columns) == GPU_PROC_COLUMNS
    row = at(g, 1796001890.221).iloc[0]
    assert row["power_w"] == pytest.approx(240.696) and row["sm_pct"] == 66
    assert row["fb_used_mb"] == pytest.approx(1704853504 / 2 ** 20) and row["temp_c"] == 51
    assert procs["t"].min() == pytest.approx(1796001890.221)  # no processes before
    first = procs.iloc[0]
    assert first["pid"] == 428 and first["sm_pct"] == 45
    assert first["used_mb"] == pytest.approx(1050673152 / 2 ** 20)
    line = '{"t": 5, "gpu": 1, "util": null, "procs": [[7, null]], "proc_util": null}'
    q = get("nvml").parse(line)
    assert math.isnan(q.frames["gpu"]["sm_pct"].iloc[0])
    assert math.isnan(q.frames["gpu_procs"]["used_mb"].iloc[0])


# ---- procfs (the agent's /proc sampler format) -------------------------------------------------------------------------

def test_procfs_differences_counters_into_rates():
    lines = [
        '{"t": 100.0, "pid": 7, "utime": 1000, "stime": 100, "clk_tck": 100, "rss_kb": 2048,'
        ' "vsz_kb": 4096, "threads": 2, "vol_cs": 10, "invol_cs": 5, "minflt": 0, "majflt": 0,'
        ' "ncpu": 4, "wait_ns": 0, "tasks": [[7, "m", 0, 0, 0, 1, 1], [8, "w", 1000, 100, 1, 9, 4]]}',
        '{"t": 102.0, "pid": 7, "utime": 1300, "stime": 120, "clk_tck": 100, "rss_kb": 3072,'
        ' "vsz_kb": 4096, "threads": 2, "vol_cs": 210, "invol_cs": 45, "minflt": 50, "majflt": 2,'
        ' "ncpu": 4, "wait_ns": 400000000, "tasks": [[7, "m", 0, 0, 0, 1, 1],'
        ' [8, "w", 1300, 120, 3, 209, 44]]}',
        'not json', '{"t": 103.0, "pid": 7, "utime": 5}',
    ]
    p = get("procfs").parse("\n".join(lines))
    proc = p.frames["process"]
    assert len(proc) == 2 and p.skipped == 1
    r = proc.iloc[0]
    assert r["t"] == 102.0 and r["cpu_pct"] == 160.0 and r["usr_pct"] == 150.0
    assert r["sys_pct"] == 10.0 and r["wait_pct"] == 20.0 and r["rss_mb"] == 3.0
    assert r["cswch_s"] == 100.0 and r["nvcswch_s"] == 20.0 and r["minflt_s"] == 25.0
    assert r["migrations_s"] == 0.5 and r["threads"] == 2
    thr = p.frames["threads"]
    w = thr[thr["tid"] == 8].iloc[0]
    assert w["cpu_pct"] == 160.0 and w["core"] == 3 and w["name"] == "w"
    # a counter that went down (5 < 1300) or is missing gives NaN, never a negative rate
    assert math.isnan(proc.iloc[1]["cpu_pct"]) and math.isnan(proc.iloc[1]["sys_pct"])


def test_procfs_recorded_by_psutil_sampler():
    p = parse_raw("procfs", read(FIX / "procfs-psutil.jsonl"))
    proc = p.frames["process"]
    assert p.skipped == 0 and len(proc) >= 3 and (proc["cpu_pct"] > 10).all()
    assert (proc["threads"] == 4).all()
    assert set(p.frames["threads"]["name"]) >= {"spin0", "spin1", "spin2"}


def test_prometheus_exposition_and_scrapes():
    text = ('# TYPE req counter\nreq_total{route="/a",code="200"} 3\nup 1\n'
            'lat_bucket{le="0.5"} 2\nbroken line here\n')
    flat = parse_exposition(text)
    assert flat['req_total{code="200",route="/a"}'] == 3.0 and flat["up"] == 1.0
    assert flat['lat_bucket{le="0.5"}'] == 2.0
    df = scrapes_to_frame([(1.0, "up 1\n"), (2.0, "up 0\nother 5\n")])
    assert df.columns[0] == "t" and df["up"].tolist() == [1.0, 0.0]
    assert math.isnan(df["other"].iloc[0])
    p = parse_raw("prometheus", read(FIX / "prometheus-client-0.x.jsonl"))
    prom = p.frames["prometheus"]
    assert len(prom) == 3 and p.skipped == 1  # the failed scrape
    assert prom['demo_requests_total{route="/infer"}'].tolist() == [10.0, 30.0, 60.0]
    assert prom['demo_latency_seconds_bucket{le="0.5"}'].tolist() == [1.0, 2.0, 2.0]


def test_prometheus_skipped_counts_raw_lines_never_more_than_read():
    bad = "up 1\n" + "".join(f"garbage line {i} {{\n" for i in range(5))  # 5 bad exposition lines
    text = "\n".join(json.dumps(r) for r in ({"t": 1.0, "text": bad}, {"t": 2.0, "text": "up 0\n"})) + "\n"
    p = parse_raw("prometheus", text)
    assert p.lines == 2 and p.skipped == 1  # one raw line only partly read; not 5 of 2
    assert p.frames["prometheus"]["up"].tolist() == [1.0, 0.0]


# ---- live tools ------------------------------------------------------------------------------

BUSY = textwrap.dedent("""\
    import threading, time
    def spin():
        while True:
            end = time.time() + 0.2
            while time.time() < end: pass
            time.sleep(0.05)
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    time.sleep(60)
    """)
LIVE_SECONDS = 3.3


@pytest.mark.skipif(not (shutil.which("pidstat") and shutil.which("vmstat")),
                    reason="pidstat/vmstat not installed")
def test_live_pidstat_and_vmstat_on_a_busy_process(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    procs = []
    try:
        wait_for(lambda: psutil.Process(busy.pid).num_threads() == 3, 10, "the busy process's two spinning threads")
        t_start = time.time()
        for name in ("pidstat", "vmstat"):
            c = get(name)
            argv, env = c.command(busy.pid, 1)
            out = open(tmp_path / c.raw_file, "w")
            procs.append((name, subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                                 stderr=subprocess.STDOUT), out))
        time.sleep(LIVE_SECONDS)
        for _, proc, _ in procs:
            proc.send_signal(signal.SIGINT)
        for _, proc, out in procs:
            proc.wait(timeout=10)
            out.close()
        t_end = time.time()
    finally:
        busy.kill()
        busy.wait()
        for _, proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    ps = parse_raw("pidstat", (tmp_path / "pidstat.txt").read_text())
    proc_df = ps.frames["process"]
    assert ps.skipped == 0 and len(proc_df) >= 2
    assert (proc_df["pid"] == busy.pid).all() and (proc_df["cpu_pct"] > 0).all()
    assert (proc_df["threads"] == 3).all()
    assert proc_df["t"].between(t_start - 1, t_end + 1).all()
    vm = parse_raw("vmstat", (tmp_path / "vmstat.txt").read_text())
    v = vm.frames["vmstat"]
    assert vm.skipped == 0 and len(v) >= 2
    assert v["t"].between(t_start - 1, t_end + 1).all() and (v["us"] + v["sy"] > 0).all()


# ---- parsers never raise ---------------------------------------------------------------------

class _ErrorLog(logging.Handler):
    """Catches the last-resort guard of a parser: a bad line must be skipped, not crash it."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _parse_checked(name: str, text: str) -> Parsed:
    log, logger = _ErrorLog(), logging.getLogger("collectors")
    logger.addHandler(log)
    try:
        parsed = COLLECTORS[name].parse(text)
    finally:
        logger.removeHandler(log)
    assert not log.messages, log.messages
    return parsed


def _check(parsed: object, name: str) -> None:
    assert isinstance(parsed, Parsed)
    assert parsed.skipped <= parsed.lines
    for table in COLLECTORS[name].tables:
        df = parsed.frames[table]
        assert isinstance(df, pd.DataFrame) and df.columns[0] == "t"


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(COLLECTORS)), text=st.text(max_size=400))
def test_every_parser_survives_arbitrary_text(name, text):
    _check(_parse_checked(name, text), name)


GARBAGE = st.one_of(st.sampled_from(["-", "", "nan", "1e999", "9" * 30, "²", "|__", "#", "{",
                                     "null", "[1]", "Command", "TGID", "r", "AM", "0", "-1",
                                     '"t"', "Linux", "##", ":", "25:99:99", "2026-13-40"]),
                    st.text(max_size=12))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_parser_survives_mutated_fixtures(data):
    name = data.draw(st.sampled_from(sorted(FIXTURES)))
    lines = read(data.draw(st.sampled_from(FIXTURES[name]))).splitlines()
    for _ in range(data.draw(st.integers(0, 8))):
        if not lines:
            break
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "field", "dup", "cut", "swap"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][:data.draw(st.integers(0, max(0, len(lines[i]))))]
        elif op == "swap":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            sep = "," if name == "query_gpu" else " "
            fields = lines[i].split(sep)
            k = data.draw(st.integers(0, len(fields) - 1))
            fields[k] = data.draw(GARBAGE)
            lines[i] = sep.join(fields)
    _check(_parse_checked(name, "\n".join(lines)), name)
