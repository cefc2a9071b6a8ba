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


if __name__ == "__main__":
    http, grpc, metrics = (int(a) for a in sys.argv[1:4])
    instances = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    service_s = (float(sys.argv[5]) if len(sys.argv) > 5 else 50.0) / 1000.0
    cfg = TritonConfig(http_address="127.0.0.1", http_port=http, grpc_address="127.0.0.1", grpc_port=grpc,
                       metrics_port=metrics, allow_gpu_metrics=False)
    with Triton(config=cfg) as triton:
        triton.bind(model_name="double", infer_func=[make_infer(service_s) for _ in range(instances)],
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(-1, -1))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(-1, -1))],
                    config=ModelConfig(batching=False))
        print("serving", flush=True)
        triton.serve()
