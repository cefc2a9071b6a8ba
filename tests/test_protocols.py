"""Each protocol alone: the bodies it builds, the answers it accepts and refuses, the SSE parser.

Expected values come from the protocols' published formats (KServe v2, OpenAI, TorchServe,
TF Serving), written out here by hand, never from the code under test.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneeswarm.contracts import plan as plan_mod
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import (PROTOCOLS, BadPayload, GenericHTTP, KServeV2, OpenAI, ProtocolError, StreamTruncated, TFServing, TorchServe, for_plan)
from kneeswarm.locustfiles.protocols.sse import ChatStream, SSEDecoder, parse_stream
from kneeswarm.locustfiles.recorder import categorize


def test_the_plan_and_the_registry_name_the_same_protocols():
    assert tuple(PROTOCOLS) == plan_mod.PROTOCOLS


def test_kserve_several_named_inputs_with_batch_and_version():
    p = KServeV2({"model": "ens", "version": "3", "batch": 4, "inputs": [
        {"name": "ids", "shape": [1, 8], "datatype": "INT64"},
        {"name": "mask", "shape": [1, 8], "datatype": "BOOL"},
        {"name": "text", "shape": [1], "datatype": "BYTES"}]}, seed=2)
    req = p.next_request()
    assert req.path == "/v2/models/ens/versions/3/infer" and req.items == 4
    inputs = json.loads(req.body)["inputs"]
    assert [(i["name"], i["shape"], i["datatype"]) for i in inputs] == [
        ("ids", [4, 8], "INT64"), ("mask", [4, 8], "BOOL"), ("text", [4], "BYTES")]
    assert len(inputs[0]["data"]) == 32 and all(isinstance(v, int) for v in inputs[0]["data"])
    assert all(isinstance(v, bool) for v in inputs[1]["data"])
    assert all(isinstance(v, str) for v in inputs[2]["data"]) and len(inputs[2]["data"]) == 4


def test_openai_chat_body_streams_with_usage_and_pins_length_only_when_asked():
    p = OpenAI({"model": "llama", "max_tokens": 12, "prompt_tokens": 9}, seed=1)
    req = p.next_request()
    doc = json.loads(req.body)
    assert req.path == "/v1/chat/completions" and req.stream and req.tokens_in == 9
    assert doc["model"] == "llama" and doc["max_tokens"] == 12 and doc["stream"] is True
    assert doc["stream_options"] == {"include_usage": True}
    assert len(doc["messages"][0]["content"].split()) == 9 and doc["messages"][0]["role"] == "user"
    assert "ignore_eos" not in doc and "min_tokens" not in doc
    pinned = json.loads(OpenAI({"ignore_eos": True, "min_tokens": 5, "endpoint": "completions", "stream": False,
                                "prompt": "hello there"}).next_request().body)
    assert pinned["ignore_eos"] is True and pinned["min_tokens"] == 5 and pinned["prompt"] == "hello there"
    assert "stream_options" not in pinned and pinned["stream"] is False


def test_openai_whole_answer_gives_usage_counts():
    p = OpenAI({"stream": False})
    body = b'{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],' \
           b'"usage":{"prompt_tokens":11,"completion_tokens":3}}'
    assert p.check_response(body) == (11, 3)
    for bad in (b"{}", b'{"choices": []}', b"nope", b'{"choices":[{"message":{}}]}'):
        with pytest.raises(BadPayload):
            p.check_response(bad)


def test_torchserve_and_tfserving_bodies():
    ts = TorchServe({"model": "resnet", "version": "2.0", "shape": [1, 3], "batch": 2, "data": "fixed"})
    req = ts.next_request()
    assert req.path == "/predictions/resnet/2.0" and ts.health_path == "/ping"
    assert json.loads(req.body) == {"data": [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]}
    tf = TFServing({"model": "half", "shape": [1, 2, 2], "batch": 3, "data": "fixed"})
    req = tf.next_request()
    assert req.path == "/v1/models/half:predict" and tf.health_path == "/v1/models/half"
    assert json.loads(req.body) == {"instances": [[[0.5, 0.5], [0.5, 0.5]]] * 3}
    tf.check_response(b'{"predictions": [1]}')
    with pytest.raises(BadPayload):
        tf.check_response(b'{"error": "Servable not found"}')


def test_http_template_fills_placeholders_and_checks_a_json_path():
    p = GenericHTTP({"path": "/score", "model": 'q"m', "prompt": "a b c", "shape": [1, 2], "data": "fixed",
                     "body": '{"m": "{{model}}", "p": "{{prompt}}", "x": {{data}}, "u": {{user}}}',
                     "success_path": "result.0.score", "health_path": "/healthz"}, seed=5)
    req = p.next_request()
    assert json.loads(req.body) == {"m": 'q"m', "p": "a b c", "x": [[0.5, 0.5]], "u": 5}
    assert req.path == "/score" and p.health_path == "/healthz" and req.tokens_in == 3
    p.check_response(b'{"result": [{"score": 0.1}]}')
    for bad in (b'{"result": []}', b'{"result": [{"score": null}]}', b"[]", b"x"):
        with pytest.raises(BadPayload):
            p.check_response(bad)
    with pytest.raises(ProtocolError, match="not JSON once filled"):
        GenericHTTP({"path": "/", "body": "{{{prompt}}"})


def test_api_key_goes_in_the_header_and_never_in_a_message(monkeypatch):
    monkeypatch.setenv("KS_TEST_KEY", "sk-very-secret")
    for cls in PROTOCOLS.values():
        p = cls({"api_key_env": "KS_TEST_KEY", "path": "/x"})
        assert p.next_request().headers["Authorization"] == "Bearer sk-very-secret"
        assert "sk-very-secret" not in p.redact("server said: bad key sk-very-secret")
    monkeypatch.delenv("KS_TEST_KEY")
    with pytest.raises(ProtocolError) as e:
        OpenAI({"api_key_env": "KS_TEST_KEY"})
    assert "KS_TEST_KEY" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("table, message", [
    ({"protocol": "http"}, "protocol 'http' needs request.path"),
    ({"request": {"endpoint": "embeddings"}}, "request.endpoint must be one of chat, completions"),
    ({"request": {"batch": 0}}, "request.batch must be >= 1"),
    ({"request": {"inputs": [{"name": "a", "shape": [0]}]}}, "request.inputs[0] (a): shape must be positive"),
    ({"request": {"inputs": [{"name": "a", "shape": [1], "datatype": "FP8"}]}}, "not a KServe v2 datatype"),
    ({"request": {"inputs": [{"name": "a", "shape": [1], "dims": 2}]}}, "unknown key 'dims'"),
    ({"request": {"api_key_env": "$KEY"}}, "must name an environment variable"),
    ({"request": {"path": "v1/x"}}, "request.path must start with '/'"),
])
def test_bad_request_tables_are_one_line(table, message):
    with pytest.raises(PlanError) as e:
        plan_from_dict(table)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_request_keys_round_trip_and_name_only_the_secret_variable():
    import tomllib

    plan = plan_from_dict({"protocol": "kserve", "request": {"api_key_env": "MY_KEY", "batch": 2, "inputs": [
        {"name": "a", "shape": [1, 4], "datatype": "FP32"}]}})
    assert plan_from_dict(tomllib.loads(plan.to_toml())) == plan
    assert 'api_key_env = "MY_KEY"' in plan.to_toml()
    assert for_plan(plan_from_dict({"protocol": "tfserving"})).name == "tfserving"


# -- SSE --------------------------------------------------------------------------------------
VLLM_CHAT = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n'
    b"data: [DONE]\n\n"
)


def test_a_vllm_chat_stream_is_judged_by_its_text_chunks():
    s = parse_stream(VLLM_CHAT)
    # Event times are line indices here; an event is complete at its blank line: the role
    # chunk's at line 1, the two text chunks' at lines 3 and 5.
    assert s.ttft_ms == 3000.0 and s.itl_ms == [2000.0]
    assert (s.chunks, s.tokens_out, s.usage_in, s.tokens_counted) == (2, 2, 5, False)
    s.check_complete()


def test_completions_stream_crlf_no_space_comments_and_counted_tokens():
    body = (b": keep-alive\r\n\r\nevent: message\r\ndata:{\"choices\":[{\"text\":\"a\"}]}\r\n\r\n"
            b'data: {"choices":[{"text":"b","finish_reason":"stop"}]}\r\n\r\n')
    s = parse_stream(body, chat=False)
    assert (s.chunks, s.tokens_out, s.tokens_counted, s.done, s.finished) == (2, 2, True, False, True)
    s.check_complete()  # a finish_reason without [DONE] is a complete stream


def test_with_a_tokenizer_the_streamed_text_is_kept_and_counted():
    """Several tokens per chunk (a detokenizing server): the tokenizer's count of the whole text is
    the client's independent count; usage stays tokens out; chunks are only chunks."""
    body = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":"alpha beta "},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":"gamma \\"delta\\" "},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":"eps"},"finish_reason":"length"}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":5}}\n\ndata: [DONE]\n\n')
    seen = []
    s = ChatStream(0.0, count=lambda text: seen.append(text) or len(text.split()))
    from kneeswarm.locustfiles.protocols.sse import Arrivals

    arrivals = Arrivals(s)
    arrivals.feed(body, 1.0)  # one arrival: the block path, text kept
    arrivals.close(1.0)
    assert s.tokens_tokenizer == 5 and seen == ['alpha beta gamma "delta" eps']
    assert (s.chunks, s.tokens_out, s.usage_out, s.tokens_counted) == (3, 5, 5, False)
    assert s.itl_ms == [0.0, 0.0] and s.ttft_ms == 1000.0
    # no usage from the server: the tokenizer's count is tokens out, not the chunks
    no_usage = ChatStream(0.0, count=lambda text: len(text.split()))
    for i, line in enumerate(body.split(b"\n\n")[:4]):
        no_usage.event(line[6:], float(i))
    assert (no_usage.chunks, no_usage.tokens_out, no_usage.tokens_counted) == (3, 5, True)
    assert ChatStream(0.0).tokens_tokenizer is None


def test_a_stream_of_tokens_without_text_has_no_ttft():
    body = (b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}\n\ndata: [DONE]\n\n')
    s = parse_stream(body)
    s.check_complete()
    assert s.ttft_ms is None and s.itl_ms == [] and (s.chunks, s.tokens_out) == (0, 7)


def test_a_request_pins_its_length_only_with_ignore_eos_or_min_tokens_at_max_tokens():
    from kneeswarm.locustfiles.protocols.openai import pinned_length

    assert OpenAI({"max_tokens": 12}).next_request().tokens_pinned is None
    assert OpenAI({"max_tokens": 12, "ignore_eos": True}).next_request().tokens_pinned == 12
    assert OpenAI({"max_tokens": 12, "min_tokens": 12}).next_request().tokens_pinned == 12
    assert OpenAI({"max_tokens": 12, "min_tokens": 11}).next_request().tokens_pinned is None
    assert pinned_length({"max_tokens": 4, "min_tokens": 9}) == 4 and pinned_length({"ignore_eos": True}) is None


@pytest.mark.parametrize("body", [VLLM_CHAT[: VLLM_CHAT.index(b'data: {"choices":[{"index":0,"delta":{"content":"lo"')],
                                  b""])
def test_a_stream_without_done_or_finish_reason_is_truncated(body):
    s = parse_stream(body)
    with pytest.raises(StreamTruncated):
        s.check_complete()
    try:
        s.check_complete()
    except StreamTruncated as e:
        assert categorize(200, e) == "stream_truncated"


def test_error_chunks_and_garbage_are_bad_payload():
    for body in (b'data: {"error": {"message": "overloaded"}}\n\n', b"data: {nope\n\n", b"data: [1, 2]\n\n"):
        with pytest.raises(BadPayload) as e:
            parse_stream(body)
        assert categorize(200, e.value) == "bad_payload"


def test_http_429_is_its_own_category():
    assert categorize(429, Exception("HTTP 429")) == "http_429"
    assert categorize(404, Exception("HTTP 404")) == "http_4xx"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=80), st.sampled_from([
    b"data: [DONE]", b"", b"data: {}", b'data: {"choices":[{"delta":{"content":"x"}}]}', b"data:", b": c",
    b'data: {"choices":[{"text":"y","finish_reason":"stop"}],"usage":{"completion_tokens":true}}',
    b'data: {"choices":[null]}', b'data: {"choices":"x"}', b'data: {"usage":{"prompt_tokens":-1}}'])), max_size=40))
def test_the_sse_parser_survives_any_input(lines):
    """Whatever arrives: each event is accepted or refused as BadPayload, and the result is sane."""
    decoder, stream = SSEDecoder(), ChatStream(0.0)
    for i, line in enumerate(lines):
        data = decoder.line(line)
        if data is None:
            continue
        try:
            stream.event(data, float(i))
        except BadPayload:
            pass
    assert stream.chunks >= 0 and len(stream.itl_ms) == max(0, stream.chunks - 1)
    assert all(g >= 0 for g in stream.itl_ms)
    assert isinstance(stream.tokens_out, int)
    try:
        stream.check_complete()
        assert stream.done or stream.finished
    except StreamTruncated:
        assert not (stream.done or stream.finished)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=6)), st.sampled_from([None, "stop", "length"]),
                          st.booleans(), st.booleans()), max_size=12))
def test_the_byte_search_fast_path_agrees_with_full_parsing(chunks):
    """Compact chunks (the fast path) and the same chunks with spaces (always parsed) agree."""
    compact, spaced = ChatStream(0.0), ChatStream(0.0, chat=True)
    for i, (text, finish, role_only, chat_usage) in enumerate(chunks):
        delta = {"role": "assistant", "content": ""} if role_only else ({} if text is None else {"content": text})
        doc = {"id": "x", "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if chat_usage:
            doc["usage"] = {"prompt_tokens": 3, "completion_tokens": i}
        compact.event(json.dumps(doc, separators=(",", ":")).encode(), float(i))
        spaced.event(json.dumps(doc).encode(), float(i))
    for attr in ("chunks", "finished", "usage_in", "usage_out", "itl_ms", "first"):
        assert getattr(compact, attr) == getattr(spaced, attr), attr


EVENT_LINES = st.sampled_from([
    b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"tok"},"logprobs":null,"finish_reason":null}]}',
    b'data: {"id":"x","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null}]}',
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"end"},"logprobs":null,"finish_reason":"stop"}]}',
    b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}',
    b'data: {"choices": [{"delta": {"content": "spaced"}, "finish_reason": null}]}',
    b"data: [DONE]", b": keep-alive", b"event: message", b"data:", b'data: {"error": {"message": "x"}}',
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a\\"b"},"logprobs":null,"finish_reason":null}]}',
])


def fed_in_cuts(arrivals, body: bytes, cuts: list[int]) -> type | None:
    """Feed ``body`` to an sse.Arrivals in pieces cut at ``cuts`` (mod its length), then close it:
    the BadPayload type it raised, None when it took it all."""
    try:
        last = 0
        for cut in sorted(c % (len(body) + 1) for c in cuts) + [len(body)]:
            arrivals.feed(body[last:cut], 0.0)
            last = cut
        arrivals.close(0.0)
    except BadPayload as e:
        return type(e)
    return None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(EVENT_LINES, min_size=1, max_size=3), max_size=10), st.lists(st.integers(0, 4000), max_size=6),
       st.booleans(), st.booleans())
def test_reading_per_arrival_equals_reading_line_by_line(events, cuts, crlf, final_blank):
    """However the body is cut into arrivals, Arrivals judges it as the SSE decoder line by line would."""
    from kneeswarm.locustfiles.protocols.sse import Arrivals

    nl = b"\r\n" if crlf else b"\n"
    body = b"".join(nl.join(lines) + nl + nl for lines in events)
    if not final_blank and body:
        body = body[: -len(nl)]
    reference, by_arrival = ChatStream(0.0), ChatStream(0.0)
    ref_error = None
    try:
        decoder = SSEDecoder()
        for line in body.split(b"\n"):
            data = decoder.line(line)
            if data is not None:
                reference.event(data, 0.0)
        tail = decoder.end()
        if tail is not None:
            reference.event(tail, 0.0)
    except BadPayload as e:
        ref_error = type(e)
    arr_error = fed_in_cuts(Arrivals(by_arrival), body, cuts)
    assert ref_error == arr_error
    # Text kept (a tokenizer): every event fully parsed, the same judgement -- or a refusal of an
    # event of several data lines that the byte search lets pass (two JSON documents joined)
    counting = ChatStream(0.0, count=len)
    count_error = fed_in_cuts(Arrivals(counting), body, cuts)
    assert ref_error is None or count_error is not None
    if count_error is not None and ref_error is None:  # only where two data lines made one event
        assert any(sum(line.startswith(b"data:") for line in lines) > 1 for lines in events)
    if ref_error is None:
        for attr in ("chunks", "done", "finished", "usage_in", "usage_out", "itl_ms", "first", "events"):
            assert getattr(by_arrival, attr) == getattr(reference, attr), attr
            assert count_error is not None or getattr(counting, attr) == getattr(reference, attr), attr
