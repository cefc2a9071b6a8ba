"""Replay of recorded requests ([request] replay): the loader (examples and hypothesis), bad files
through the real console script, and real runs whose received bodies and arrival times the demo
target logs (--request-log)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from test_workload import loaded_or_refused
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.protocols.workload import Replay, WorkloadError, load_replay

TINY_MODEL = ["--work", "1", "--hidden", "64", "--tokens", "1", "--request-threads", "2", "--itl-ms", "1"]


def chat(i: int) -> dict:
    """Record i: its prompt has 3 + i words (the target counts them in usage.prompt_tokens)."""
    return {"messages": [{"role": "user", "content": f"recorded request {i}" + " w" * i}],
            "max_tokens": 2, "stream": True}


def words(i: int) -> int:
    return 3 + i


def write_jsonl(path: Path, docs: list[dict]) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


def received(log: Path, path: str = "/v1/chat/completions") -> list[tuple[float, dict]]:
    """(arrival time, body) of every request the target logged at ``path``, in arrival order."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return sorted((d["t"], json.loads(d["body"])) for d in lines if d["path"] == path)


# -- the loader ---------------------------------------------------------------------------------
def test_recorded_bodies_are_sent_in_file_order_by_every_user_of_a_process(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"body": chat(i)} for i in range(3)]
                       + [{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                           "body": {**chat(3), "model": "other"}}])  # the OpenAI batch-file shape
    plan = plan_from_dict({"protocol": "openai", "request": {"replay": path, "model": "m"}})
    a, b = for_plan(plan, seed=0), for_plan(plan, seed=1)
    sent = [json.loads(u.next_request().body) for u in (a, b, b, a, a)]
    assert sent[:4] == [{"model": "m", **chat(0)}, {"model": "m", **chat(1)}, {"model": "m", **chat(2)},
                        {**chat(3), "model": "other"}]  # a body's own model is kept
    assert sent[4] == sent[0]  # round and round
    r = a.next_request()
    assert r.stream and r.path == "/v1/chat/completions" and r.tokens_in == words(1)


def test_completions_bodies_count_their_prompt_as_recorded(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"body": {"prompt": [101, 7, 9], "max_tokens": 1}},
                                              {"body": {"prompt": ["a b", "c"], "stream": False}},
                                              {"body": {"max_tokens": 1}}])
    p = for_plan(plan_from_dict({"protocol": "openai", "request": {"replay": path, "endpoint": "completions"}}))
    got = [p.next_request() for _ in range(3)]
    assert [r.tokens_in for r in got] == [3, 3, None]  # token ids; words of each string; nothing to count
    assert [r.path for r in got] == ["/v1/completions"] * 3 and not any(r.stream for r in got)


def test_a_timed_recording_keeps_its_gaps_scaled_to_the_rate(tmp_path):
    times = [0.0, 0.1, 0.5, 0.55, 1.5]
    path = write_jsonl(tmp_path / "t.jsonl", [{"t": t, "body": chat(i)} for i, t in enumerate(times)])
    replay = for_plan(plan_from_dict({"protocol": "openai", "request": {"replay": path}})).replay
    assert replay.timed and replay.recorded_rate == pytest.approx(4 / 1.5)
    at = [replay.ticket(2 * replay.recorded_rate, 100.0)[0] for _ in range(7)]  # twice the recorded rate
    gaps = np.diff(at)
    recorded = np.diff(times + [1.5 + 1.5 / 4, 1.5 + 1.5 / 4 + 0.1])  # then the mean gap back to the first, and on
    assert gaps == pytest.approx(recorded / 2)


@pytest.mark.parametrize("lines, message", [
    (["{nope"], "not JSON"),
    (["[1]"], "must be a JSON object"),
    (['{"t": 0.1}'], 'needs "body"'),
    (['{"body": "text"}'], 'needs "body"'),
    (['{"t": 0.5, "body": {}}', '{"t": 0.2, "body": {}}'], "times go back (t = 0.2 after 0.5)"),
    (['{"t": 0.5, "body": {}}', '{"body": {}}'], 'every line needs "t" or none does'),
    (['{"t": -1, "body": {}}'], "t must be a number of seconds >= 0"),
    (['{"t": 1, "body": {}}', '{"t": 1, "body": {}}'], "spans no time"),
    ([""], "no records"),
])
def test_a_bad_recording_is_one_line_naming_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError) as e:
        load_replay(str(path))
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_replay_goes_alone(tmp_path):
    with pytest.raises(PlanError, match="without request.dataset"):
        plan_from_dict({"request": {"replay": "r.jsonl", "dataset": "d.jsonl"}})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=30),
    st.sampled_from(['{"body": {"prompt": "a"}}', '{"t": 0.5, "body": {"messages": []}}', '{"t": 0, "body": {}}',
                     '{"t": 2.5, "body": {"x": 1}, "url": "/v1/completions"}', '{"t": true, "body": {}}',
                     '{"t": 1e400, "body": {}}', '{"body": null}', '{"url": 3, "body": {}}', "null", "{}"]),
    st.builds(lambda t, b: json.dumps({"t": t, "body": b}),
              st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10), st.none()),
              st.one_of(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), st.integers())),
), max_size=10))
def test_the_replay_loader_survives_any_file(tmp_path_factory, lines):
    records = loaded_or_refused(load_replay, tmp_path_factory.mktemp("rp") / "r.jsonl", lines)
    if records is None:
        return
    assert records and all(isinstance(r.body, dict) for r in records)
    times = [r.t for r in records]
    assert all(t is None for t in times) or all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in times)
    if times[0] is not None:
        assert times == sorted(times)
        replay = Replay(records, [None] * len(records))  # type: ignore[list-item]
        if replay.timed:
            at = [replay.ticket(3.0, 0.0)[0] for _ in range(2 * len(records))]
            assert all(b >= a for a, b in zip(at, at[1:])) and math.isfinite(at[-1])


@pytest.mark.parametrize("doc, message", [
    ({"t": 0.5, "body": {}}, "times go back"),
    ("not json at all", "not JSON"),
    ({"t": 1.0}, 'needs "body"'),
    ({"t": 1.0, "url": "/v1/completions", "body": {}}, "but the plan sends to /v1/chat/completions"),
])
def test_a_bad_recording_stops_kneeswarm_run_with_one_line_and_exit_2(tmp_path, doc, message):
    """The real console script, before any load: one line on stderr, exit 2, no run directory."""
    rec = tmp_path / "rec.jsonl"
    rec.write_text(json.dumps({"t": 0.9, "body": chat(0)}) + "\n"
                   + (doc if isinstance(doc, str) else json.dumps(doc)) + "\n")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'target = "http://127.0.0.1:9"\nprotocol = "openai"\n[request]\nreplay = "{rec}"\n')
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert f"{rec}:2" in lines[0] or f"{rec}: request 2" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "runs").exists()


# -- real runs ----------------------------------------------------------------------------------
def run_replay(tmp_path: Path, start_demo_target, load: str, records: list[dict]) -> tuple[Path, Path]:
    log = tmp_path / "received.jsonl"
    target = start_demo_target(*TINY_MODEL, "--request-log", str(log))
    rec = write_jsonl(tmp_path / "recorded.jsonl", records)
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "replay"\ntarget = "{target.url}"\nprotocol = "openai"\n'
                    f'[load]\nworkers = 1\nramp = 0.5\nsettle = 1.0\n{load}[request]\nreplay = "{rec}"\n')
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return run_dir, log


@pytest.mark.slow
def test_closed_loop_replay_sends_the_recorded_bodies_in_order(tmp_path, start_demo_target):
    from kneeswarm.contracts.rundir import RunDir

    records = [{"body": chat(i)} for i in range(5)]
    run_dir, log = run_replay(tmp_path, start_demo_target, "steps = [1]\nhold = 3.0\n", records)
    got = [body for _, body in received(log)]
    expected = [{"model": "demo", **records[k % 5]["body"]} for k in range(len(got))]
    rows = RunDir(run_dir).read_requests()
    print(f"{len(got)} bodies received, {len(rows)} rows")
    assert len(got) >= 10 and got == expected
    assert rows["ok"].all() and len(got) - 1 <= len(rows) <= len(got)  # one may be in flight at the stop
    assert rows.sort_values("t_start")["tokens_in"].tolist() == [words(k % 5) for k in range(len(rows))]


@pytest.mark.long
@pytest.mark.slow
def test_open_loop_replay_keeps_the_recorded_order_and_gaps(tmp_path, start_demo_target):
    """Two steps: the recording's own mean rate, then twice it.  The rows' intended times (numpy
    on t_start) keep every recorded gap, halved in the second step; the bodies arrive in order,
    and the target's own arrival gaps follow the recorded ones."""
    from kneeswarm.contracts.rundir import RunDir

    rng = random.Random(7)
    gaps = [rng.choice([0.02, 0.05, 0.15, 0.3]) for _ in range(29)]
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    n, rate = len(times), float((len(times) - 1) / times[-1])
    records = [{"t": float(t), "body": chat(i)} for i, t in enumerate(times)]
    run_dir, log = run_replay(tmp_path, start_demo_target,
                              f'mode = "open"\nsource_rate = {rate!r}\nrates = [{rate!r}, {2 * rate!r}]\nhold = 5.0\n',
                              records)
    run = RunDir(run_dir)
    rows, steps = run.read_requests().sort_values("t_start").reset_index(drop=True), run.read_steps()
    assert rows["ok"].all(), rows["error"].value_counts()
    # the recorded gap before each request of the endless sequence (the mean gap before a first)
    cyclic = np.concatenate([[times[-1] / (n - 1)], np.diff(times)])
    expected = cyclic[np.arange(len(rows)) % n]
    t = rows["t_start"].to_numpy(dtype=float)
    for k, (_, step) in enumerate(steps.iterrows()):
        inside = np.flatnonzero((t >= step.t_steady + 1.0) & (t < step.t_end))[1:]  # gaps within the window
        err = np.abs(np.diff(t)[inside - 1] - expected[inside] / (k + 1))
        print(f"step {k + 1} ({(k + 1) * rate:.2f} req/s): {len(inside)} gaps, max |gap - recorded/{k + 1}| "
              f"{1000 * err.max():.3f} ms")
        assert len(inside) >= 10 and err.max() < 1e-3
    # In order as sent: the server's own count of each body's words (usage.prompt_tokens, a
    # different number per record) in the order of the rows' intended times.
    assert rows["tokens_in"].tolist() == [words(k % n) for k in range(len(rows))]
    # As received: every request once, none skipped; requests that left together (after a stall of
    # this busy machine) may be read by the target in another order, a few places at most.
    arrivals = received(log)
    order = [int(b["messages"][0]["content"].split()[2]) for _, b in arrivals]
    seq = [j + ((o - j) % n if (o - j) % n <= n // 2 else (o - j) % n - n) for j, o in enumerate(order)]
    assert sorted(seq) == list(range(len(order))) and len(order) >= len(rows)
    print(f"{len(order)} bodies received, {sum(s != j for j, s in enumerate(seq))} out of place, "
          f"at most {max(abs(s - j) for j, s in enumerate(seq))} places")
    assert max(abs(s - j) for j, s in enumerate(seq)) <= 8
    arrived = np.sort([a for a, _ in arrivals])
    measured = np.diff(arrived)[:len(rows) - 1]
    wanted = np.diff(t)[:len(measured)]
    mae = float(np.median(np.abs(measured - wanted)))
    corr = float(np.corrcoef(measured, wanted)[0, 1])
    print(f"target arrival gaps vs planned: median |error| {1000 * mae:.2f} ms, correlation {corr:.3f}")
    assert corr > 0.9 and mae < 0.010
