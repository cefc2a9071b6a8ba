"""The pieces that run inside Locust, tested alone: step schedule, error categories, row writer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kneeswarm.rundir import REQUEST_COLUMNS, RunDir
from locustfiles.protocols import KServeV2, BadPayload
from locustfiles.recorder import WIRE_COLUMNS, RequestWriter, RowBuffer, categorize
from locustfiles.steps import StepSchedule


def test_schedule_holds_each_step_from_when_its_users_are_running():
    s = StepSchedule([1, 2, 4], ramp=2.0, hold=10.0)
    assert s.tick(0.0, 0) == (1, 1.0)
    assert s.tick(5.0, 0) == (1, 1.0)  # users not running yet: no clock started
    s.spawned(6.0)
    assert s.tick(15.0, 1) == (1, 1.0)
    assert s.tick(16.0, 1) == (2, 1.0)  # 6 + 10: next step, ramp of 1 user over 2 s
    assert s.tick(17.0, 2) == (2, 1.0)  # all 2 running: steady from here even without the event
    assert s.log[1].t_steady == 17.0
    assert s.tick(27.0, 2) == (4, 1.0)
    s.spawned(28.0)
    assert s.tick(38.0, 4) is None and s.done
    assert [r.row() for r in s.log] == [(0, 1, 0.0, 6.0, 16.0), (1, 2, 16.0, 17.0, 27.0), (2, 4, 27.0, 28.0, 38.0)]


def test_spawn_rate_spreads_the_step_over_the_ramp():
    s = StepSchedule([1, 2, 16, 64], ramp=4.0, hold=1.0)
    assert [s.spawn_rate(i) for i in range(4)] == [1.0, 1.0, 3.5, 12.0]
    assert StepSchedule([8], ramp=0.0, hold=1.0).spawn_rate(0) == 8.0


def test_every_change_is_reported_for_steps_csv():
    seen = []
    s = StepSchedule([1, 2], ramp=1.0, hold=1.0, on_change=lambda log: seen.append([r.row() for r in log]))
    s.tick(0.0, 0)
    s.spawned(0.5)
    s.finish(3.0)
    assert seen[-1] == [(0, 1, 0.0, 0.5, 3.0)]


@pytest.mark.parametrize(
    "status, exc, category",
    [
        (200, None, None),
        (404, Exception("HTTP 404"), "http_4xx"),
        (503, Exception("HTTP 503"), "http_5xx"),
        (200, BadPayload("no outputs"), "bad_payload"),
        (0, ConnectionRefusedError(111, "Connection refused"), "conn_refused"),
        (0, ConnectionResetError(104, "Connection reset by peer"), "conn_reset"),
        (0, TimeoutError("timed out"), "timeout"),
        (0, ValueError("weird"), "other"),
    ],
)
def test_error_categories(status, exc, category):
    assert categorize(status, exc) == category


def test_rows_are_stamped_with_their_step_and_written(tmp_path):
    run = RunDir.create(tmp_path, "w")
    buf = RowBuffer()

    class Resp:
        status_code = 200

    for t in (9.0, 10.5, 12.0, 20.0):
        buf.on_request("POST", "infer", 12.5, 100, Resp(), None, None, start_time=t)
    buf.on_request("POST", "infer", 3.0, 0, type("R", (), {"status_code": 503})(), None, Exception("HTTP 503"), start_time=21.0)
    writer = RequestWriter(run, lambda: [(10.0, 1), (20.0, 2)])
    writer.add("worker-0", buf.take())
    assert buf.take()["t_start"] == []
    assert writer.flush() == 5 and writer.flush() == 0
    df = run.read_requests()
    assert list(df.columns) == list(REQUEST_COLUMNS)
    assert list(df["step"]) == [-1, 0, 0, 1, 1]
    assert list(df["users"]) == [0, 1, 1, 2, 2]
    assert list(df["ok"]) == [True, True, True, True, False]
    assert df["error"].iloc[-1] == "http_5xx" and df["status"].iloc[-1] == 503
    assert set(df["worker"]) == {"worker-0"} and df["ttft_ms"].isna().all()


def test_rows_of_several_workers_are_merged_in_one_part(tmp_path):
    run = RunDir.create(tmp_path, "w")
    writer = RequestWriter(run, lambda: [(0.0, 4)])
    for w, n in (("worker-0", 3), ("worker-1", 2)):
        b = RowBuffer()
        for i in range(n):
            b.on_request("POST", "infer", 1.0, 1, None, {"kneeswarm": (5, 7, 2.5)}, None, start_time=1.0 + i)
        writer.add(w, b.take())
    writer.add("worker-2", RowBuffer().take())  # an empty report adds nothing
    assert writer.flush() == 5
    df = run.read_requests()
    assert sorted(df["worker"]) == ["worker-0"] * 3 + ["worker-1"] * 2
    assert set(df["tokens_in"]) == {5} and set(df["tokens_out"]) == {7} and set(df["ttft_ms"]) == {2.5}
    assert len(run.request_parts()) == 1 and set(WIRE_COLUMNS) <= set(df.columns)


def test_kserve_bodies_follow_the_plan_and_answers_are_checked():
    p = KServeV2({"model": "m", "shape": [2, 3], "datatype": "FP32", "data": "random", "seed": 7}, seed=1)
    req = p.next_request()
    doc = json.loads(req.body)
    assert req.path == "/v2/models/m/infer"
    assert doc["inputs"][0]["shape"] == [2, 3] and len(doc["inputs"][0]["data"]) == 6
    assert KServeV2({"shape": [2, 3], "seed": 7}, seed=1).next_request().body == req.body  # reproducible
    assert KServeV2({"shape": [2, 3], "seed": 7}, seed=2).next_request().body != req.body  # per user
    p.check_response(b'{"outputs": [{"name": "o", "data": [1]}]}')
    for bad in (b"<html>", b'{"outputs": []}', b"[]"):
        with pytest.raises(BadPayload):
            p.check_response(bad)


def rows_with_ids(ids) -> dict:
    """A worker's columns whose t_start is 1000 + the row's id (so the rows on disk can be named)."""
    b = RowBuffer()
    for i in ids:
        b.on_request("POST", "infer", 1.0, 1, None, None, None, start_time=1000.0 + i)
    return b.take()


def test_rows_of_a_failed_write_are_held_retried_and_counted(small_disk, monkeypatch):
    """A full disk (a real tmpfs): rows are held and written once there is room; beyond
    MAX_HELD_ROWS the oldest are dropped, and every row is either on disk or counted lost."""
    from locustfiles import recorder

    monkeypatch.setattr(recorder, "MAX_HELD_ROWS", 500)
    run = RunDir.create(small_disk.path, "full")
    writer = RequestWriter(run, lambda: [(0.0, 1)])
    writer.add("worker-0", rows_with_ids(range(0, 300)))
    assert writer.flush() == 300
    small_disk.fill()
    writer.add("worker-0", rows_with_ids(range(300, 600)))
    assert writer.flush() == 0 and writer.rows_held == 300 and writer.rows_lost == 0
    writer.add("worker-0", rows_with_ids(range(600, 900)))
    assert writer.flush() == 0 and writer.rows_held == 500 and writer.rows_lost == 100  # 300..399 dropped
    assert writer.failed_writes == 2 and "No space left" in writer.last_error
    small_disk.free()
    writer.add("worker-0", rows_with_ids(range(900, 950)))
    assert writer.flush() == 550
    on_disk = run.read_requests()["t_start"].to_numpy()
    expected = 1000.0 + np.r_[0:300, 400:950]
    assert np.array_equal(np.sort(on_disk), expected)
    assert writer.rows_received == len(on_disk) + writer.rows_lost == 950
    small_disk.fill()  # full again at the very end: what is still held is lost, and counted
    writer.add("worker-0", rows_with_ids(range(950, 960)))
    assert writer.flush() == 0 and writer.abandon() == 10
    assert writer.rows_lost == 110 and writer.rows_held == 0
    small_disk.free()
    assert len(run.read_requests()) == writer.rows_received - writer.rows_lost
