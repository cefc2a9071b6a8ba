"""A real gRPC inference server for tests, with its own record of what it served.

    python tests/grpc_server.py PORT [--slots 4] [--service-ms 20] [--responses 8] [--pace-ms 15]
                                     [--tls CERT KEY] [--client-ca CA]

Serves, on 127.0.0.1:PORT, Triton's ``inference.GRPCInferenceService`` (ServerReady, ModelReady,
ModelMetadata, ModelInfer, ModelStreamInfer) and TorchServe's ``InferenceAPIsService`` (Ping,
Predictions, StreamPredictions), with kneeswarm's generated stubs:
- model "double": input "x" FP32 [-1, -1], output "y" = 2x; at most SLOTS requests are served at
  once (a semaphore), each SERVICE_MS: a closed loop saturates at SLOTS users.  With --max-inflight
  a request beyond that many in the server is refused with RESOURCE_EXHAUSTED ("refused <t>").
- model "tokens": a decoupled model: RESPONSES responses of text "tok " PACE_MS apart, then an empty
  final response (when the request asked for one, as Triton does), the first after PACE_MS.
- TorchServe model "echo": Predictions answers the JSON it got back; StreamPredictions sends
  RESPONSES answers PACE_MS apart.
Every request served prints one line to stdout, in one write: ``served <method> <t_end> <ms>
<peer> <x-test-header>``, and for a stream ``recv <t> sent <t> ...`` beforehand (when it arrived, when each response was sent) -- the
server's own truth .
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from kneeswarm.contracts.grpcapi.torchserve import inference_pb2 as ts  # noqa: E402
from kneeswarm.contracts.grpcapi.torchserve import inference_pb2_grpc as ts_grpc  # noqa: E402
from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2 as pb  # noqa: E402
from kneeswarm.contracts.grpcapi.triton import grpc_service_pb2_grpc as pb_grpc  # noqa: E402


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: lines of the server's threads never interleave


def who(context) -> tuple[str, str]:
    """The call's peer and the test header it came with (grpcio's server API does not show the
    :authority; tests check the channel's option instead)."""
    md = dict(context.invocation_metadata())
    return context.peer().replace(" ", "_"), md.get("x-test-header", "-")


class Inference(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, a):
        self.a = a
        self.slots = threading.Semaphore(a.slots)
        self.lock, self.inflight = threading.Lock(), 0

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name in ("double", "tokens"))

    def ModelMetadata(self, request, context):
        if request.name == "double":
            t = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(name="double", platform="test", inputs=[t(name="x", datatype="FP32", shape=[-1, -1])],
                                            outputs=[t(name="y", datatype="FP32", shape=[-1, -1])])
        if request.name == "tokens":
            t = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(name="tokens", platform="test",
                                            inputs=[t(name="text_input", datatype="BYTES", shape=[1])],
                                            outputs=[t(name="text_output", datatype="BYTES", shape=[-1])])
        context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}' is not found")

    def ModelInfer(self, request, context):
        t0 = time.perf_counter()
        if request.model_name != "double":
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.model_name}' is not found")
        with self.lock:
            self.inflight += 1
            refused = self.a.max_inflight is not None and self.inflight > self.a.max_inflight
        try:
            if refused:
                say(f"refused ModelInfer {time.time():.6f}")
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
            return self._infer(request, context, t0)
        finally:
            with self.lock:
                self.inflight -= 1

    def _infer(self, request, context, t0):
        with self.slots:
            time.sleep(self.a.service_ms / 1000.0)
            if request.raw_input_contents:
                x = np.frombuffer(request.raw_input_contents[0], dtype="<f4")
            else:  # typed contents
                x = np.asarray(request.inputs[0].contents.fp32_contents, dtype="<f4")
            if x.size != int(np.prod(list(request.inputs[0].shape))):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{x.size} values for shape {list(request.inputs[0].shape)}")
            shape = list(request.inputs[0].shape)
            out = pb.ModelInferResponse(model_name="double", outputs=[pb.ModelInferResponse.InferOutputTensor(
                name="y", datatype="FP32", shape=shape)], raw_output_contents=[(2.0 * x).astype("<f4").tobytes()])
        authority, header = who(context)
        say(f"served ModelInfer {time.time():.6f} {(time.perf_counter() - t0) * 1000.0:.3f} {authority} {header}")
        return out

    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            t0, t_recv = time.perf_counter(), time.time()
            sent = []
            for i in range(self.a.responses):
                time.sleep(self.a.pace_ms / 1000.0)
                text = b"tok "
                sent.append(time.time())
                yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
                    model_name="tokens", outputs=[pb.ModelInferResponse.InferOutputTensor(
                        name="text_output", datatype="BYTES", shape=[1])],
                    raw_output_contents=[len(text).to_bytes(4, "little") + text]))
            final = pb.ModelInferResponse(model_name="tokens")
            final.parameters["triton_final_response"].bool_param = True
            if request.parameters["triton_enable_empty_final_response"].bool_param:
                yield pb.ModelStreamInferResponse(infer_response=final)
            authority, header = who(context)
            say(f"recv {t_recv:.6f} " + " ".join(f"sent {t:.6f}" for t in sent))
            say(f"served ModelStreamInfer {time.time():.6f} {(time.perf_counter() - t0) * 1000.0:.3f} {authority} {header}")


class TorchServe(ts_grpc.InferenceAPIsServiceServicer):
    def __init__(self, a):
        self.a = a

    def Ping(self, request, context):
        return ts.TorchServeHealthResponse(health=json.dumps({"status": "Healthy"}))

    def Predictions(self, request, context):
        t0 = time.perf_counter()
        if request.model_name != "echo":
            context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {request.model_name}")
        time.sleep(self.a.service_ms / 1000.0)
        doc = json.loads(request.input["data"])
        authority, header = who(context)
        say(f"served Predictions {time.time():.6f} {(time.perf_counter() - t0) * 1000.0:.3f} {authority} {header}")
        return ts.PredictionResponse(prediction=json.dumps({"n": len(doc["data"])}).encode())

    def StreamPredictions(self, request, context):
        t0 = time.perf_counter()
        sent = []
        for _ in range(self.a.responses):
            time.sleep(self.a.pace_ms / 1000.0)
            sent.append(time.time())
            yield ts.PredictionResponse(prediction=b"tok ")
        say(" ".join(f"sent {t:.6f}" for t in sent))
        authority, header = who(context)
        say(f"served StreamPredictions {time.time():.6f} {(time.perf_counter() - t0) * 1000.0:.3f} {authority} {header}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--service-ms", type=float, default=20.0)
    ap.add_argument("--responses", type=int, default=8)
    ap.add_argument("--pace-ms", type=float, default=15.0)
    ap.add_argument("--max-streams", type=int, help="HTTP/2 streams one connection may have open at once")
    ap.add_argument("--max-inflight", type=int, help="ModelInfer: refuse (RESOURCE_EXHAUSTED) beyond this many at once")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--client-ca")
    a = ap.parse_args()
    options = [("grpc.max_concurrent_streams", a.max_streams)] if a.max_streams else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=128), maximum_concurrent_rpcs=None, options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Inference(a), server)
    ts_grpc.add_InferenceAPIsServiceServicer_to_server(TorchServe(a), server)
    address = f"127.0.0.1:{a.port}"
    if a.tls:
        cert, key = (Path(p).read_bytes() for p in a.tls)
        ca = Path(a.client_ca).read_bytes() if a.client_ca else None
        server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                                                    require_client_auth=ca is not None))
    else:
        server.add_insecure_port(address)
    server.start()
    say("serving")
    server.wait_for_termination()


if __name__ == "__main__":
    main()
