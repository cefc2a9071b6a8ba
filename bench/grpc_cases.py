"""The gRPC cases of bench/generator.py and bench/instructions.py: a canned gRPC responder and the
bare-Locust users kneeswarm's are measured against.

    .venv/bin/python bench/grpc_cases.py --serve PORT [--tokens 16]     (the responder alone)

The responder (grpc's asyncio server, one process, bytes in and out: no message is parsed) answers
``ModelInfer`` with one FP32 output, ``ModelStreamInfer`` with ``--tokens`` responses of text and a
final one, TorchServe's ``Predictions`` with a short JSON prediction.

The baselines, the way Locust's own gRPC example does the job (locust/examples/grpc: grpc's gevent
integration switched on, a client interceptor on the channel that times each call and fires the
request event; the example uses the grpc-interceptor package's ClientInterceptor, a thin wrapper
over grpc's own UnaryUnaryClientInterceptor, which is used here so as to add no dependency):
- "bare": the stub's call with the request message and nothing else (the interceptor's event);
- "same": the same job as kneeswarm's: the answer judged as kneeswarm judges it (outputs present, a
  shape each, their raw data the size the shape says) inside the interceptor, and for a stream
  every response read, TTFT at the first with text, its tokens counted, its end at the final flag.
Both send the same request message kneeswarm's protocol builds (the stub serializes it per call,
as a stub does; kneeswarm sends its pre-serialized bytes).
"""

from __future__ import annotations

import argparse
import logging
import struct
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: case -> the plan's protocol line and [request] lines; a deadline far beyond any answer (under
#: valgrind a first call, its connection made, takes seconds; the baselines set none)
PLANS = {
    "kserve-grpc": 'protocol = "kserve-grpc"\n[request]\ntimeout = 300.0',
    "triton-stream": 'protocol = "triton-stream"\n[request]\nmodel = "demo"\ntimeout = 300.0\n[[request.inputs]]\n'
                     'name = "text_input"\ndatatype = "BYTES"\nshape = [1]\ndata = ["{{prompt}}"]',
    "torchserve-grpc": 'protocol = "torchserve-grpc"\n[request]\ntimeout = 300.0',
}

COMMON = '''
import math
import time

import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import User, task

grpc_gevent.init_gevent()

from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pb_grpc
from kneeswarm.contracts.grpcapi.torchserve import inference_pb2 as ts, inference_pb2_grpc as ts_grpc
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan

SIZE = {{"FP32": 4, "FP64": 8, "INT32": 4, "INT64": 8}}


class Interceptor(grpc.UnaryUnaryClientInterceptor):
    """Locust's example's interceptor: times the call, fires the request event."""

    def __init__(self, environment, judge):
        self.env, self.judge = environment, judge

    def intercept_unary_unary(self, continuation, call_details, request):
        exception, length = None, 0
        start = time.perf_counter()
        response = continuation(call_details, request)
        try:
            result = response.result()
            length = result.ByteSize()
            if self.judge:
                judge(result)
        except (grpc.RpcError, ValueError) as e:
            exception = e
        self.env.events.request.fire(request_type="grpc", name=call_details.method,
                                     response_time=(time.perf_counter() - start) * 1000, response_length=length,
                                     response=response, context=None, exception=exception)
        return response


def judge(msg):
    if hasattr(msg, "outputs"):
        if not msg.outputs:
            raise ValueError("no outputs")
        for out, raw in zip(msg.outputs, msg.raw_output_contents):
            if not out.shape or len(raw) != SIZE.get(out.datatype, len(raw)) * math.prod(out.shape):
                raise ValueError("bad output")
    elif not msg.prediction.strip():
        raise ValueError("empty prediction")


def the_request(case, host):
    plan = plan_from_dict({{"target": host, "protocol": case, "request": {request!r}}})
    proto = for_plan(plan, seed=1)
    msg_type = ts.PredictionsRequest if case == "torchserve-grpc" else pb.ModelInferRequest
    return proto, msg_type.FromString(proto.next_request().body)
'''

UNARY = COMMON + '''

class Bare{side}(User):
    host = {host!r}

    def __init__(self, environment):
        super().__init__(environment)
        channel = grpc.intercept_channel(grpc.insecure_channel(self.host.split("://", 1)[1]),
                                         Interceptor(environment, judge={judge}))
        self.proto, self.msg = the_request({case!r}, self.host)
        if {case!r} == "torchserve-grpc":
            self.call = ts_grpc.InferenceAPIsServiceStub(channel).Predictions
        else:
            self.call = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer

    @task
    def infer(self):
        try:
            self.call(self.msg)
        except grpc.RpcError:
            pass  # the interceptor fired it
'''

STREAM = COMMON + '''

class Bare{side}(User):
    """A stream read by hand, the event fired by hand (an interceptor does not see a stream's end)."""
    host = {host!r}

    def __init__(self, environment):
        super().__init__(environment)
        channel = grpc.insecure_channel(self.host.split("://", 1)[1])
        self.proto, self.msg = the_request({case!r}, self.host)
        self.call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer

    @task
    def infer(self):
        import threading

        done = threading.Event()

        def requests():
            yield self.msg
            done.wait()

        start, ttft, tokens, exception, length = time.perf_counter(), None, 0, None, 0
        try:
            for msg in self.call(requests()):
                length += msg.ByteSize()
                if {judge}:
                    r = msg.infer_response
                    if r.outputs and r.raw_output_contents and len(r.raw_output_contents[0]) > 4:
                        tokens += 1
                        if ttft is None:
                            ttft = time.perf_counter() - start
                    if "triton_final_response" in r.parameters and r.parameters["triton_final_response"].bool_param:
                        break
                elif "triton_final_response" in msg.infer_response.parameters:
                    break
        except grpc.RpcError as e:
            exception = e
        finally:
            done.set()
        self.environment.events.request.fire(request_type="grpc", name="ModelStreamInfer",
                                             response_time=(time.perf_counter() - start) * 1000,
                                             response_length=length, response=None, context=None, exception=exception)
'''


def bare_source(case: str, side: str, host: str) -> str:
    """A locustfile (and a module for bench/instructions.py) of one baseline: side "bare" or "same"."""
    head, _, request = PLANS[case].partition("\n[request]\n")
    req: dict = {}
    if request:
        import tomllib

        req = tomllib.loads("[request]\n" + request)["request"]
    template = STREAM if case == "triton-stream" else UNARY
    return template.format(plan=head, request=req, side=side.capitalize(), host=host, case=case,
                           judge=side == "same")


def serve(port: int, tokens: int) -> None:
    """The canned responder, on 127.0.0.1:PORT, until killed."""
    import asyncio

    import grpc

    from kneeswarm.contracts.grpcapi.torchserve import inference_pb2 as ts
    from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2 as pb

    infer = pb.ModelInferResponse(model_name="demo", outputs=[pb.ModelInferResponse.InferOutputTensor(
        name="output", datatype="FP32", shape=[1, 1])], raw_output_contents=[struct.pack("<f", 0.5)])
    chunk = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
        model_name="demo", outputs=[pb.ModelInferResponse.InferOutputTensor(name="text_output", datatype="BYTES",
                                                                            shape=[1])],
        raw_output_contents=[struct.pack("<I", 4) + b"tok "])).SerializeToString()
    final_resp = pb.ModelInferResponse(model_name="demo")
    final_resp.parameters["triton_final_response"].bool_param = True
    final = pb.ModelStreamInferResponse(infer_response=final_resp).SerializeToString()
    answer, prediction = infer.SerializeToString(), ts.PredictionResponse(prediction=b'{"predictions":[[0.5]]}').SerializeToString()

    async def model_infer(_request: bytes, _context) -> bytes:
        return answer

    async def stream_infer(requests, _context):
        async for _ in requests:
            for _ in range(tokens):
                yield chunk
            yield final

    async def predictions(_request: bytes, _context) -> bytes:
        return prediction

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
                "ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer),
                "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(stream_infer)}),
            grpc.method_handlers_generic_handler("org.pytorch.serve.grpc.inference.InferenceAPIsService", {
                "Predictions": grpc.unary_unary_rpc_method_handler(predictions)})))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    serve(a.serve, a.tokens)
