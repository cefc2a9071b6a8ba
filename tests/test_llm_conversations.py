"""Conversations (history resent): ``[request.conversation] turns, think_ms`` against the demo target's engine
model, and a dataset of whole conversations.

Independent truths: the target's request log (--request-log: every body as it arrived), and the
engine model's arithmetic -- one user alone, no prefix cache: a turn whose prompt has P tokens gets
its first token DECODE_MS + P x PREFILL_MS after it arrived.  Turn k of a session of synthetic
20-word messages and 8-token answers carries 20 k + 8 (k - 1) words.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.protocols.sse import ChatStream

from conftest import read_summary, runs_against_targets

DECODE_MS, PREFILL_MS, MESSAGE, ANSWER, TURNS = 5.0, 1.0, 20, 8, 4
ENGINE = ["--kv-tokens", "100000", "--max-batch", "8", "--decode-ms", str(DECODE_MS),
          "--prefill-ms-per-token", str(PREFILL_MS)]
SCRIPT = [  # one whole conversation: a system message, three user turns, recorded answers the live ones replace
    {"role": "system", "content": "you are terse"},
    {"role": "user", "content": "first question here"},
    {"role": "assistant", "content": "recorded answer one"},
    {"role": "user", "content": "second question"},
    {"role": "assistant", "content": "recorded answer two"},
    {"role": "user", "content": "third and last question"},
]


def context_words(turn: int) -> int:
    return MESSAGE * turn + ANSWER * (turn - 1)


def test_a_session_carries_its_history_and_the_answers_it_got():
    p = for_plan(plan_from_dict({"protocol": "openai", "request": {
        "prompt_tokens": 5, "conversation": {"turns": 3, "think_ms": 250}}}), seed=1)
    bodies = []
    for i in range(4):
        r = p.next_request()
        bodies.append(json.loads(r.body)["messages"])
        assert r.turn == i % 3 + 1 and r.tokens_in == sum(len(m["content"].split()) for m in bodies[-1])
        stream = ChatStream(0.0, True, keep_text=True)
        stream.texts.extend(["answer ", f"{i}"])
        p.answered(True, stream)
        assert p.think_s(9.0) == (0.25 if i % 3 < 2 else 9.0)  # think within a session, wait_ms between
    assert bodies[1] == [*bodies[0], {"role": "assistant", "content": "answer 0"}, bodies[1][-1]]
    assert bodies[2][:-1] == [*bodies[1], {"role": "assistant", "content": "answer 1"}]
    assert len(bodies[3]) == 1  # a new session
    r = p.next_request()
    p.answered(False, None)  # a failed turn ends its session
    assert p.next_request().turn == 1


@pytest.mark.parametrize("table, error", [
    ({"turns": 0}, "request.conversation.turns"),
    ({"turns": {"dist": "zipf"}}, "request.conversation.turns.dist"),
    ({"think_ms": -1}, "request.conversation.think_ms"),
])
def test_bad_conversation_tables_say_which_key(table, error):
    from kneeswarm.locustfiles.protocols import ProtocolError

    plan = plan_from_dict({"protocol": "openai", "request": {"conversation": table}})
    with pytest.raises(ProtocolError, match=error):
        for_plan(plan)


def test_a_conversation_needs_the_closed_loop():
    with pytest.raises(PlanError, match="closed"):
        plan_from_dict({"protocol": "openai", "load": {"arrivals": "open", "rates": [1.0]},
                        "request": {"conversation": {"turns": 2}}})


# -- real runs ----------------------------------------------------------------------------------
def plan_text(name: str, url: str, request: str) -> str:
    return (f'name = "{name}"\ntarget = "{url}"\nprotocol = "openai"\nmetrics_url = "{url}/metrics"\n'
            "[load]\nsteps = [1]\nramp = 0.2\nhold = 5.0\nsettle = 0.3\nworkers = 1\n"
            f"[request]\nmax_tokens = {ANSWER}\nignore_eos = true\nstream = true\n{request}"
            "[analysis]\nmin_requests = 5\n")


@pytest.fixture(scope="module")
def conversation_runs(tmp_path_factory):
    """A synthetic conversation plan and a dataset one, side by side: {name: (summary, request log)}."""
    tmp = tmp_path_factory.mktemp("conversation")
    (tmp / "chats.jsonl").write_text(json.dumps({"messages": SCRIPT}) + "\n")
    requests = {"synthetic": f"prompt_tokens = {MESSAGE}\n[request.conversation]\nturns = {TURNS}\nthink_ms = 0\n",
                "dataset": f'dataset = "{tmp / "chats.jsonl"}"\n[request.conversation]\nthink_ms = 1\n'}
    flags = {name: ["--mode", "knee", *ENGINE, "--request-log", str(tmp / f"{name}.log")] for name in requests}
    with runs_against_targets(tmp, flags, lambda name, url: plan_text(name, url, requests[name])) as runs:
        return {name: (read_summary(run_dir), logged(tmp / f"{name}.log")) for name, (run_dir, _) in runs.items()}


def logged(path: Path) -> list[list[dict]]:
    """The messages of every chat request the target received, in arrival order (the preflight's left out)."""
    docs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bodies = [json.loads(d["body"]) for d in sorted(docs, key=lambda d: d["t"]) if d["path"] == "/v1/chat/completions"]
    return [b["messages"] for b in bodies if b.get("max_tokens") == ANSWER]


def sessions(bodies: list[list[dict]]) -> list[list[list[dict]]]:
    """The bodies grouped by session (one user: a body with one user message starts a new one)."""
    out: list[list[list[dict]]] = []
    for b in bodies:
        if sum(m["role"] == "user" for m in b) == 1:
            out.append([])
        out[-1].append(b)
    return out


@pytest.mark.slow
def test_each_turn_carries_the_whole_history_with_the_answers(conversation_runs):
    _, bodies = conversation_runs["synthetic"]
    whole = [s for s in sessions(bodies) if len(s) == TURNS]
    assert len(whole) >= 3, len(sessions(bodies))
    for s in whole:
        for k in range(1, TURNS):
            prev, body = s[k - 1], s[k]
            assert body[:len(prev)] == prev  # everything sent before, unchanged
            answer, new = body[len(prev):]
            assert answer["role"] == "assistant" and len(answer["content"].split()) == ANSWER  # the answer it got
            assert new["role"] == "user" and len(new["content"].split()) == MESSAGE
            assert sum(len(m["content"].split()) for m in body) == context_words(k + 1)


@pytest.mark.slow
def test_ttft_per_turn_rises_with_the_context_as_the_engine_prefills_it(conversation_runs):
    summary, _ = conversation_runs["synthetic"]
    turns = summary["llm_workload"]["turns"]
    print(turns)
    assert [t["turn"] for t in turns] == list(range(1, TURNS + 1))
    assert [t["tokens_in_mean"] for t in turns] == [context_words(k) for k in range(1, TURNS + 1)]
    ttft = [t["ttft_p50_ms"] for t in turns]
    assert ttft == sorted(ttft)
    for k, got in enumerate(ttft, 1):
        known = DECODE_MS + context_words(k) * PREFILL_MS  # 25, 53, 81, 109 ms
        assert known - 1.0 <= got <= known + 15.0, (k, got, known)  # the HTTP round trip on top, never less


@pytest.mark.slow
def test_a_dataset_conversation_plays_its_user_turns_with_the_live_answers(conversation_runs):
    summary, bodies = conversation_runs["dataset"]
    users = [m["content"] for m in SCRIPT if m["role"] == "user"]
    done = [s for s in sessions(bodies) if len(s) == len(users)]
    assert len(done) >= 3
    for s in done:
        assert [b[-1]["content"] for b in s] == users
        assert s[0] == SCRIPT[:2]
        for k in range(1, len(s)):
            answer = s[k][len(s[k - 1])]
            assert answer["role"] == "assistant" and "recorded" not in answer["content"]
            assert len(answer["content"].split()) == ANSWER
    assert [t["turn"] for t in summary["llm_workload"]["turns"]] == [1, 2, 3]


def test_the_report_lines_name_each_turn_and_the_expected_hit_rate():
    from kneeswarm.analysis.reports.markdown import llm_workload_lines

    lines = llm_workload_lines({"llm_workload": {
        "prefix": {"tokens": 64, "count": 8, "share": 0.9, "rows_share": 0.9, "expected_hit_pct": 78.3},
        "turns": [{"turn": 1, "requests": 5, "tokens_in_mean": 20.0, "ttft_p50_ms": 29.1},
                  {"turn": 2, "requests": 4, "tokens_in_mean": 48.0, "ttft_p50_ms": 55.8}]}})
    assert lines[0].startswith("**Shared prefixes:** 8 of 64 tokens in 90 % of requests") and "78.3 %" in lines[0]
    assert "turn 1: 20 tokens in, TTFT P50 29 ms (5 requests); turn 2: 48 tokens in, TTFT P50 56 ms" in lines[1]


# -- the conversation loader under hypothesis ---------------------------------------------------
number = st.integers(-2, 6) | st.floats(allow_nan=True, allow_infinity=True) | st.booleans() | st.text(max_size=3)
dist_table = number | st.fixed_dictionaries({}, optional={"dist": st.sampled_from(["fixed", "uniform", "normal", "x"]),
                                                          "mean": number, "stdev": number, "min": number, "max": number,
                                                          "odd": number})
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": st.text(max_size=12)})
record = st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=6)})


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({}, optional={"turns": dist_table, "think_ms": dist_table}),
       st.none() | st.lists(record, min_size=1, max_size=3), st.integers(0, 3))
def test_the_conversation_loader_survives_any_table_and_dataset(tmp_path_factory, table, chats, seed):
    from kneeswarm.locustfiles.protocols import ProtocolError

    request: dict = {"conversation": table, "prompt_tokens": 3}
    if chats is not None:
        path = tmp_path_factory.mktemp("c") / "chats.jsonl"
        path.write_text("".join(json.dumps(c) + "\n" for c in chats))
        request["dataset"] = str(path)
    try:
        p = for_plan(plan_from_dict({"protocol": "openai", "request": request}), seed=seed)
    except (PlanError, ProtocolError) as e:
        assert "\n" not in str(e) and "conversation" in str(e) or "dataset" in str(e)
        return
    prev: list[dict] | None = None
    for i in range(8):
        r = p.next_request()
        messages = json.loads(r.body)["messages"]
        assert r.turn is not None and r.turn >= 1 and messages[-1]["role"] == "user"
        if r.turn > 1:  # the history so far, then the answer, then the new message
            assert prev is not None and messages[:len(prev)] == prev and messages[len(prev)]["content"] == f"a{i - 1}"
        stream = ChatStream(0.0, True, keep_text=True)
        stream.texts.append(f"a{i}")
        p.answered(True, stream)
        assert p.think_s(0.5) >= 0.0
        prev = messages


def test_a_whole_answer_joins_the_history_too():
    """stream = false: the answer's text comes from the JSON body the protocol judged."""
    p = for_plan(plan_from_dict({"protocol": "openai", "request": {
        "stream": False, "prompt_tokens": 2, "conversation": {"turns": 2}}}), seed=0)
    first = json.loads(p.next_request().body)["messages"]
    p.check_response(json.dumps({"choices": [{"message": {"role": "assistant", "content": "whole answer"}}]}).encode())
    p.answered(True, None)
    second = json.loads(p.next_request().body)["messages"]
    assert second[:-1] == [*first, {"role": "assistant", "content": "whole answer"}]
