"""A KServe Python model server with a tiny model of known cost: each request holds the server's
one event loop for BUSY_MS of CPU (a spin, as a model's Python pre-processing would) and then
waits WAIT_MS without it (as a call to a backend would).  One process, so QPS is capped at
1000 / (BUSY_MS + the server's own per-request cost) and a closed loop saturates at about
(BUSY_MS + WAIT_MS) / BUSY_MS users.

Serves v2 (/v2/models/spin/infer: FP32 input -> its sum, FP32) and v1 (/v1/models/spin:predict).
Run: python kserve_model.py --http_port PORT --busy-ms 20 --wait-ms 60
"""

import argparse
import asyncio
import time
import uuid

import kserve
from kserve import InferOutput, InferRequest, InferResponse


class Spin(kserve.Model):
    def __init__(self, name: str, busy_ms: float, wait_ms: float):
        super().__init__(name)
        self.busy_s, self.wait_s = busy_ms / 1000.0, wait_ms / 1000.0
        self.ready = True

    async def predict(self, payload, headers=None, response_headers=None):
        end = time.thread_time() + self.busy_s
        while time.thread_time() < end:  # BUSY_MS of this thread's CPU time, on the event loop
            pass
        await asyncio.sleep(self.wait_s)  # the loop is free meanwhile
        if isinstance(payload, InferRequest):
            data = payload.inputs[0].data
            out = InferOutput(name="output", shape=[1], datatype="FP32", data=[float(sum(data))])
            return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id or str(uuid.uuid4()))
        return {"predictions": [float(sum(r)) for r in payload["instances"]]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--busy-ms", type=float, default=20.0)
    parser.add_argument("--wait-ms", type=float, default=60.0)
    args, _ = parser.parse_known_args()
    kserve.ModelServer().start([Spin("spin", args.busy_ms, args.wait_ms)])
