"""The gRPC protocols' parts that need no server: the plan's checks, the tensors' raw layout
(against numpy's reading of the same bytes), a stream's timing and tokens, the status codes'
failure categories (against the recorder's own categorize)."""

from __future__ import annotations

import numpy as np
import pytest

from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2 as pb
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import PROTOCOLS, for_plan
from kneeswarm.locustfiles.protocols.base import BadPayload, StreamTruncated
from kneeswarm.locustfiles.protocols.grpcbase import GrpcFailure, Target, metadata_of
from kneeswarm.locustfiles.protocols.grpctensors import bytes_elements, raw_tensor
from kneeswarm.locustfiles.recorder import categorize


def grpc_plan(protocol: str = "kserve-grpc", target: str = "grpc://127.0.0.1:8001", **request) -> dict:
    return {"target": target, "protocol": protocol, "request": request}


@pytest.mark.parametrize("plan,said", [
    (grpc_plan(target="http://127.0.0.1:8001"), "needs target = \"grpc://host:port\""),
    (grpc_plan(target="grpc://127.0.0.1"), "needs target = \"grpc://host:port\""),
    ({**grpc_plan(), "endpoint": {"base_path": "/v2"}}, "endpoint.base_path is an HTTP route; gRPC has none"),
    ({**grpc_plan(target="grpcs://h:1"), "endpoint": {"verify": False}}, "gRPC's TLS always checks"),
    ({**grpc_plan(), "endpoint": {"server_name": "a.b"}}, "is for TLS, but the target is not https:// or grpcs://"),
    ({"target": "grpc://h:1", "protocol": "kserve"}, "grpc:// is for the gRPC protocols"),
    (grpc_plan(output_name="y"), "request.output_name is for protocol 'triton-stream'"),
    (grpc_plan("torchserve-grpc", rpc="Stream"), "request.rpc must be one of Predictions, StreamPredictions"),
    (grpc_plan(replay="r.jsonl"), "request.replay is not for protocol 'kserve-grpc'"),
    ({"target": "http://h:1", "protocol": "kserve", "request": {"inputs": [{"name": "x", "shape": [1], "data": [1]}]}},
     "data (the input's values, a list) is for the gRPC protocols"),
])
def test_a_grpc_plan_that_cannot_run_is_one_line(plan, said):
    with pytest.raises(PlanError) as e:
        plan_from_dict(plan)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_the_plan_and_the_registry_name_the_same_protocols():
    from kneeswarm.contracts.plan import GRPC_PROTOCOLS, PROTOCOLS as NAMES

    assert set(NAMES) == set(PROTOCOLS) and set(GRPC_PROTOCOLS) <= set(NAMES)
    for name in GRPC_PROTOCOLS:
        assert getattr(PROTOCOLS[name], "grpc", False)


@pytest.mark.parametrize("dtype,np_dtype,vals", [
    ("FP32", "<f4", [0.5, -1.25, 3.0]), ("FP64", "<f8", [1e-9, 2.5]), ("INT8", "<i1", [-3, 7]),
    ("INT32", "<i4", [-70000, 5]), ("INT64", "<i8", [2**40, -1]), ("UINT16", "<u2", [65535, 1]),
    ("FP16", "<f2", [0.5, -2.0]), ("BOOL", "?", [True, False, True]),
])
def test_raw_tensors_are_little_endian_row_major(dtype, np_dtype, vals):
    assert np.frombuffer(raw_tensor(dtype, vals), dtype=np_dtype).tolist() == vals


def test_bytes_tensors_are_length_prefixed_and_checked():
    raw = raw_tensor("BYTES", ["ab", "", "ü"])
    assert raw == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xc3\xbc"
    assert bytes_elements(raw) == [b"ab", b"", "ü".encode()]
    with pytest.raises(BadPayload, match="element 0 says 9 bytes"):
        bytes_elements(b"\x09\x00\x00\x00abc")


def test_a_kserve_grpc_request_carries_the_plans_tensors():
    plan = plan_from_dict(grpc_plan(model="m", version="3", batch=2, inputs=[
        {"name": "a", "shape": [1, 3], "datatype": "INT32"},
        {"name": "p", "shape": [1], "datatype": "BYTES", "data": ["say {{prompt}}"]}], prompt="hello there"))
    proto = for_plan(plan, seed=1)
    msg = pb.ModelInferRequest.FromString(proto.next_request().body)
    assert (msg.model_name, msg.model_version) == ("m", "3")
    assert [(i.name, i.datatype, list(i.shape)) for i in msg.inputs] == [("a", "INT32", [2, 3]), ("p", "BYTES", [2])]
    assert len(np.frombuffer(msg.raw_input_contents[0], dtype="<i4")) == 6
    assert bytes_elements(msg.raw_input_contents[1]) == [b"say hello there"] * 2
    assert proto.next_request().tokens_in == 2  # the prompt's words


def test_typed_contents_carry_the_same_values():
    raw = pb.ModelInferRequest.FromString(for_plan(plan_from_dict(grpc_plan(shape=[2, 3], seed=7))).next_request().body)
    typed = pb.ModelInferRequest.FromString(for_plan(plan_from_dict(grpc_plan(shape=[2, 3], seed=7, contents="typed")))
                                            .next_request().body)
    assert not typed.raw_input_contents and list(typed.inputs[0].shape) == [2, 3]
    assert np.asarray(typed.inputs[0].contents.fp32_contents, "<f4").tolist() == \
        np.frombuffer(raw.raw_input_contents[0], "<f4").tolist()
    with pytest.raises(PlanError, match="request.contents"):
        plan_from_dict(grpc_plan("torchserve-grpc", contents="typed"))


def answer(shape, raw: bytes, dtype="FP32"):
    return pb.ModelInferResponse(outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", datatype=dtype, shape=shape)],
                                 raw_output_contents=[raw])


def test_a_kserve_grpc_answer_is_judged():
    proto = for_plan(plan_from_dict(grpc_plan()))
    assert proto.check_message(answer([1, 2], np.ones(2, "<f4").tobytes())) is None
    for bad, said in ((pb.ModelInferResponse(), "no outputs"), (answer([1, 3], np.ones(2, "<f4").tobytes()),
                      r"8 bytes for shape \[1, 3\]"), (answer([], b""), "has no shape")):
        with pytest.raises(BadPayload, match=said):
            proto.check_message(bad)


def stream_response(text: bytes | None, final: bool = False, name: str = "text_output"):
    resp = pb.ModelInferResponse()
    if text is not None:
        resp.outputs.add(name=name, datatype="BYTES", shape=[1])
        resp.raw_output_contents.append(raw_tensor("BYTES", [text]))
    if final:
        resp.parameters["triton_final_response"].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=resp)


def test_a_triton_stream_is_timed_and_counted_per_response():
    proto = for_plan(plan_from_dict(grpc_plan("triton-stream", model="llm")))
    req = proto.next_request()
    assert req.stream and pb.ModelInferRequest.FromString(req.body).parameters[
        "triton_enable_empty_final_response"].bool_param
    s = proto.new_stream(10.0)
    for t, text in ((10.020, b"a"), (10.030, b""), (10.045, b"b c"), (10.050, b"d")):
        proto.feed(s, stream_response(text), t)
    assert not s.done
    with pytest.raises(StreamTruncated):
        s.check_complete()
    proto.feed(s, stream_response(None, final=True), 10.060)
    s.check_complete()
    assert s.ttft_ms == pytest.approx(20.0) and s.itl_ms == pytest.approx([25.0, 5.0])
    assert (s.chunks, s.responses, s.tokens_out, s.tokens_counted) == (3, 5, 3, True)
    with pytest.raises(BadPayload, match="no output 'text_output'"):
        proto.feed(proto.new_stream(0.0), stream_response(b"x", name="other"), 1.0)
    with pytest.raises(BadPayload, match="is an error: boom"):
        proto.feed(proto.new_stream(0.0), pb.ModelStreamInferResponse(error_message="boom"), 1.0)


@pytest.mark.parametrize("code,details,category,status", [
    ("UNAVAILABLE", "failed to connect to all addresses; last error: Connection refused", "conn_refused", 0),
    ("UNAVAILABLE", "Socket closed", "conn_reset", 0),
    ("DEADLINE_EXCEEDED", "Deadline Exceeded", "timeout", 0),
    ("RESOURCE_EXHAUSTED", "queue full", "http_429", 429),
    ("INVALID_ARGUMENT", "bad shape", "http_4xx", 400),
    ("INTERNAL", "boom", "http_5xx", 500),
])
def test_status_codes_become_the_recorders_categories(code, details, category, status):
    e = GrpcFailure(code, details)
    assert (e.status, categorize(e.status, e)) == (status, category)


def test_the_host_header_is_the_channels_authority_and_server_name_its_tls_name(monkeypatch):
    import grpc

    from kneeswarm.contracts.plan import EndpointPlan
    from kneeswarm.locustfiles.protocols.grpcbase import channel

    made = []
    monkeypatch.setattr(grpc, "insecure_channel", lambda address, options: made.append((address, dict(options))))
    monkeypatch.setattr(grpc, "secure_channel", lambda address, creds, options: made.append((address, dict(options))))
    channel(Target("grpc://127.0.0.1:9"), EndpointPlan(), {"Host": "models.example"})
    channel(Target("grpcs://127.0.0.1:9"), EndpointPlan(server_name="a.test"), {})
    assert made[0][0] == "127.0.0.1:9" and made[0][1]["grpc.default_authority"] == "models.example"
    assert made[1][1]["grpc.ssl_target_name_override"] == "a.test" and "grpc.default_authority" not in made[1][1]
    assert made[0][1]["grpc.use_local_subchannel_pool"] == 1 and made[0][1]["grpc.enable_retries"] == 0


def test_headers_become_metadata_and_the_target_its_address():
    assert metadata_of({"Content-Type": "application/json", "Host": "a.b", "X-Team": "t",
                        "Authorization": "Bearer k"}) == (("x-team", "t"), ("authorization", "Bearer k"))
    assert Target("grpcs://[::1]:8001").address == "[::1]:8001" and Target("grpcs://[::1]:8001").tls
    with pytest.raises(ValueError):
        Target("grpc://host")
