"""A real Triton Inference Server (the tritonserver bundled in nvidia-pytriton, CPU, Python
backend) serving one model of known capacity: INSTANCES model instances, each taking SERVICE_MS
per request, no batching -- so a closed loop saturates at INSTANCES users.  Each request served
prints one line ("served <t> <ms>") to stdout: the server's own per-request record.

Run: python pytriton_model.py HTTP_PORT GRPC_PORT METRICS_PORT [INSTANCES] [SERVICE_MS]
"""
import os
import sys
import time

import numpy as np
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def make_infer(service_s):
    def infer(requests):
        out = []
        for req in requests:
            t0 = time.perf_counter()
            time.sleep(service_s)
            out.append({"y": req["x"] * 2.0})
            line = f"served {time.time():.6f} {(time.perf_counter() - t0) * 1000.0:.3f}\n"
            os.write(1, line.encode())  # one write: lines of the instances' threads never interleave
        return out

    return infer


def make_stream(responses, pace_s, first_s):
    def stream(requests):
        t_req = time.time()
        sent = []
        for i in range(responses):
            time.sleep(first_s if i == 0 else pace_s)
            sent.append(time.time())
            yield [{"text_output": np.array([b"tok "], dtype=np.object_)} for _ in requests]
        os.write(1, ("streamed " + " ".join(f"{t:.6f}" for t in [t_req, *sent]) + "\n").encode())

    return stream


if __name__ == "__main__":
    http, grpc, metrics = (int(a) for a in sys.argv[1:4])
    instances = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    service_s = (float(sys.argv[5]) if len(sys.argv) > 5 else 50.0) / 1000.0
    responses = int(sys.argv[6]) if len(sys.argv) > 6 else 8
    pace_s = (float(sys.argv[7]) if len(sys.argv) > 7 else 40.0) / 1000.0
    first_s = (float(sys.argv[8]) if len(sys.argv) > 8 else 200.0) / 1000.0
    cfg = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1", grpc_port=grpc,
                       metrics_port=metrics, allow_gpu_metrics=False)
    with Triton(config=cfg) as triton:
        triton.bind(model_name="double", infer_func=[make_infer(service_s) for _ in range(instances)],
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(-1, -1))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(-1, -1))],
                    config=ModelConfig(batching=False))
        triton.bind(model_name="tokens", infer_func=[make_stream(responses, pace_s, first_s) for _ in range(instances)],
                    inputs=[Tensor(name="text_input", dtype=bytes, shape=(-1,))],
                    outputs=[Tensor(name="text_output", dtype=bytes, shape=(-1,))],
                    config=ModelConfig(batching=False, decoupled=True))
        print("serving", flush=True)
        triton.serve()
