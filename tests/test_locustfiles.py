"""The pieces that run inside Locust, tested alone: step schedule, error categories, row writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kneeswarm.contracts.rundir import REQUEST_COLUMNS, RunDir
from kneeswarm.locustfiles.protocols import KServeV2, BadPayload
from kneeswarm.locustfiles.recorder import WIRE_COLUMNS, RequestWriter, RowBuffer, categorize
from kneeswarm.locustfiles.steps import StepSchedule

ROOT = Path(__file__).resolve().parent.parent


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


def test_a_step_down_is_steady_only_once_the_stopped_users_are_gone():
    """Going down, the users a step stops finish their request first (recording.STOP_MARGIN_S: Locust's
    stop_timeout) and are counted as running until then: the step's clock starts when no more than its
    users run (or at spawning_complete), not at the first tick, where 8 running >= 5 is already true."""
    s = StepSchedule([8, 5], ramp=0.0, hold=10.0)
    s.tick(0.0, 0)
    s.spawned(0.0)
    assert s.tick(10.0, 8) == (5, 3.0)
    assert s.tick(11.0, 8) == (5, 3.0) and s.log[1].t_steady is None  # the 3 stopped users are in their request
    assert s.tick(12.0, 6) == (5, 3.0) and s.log[1].t_steady is None
    assert s.tick(13.0, 5) == (5, 3.0) and s.log[1].t_steady == 13.0  # all 3 gone
    # a master's spawning_complete comes at most 1 s after its ramp-down, stopped users or not: heeded
    # going down only once no more than the step's users run; going up, as it comes
    s = StepSchedule([8, 5, 6], ramp=0.0, hold=10.0)
    s.tick(0.0, 0)
    s.spawned(0.0, 3)
    assert s.log[0].t_steady == 0.0
    s.tick(10.0, 8)
    s.spawned(11.0, 8)
    assert s.log[1].t_steady is None
    s.spawned(12.0, 5)
    assert s.log[1].t_steady == 12.0


def test_the_last_step_drains_past_its_window_end():
    """The last step's window ends with its hold; its load goes on ``drain()`` seconds more so that
    the requests it started complete (steps.py), then the test stops."""
    seen = []
    s = StepSchedule([1, 2], ramp=0.0, hold=10.0, drain=lambda: 2.5, on_change=lambda log: seen.append(log[-1].t_end))
    s.tick(0.0, 0)
    s.spawned(0.0)
    assert s.tick(10.0, 1) == (2, 1.0)
    s.spawned(10.0)
    assert s.tick(20.0, 2) == (2, 1.0) and not s.done  # the hold is over: same load, window closed
    assert s.log[-1].t_end == 20.0 and seen[-1] == 20.0  # written to steps.csv at once
    assert s.tick(22.0, 2) == (2, 1.0)
    assert s.tick(22.6, 2) is None and s.done
    assert s.log[-1].t_end == 20.0  # the drain is not in the window
    s.finish(23.0)
    assert [r.row() for r in s.log] == [(0, 1, 0.0, 0.0, 10.0), (1, 2, 10.0, 10.0, 20.0)]
    assert StepSchedule([1], ramp=0.0, hold=1.0, drain=lambda: 0.0).tick(0.0, 0) == (1, 1.0)


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
    from kneeswarm.locustfiles import recorder

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


JUDGED_BAD = """
import json
from kneeswarm.locustfiles.users import STALE_CONNECTION_RETRIES, InferenceUser  # Locust first: gevent's patching
from kneeswarm.locustfiles.protocols import BadPayload, PreparedRequest


class Answer:  # Locust's ResponseContextManager, as much of it as users._whole reads
    status_code, content = 200, b'{"outputs": "not a list"}'

    def __init__(self):
        self.request_meta, self.judged = {"exception": None, "context": {}}, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def failure(self, e):
        self.judged.append(type(e).__name__)
        self.request_meta["exception"] = e

    def success(self):
        self.judged.append("ok")


class Client:
    sent = []

    def request(self, *args, **kwargs):
        self.sent.append(Answer())
        return self.sent[-1]


class Judge:
    def check_response(self, body):
        raise BadPayload("no outputs")


user = object.__new__(InferenceUser)
user.client, user.protocol = Client(), Judge()
user._send(PreparedRequest("POST", "/v2/models/m/infer", b"{}"), None)
print(json.dumps({"retries": STALE_CONNECTION_RETRIES, "judged": [a.judged for a in Client.sent]}))
"""


def test_an_answer_judged_bad_is_sent_once():
    # users._whole returned None ("not sent") for an answer the protocol judged bad: the request
    # went out again (STALE_CONNECTION_RETRIES), one task made two requests and two failure rows.
    # (In its own interpreter: Locust must be imported before anything loads ssl.)
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", JUDGED_BAD], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["retries"] >= 1  # else nothing could be sent twice
    assert out["judged"] == [["BadPayload"]]



MASTER_QUIT = """
import json, types
from kneeswarm.locustfiles import prompt  # Locust first: gevent's patching
import gevent

got, at_kill = [], []  # final reports in, in order; what was in when the runner was killed

class Clients(dict):
    @property
    def all(self):
        return list(self.values())

clients = Clients(a=types.SimpleNamespace(id="a"), b=types.SimpleNamespace(id="b"), mute=types.SimpleNamespace(id="mute"))

def send_to_client(msg):
    if msg.node_id != "mute":  # a worker: its final report, then its "quit" (gone from clients)
        gevent.spawn_later(0.05 if msg.node_id == "a" else 0.1, lambda: (got.append(msg.node_id), clients.pop(msg.node_id)))

runner = types.SimpleNamespace(stop=lambda **_kw: None, clients=clients,
                               server=types.SimpleNamespace(send_to_client=send_to_client),
                               greenlet=types.SimpleNamespace(kill=lambda block: at_kill.append(list(got))))
prompt._quit(runner)
left = list(clients)
got.clear()
prompt._quit(runner)  # again (Locust calls it up to four times): only the silent worker to wait for
print(json.dumps({"at_kill": at_kill, "left": left}))
"""


def test_master_quit_waits_for_each_workers_final_report_and_no_longer():
    """locustfiles/prompt.py: MasterRunner.quit ends once every worker told to quit has quit (its
    final report came first), not after a fixed sleep; a worker that never answers does not hold it."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", MASTER_QUIT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["at_kill"][0] == ["a", "b"]  # both final reports in before the runner's greenlets were killed
    assert out["left"] == ["mute"]  # the silent one was waited for (up to Locust's 0.5 s), then left
    assert out["at_kill"][1] == []


def master_quit_source(module_source: str) -> str:
    """The text of ``MasterRunner.quit`` in locust/runners.py's source (read from the file, so
    prompt.install's replacement on the class does not hide it)."""
    import ast

    tree = ast.parse(module_source)
    master = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MasterRunner")
    quit_def = next(n for n in master.body if isinstance(n, ast.FunctionDef) and n.name == "quit")
    return ast.get_source_segment(module_source, quit_def) or ""


def quit_hash(module_source: str) -> str:
    import hashlib

    return hashlib.sha256(master_quit_source(module_source).encode()).hexdigest()


def recorded_quit_hash() -> str:
    """locustfiles/prompt.py's LOCUST_QUIT_SHA256, read from the file (importing it would import
    Locust, whose gevent patching must not reach this process)."""
    import ast

    tree = ast.parse((ROOT / "locustfiles" / "prompt.py").read_text())
    return next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and [getattr(t, "id", None) for t in n.targets] == ["LOCUST_QUIT_SHA256"])


def test_locusts_master_quit_is_the_one_prompt_copied():
    """locustfiles/prompt.py's _quit is Locust's MasterRunner.quit without its fixed sleep: a Locust
    whose quit changed (an upgrade) fails here, so the copy is re-checked, not silently diverging."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("locust")  # finds the package without running it
    assert spec is not None and spec.submodule_search_locations
    source = (Path(spec.submodule_search_locations[0]) / "runners.py").read_text()
    assert quit_hash(source) == recorded_quit_hash(), (
        f"locust {importlib.metadata.version('locust')}'s MasterRunner.quit is not the one locustfiles/prompt.py's "
        "_quit was copied from (locust 2.47.0): re-check _quit against it, then record its sha256 in "
        f"prompt.LOCUST_QUIT_SHA256:\n{master_quit_source(source)}")
    changed = source.replace("gevent.sleep(0.5)  # wait for final stats report", "gevent.sleep(1)  # wait for final stats report")
    assert changed != source and quit_hash(changed) != recorded_quit_hash()  # the probe: a changed quit is caught
