"""The run directory's readers never hide bad data: unreadable request parts and meta.json."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from kneeswarm import analysis
from kneeswarm.contracts.rundir import RunDir, write_csv
from synthetic_run import closed_loop, make_run


def corrupt_pages(path, keep_footer: bool = True) -> int:
    """Garble a part: its data pages (the footer still readable), or cut it in half (footer gone).
    Returns the number of rows it held, counted by pyarrow before the damage."""
    rows = pq.read_metadata(path).num_rows
    data = bytearray(path.read_bytes())
    if keep_footer:
        data[8:408] = b"\xff" * 400
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    return rows


def test_torn_part_is_listed_with_unknown_range(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    corrupt_pages(rd.request_parts()[1], keep_footer=False)
    got = rd.read_request_rows()
    assert [p.path.name for p in got.unreadable] == ["part-000001.parquet"]
    bad = got.unreadable[0]
    assert bad.rows is None and bad.t_range is None and bad.step_range is None
    assert len(got.frame) == pq.read_metadata(rd.request_parts()[0]).num_rows


def test_torn_part_invalidates_every_step_and_is_counted(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2, 4))
    corrupt_pages(rd.request_parts()[1], keep_footer=False)
    s = analysis.analyze(rd.path)
    assert s["lost"] == {"request_parts": 1}
    assert s["complete"] is False
    assert [st["valid"] for st in s["steps"]] == [False, False, False]
    for st in s["steps"]:
        assert "request rows lost: requests/part-000001.parquet is unreadable, time range unknown" in st["reasons"]
    assert any(w.startswith("requests/part-000001.parquet: unreadable") and "time range unknown" in w
               for w in s["warnings"])


def test_garbled_part_with_footer_invalidates_only_its_step(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2, 4))  # one part per step
    rows = corrupt_pages(rd.request_parts()[2])
    s = analysis.analyze(rd.path)
    assert [st["valid"] for st in s["steps"]] == [True, True, False]
    assert s["steps"][2]["reasons"][-1] == "request rows lost: requests/part-000002.parquet is unreadable"
    assert s["steps"][0]["reasons"] == s["steps"][1]["reasons"] == []
    assert s["lost"] == {"request_parts": 1} and s["complete"] is False
    assert any(f"{rows:,} rows lost (steps 2..2)" in w for w in s["warnings"])
    md = (rd.report_dir / "summary.md").read_text()
    assert md.index("part-000002.parquet") < md.index("**Knee:**")


def test_corrupt_meta_is_kept_aside_not_overwritten(tmp_path):
    rd = RunDir.create(tmp_path, "m")
    garbage = b'{"run_id": "x", "hosts": {"a": '  # torn mid-write
    rd.meta_path.write_bytes(garbage)
    meta = rd.read_meta()
    assert meta["complete"] is False and meta["warnings"][0].startswith("meta.json: unreadable")
    assert rd.meta_path.read_bytes() == garbage  # reading changes nothing
    new = rd.update_meta(ended="completed", complete=True)
    assert (rd.path / "meta.json.corrupt").read_bytes() == garbage
    assert new["complete"] is False and new["ended"] == "completed"
    assert "kept as meta.json.corrupt" in new["warnings"][0]
    assert json.loads(rd.meta_path.read_text()) == new
    rd.meta_path.write_bytes(b"[1, 2]")  # valid JSON but not an object: corrupt too, a second copy
    rd.update_meta(x=1)
    assert (rd.path / "meta.json.corrupt").read_bytes() == garbage
    assert (rd.path / "meta.json.corrupt.2").read_bytes() == b"[1, 2]"


def test_corrupt_meta_reaches_the_summary(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    rd.meta_path.write_text("{not json")
    rd.update_meta(run_id=rd.path.name, complete=True, ended="completed")
    s = analysis.analyze(rd.path)
    assert s["complete"] is False
    assert s["lost"] == {"meta_json": 1}
    assert any("kept as meta.json.corrupt" in w for w in s["warnings"])
    assert any(w.startswith("meta.json.corrupt: meta.json was unreadable") for w in s["warnings"])


def test_readable_parts_are_all_read(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    got = rd.read_request_rows()
    assert got.unreadable == []
    expected = sum(pq.read_metadata(p).num_rows for p in rd.request_parts())
    assert len(got.frame) == expected and np.all(np.diff(got.frame["t_start"].to_numpy()) >= 0)


def test_host_tables_name_the_preferred_file_first(tmp_path):
    rd = RunDir.create(tmp_path, "h")
    hd = rd.host_dir("server-1")
    hd.mkdir(parents=True)
    for name in ("process.procfs.csv", "process.csv", "vmstat.csv", "threads.procfs.csv"):
        (hd / name).write_text("t,x\n1,2\n")
    (hd / "gpu.csv").write_text("")  # empty: not a table
    assert rd.host_tables("server-1") == {"process": [None, "procfs"], "threads": ["procfs"], "vmstat": [None]}


def test_unreadable_preferred_table_falls_back_and_is_said(tmp_path):
    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    hd = rd.host_dir("server-1")
    good = (hd / "process.csv").read_bytes()
    (hd / "process.procfs.csv").write_bytes(good)
    (hd / "process.csv").write_bytes(b"\xff\xfe\x00" * 50)
    s = analysis.analyze(rd.path)
    assert s["steps"][1]["server"]["server-1"]["cpu_pct"] == 150.0  # from process.procfs.csv
    assert any(w.startswith("hosts/server-1/process.csv: unreadable, skipped") for w in s["warnings"])
    assert s["lost"] == {"host_csvs": 1} and s["complete"] is False


def test_a_part_write_on_a_full_disk_raises_and_leaves_no_temporary_file(small_disk):
    """A real full tmpfs: the write fails with OSError ENOSPC, the one error the recorder holds rows
    for and retries (anything else counts them lost), no half-written file is left, and the retry
    works once there is room."""
    import errno

    import pytest

    rd = RunDir(small_disk.path / "run")
    rd.requests_dir.mkdir(parents=True)
    n = 20_000
    rng = np.random.default_rng(0)
    cols = {"t_start": 1.8e9 + np.arange(n) / 100.0, "latency_ms": rng.exponential(20.0, n), "ok": [True] * n,
            "error": [None] * n, "step": np.zeros(n, dtype=np.int32)}
    small_disk.fill()
    with pytest.raises(OSError) as err:
        rd.write_request_part(cols, 0)
    assert err.value.errno == errno.ENOSPC
    assert list(rd.requests_dir.iterdir()) == []
    small_disk.free()
    rd.write_request_part(cols, 0)  # the retry, once there is room
    assert len(rd.read_requests()) == n


def test_read_csv_latest_reads_the_whole_latest_sample_from_the_end(tmp_path):
    """The live view's read of a growing host CSV: the rows at the latest t, even where that sample
    is larger than the first tail read (3 x 4,000 thread rows, ~70 kB each), and not a last line
    still being appended."""
    from kneeswarm.contracts.rundir import read_csv_latest

    rows = [(100.0 + s, 1000 + k, f"w{k}", k % 97 + 0.5) for s in range(3) for k in range(4000)]
    path = tmp_path / "threads.csv"
    write_csv(path, ["t", "tid", "name", "cpu_pct"], rows)
    whole = pd.read_csv(path)
    expected = whole[whole["t"] == 102.0].reset_index(drop=True)
    assert len(expected) == 4000 and path.stat().st_size > 3 * 65536
    with path.open("a") as f:
        f.write("103.0,1000,w0,4")  # cut: no newline yet
    pd.testing.assert_frame_equal(read_csv_latest(path), expected)
    assert read_csv_latest(tmp_path / "missing.csv") is None
