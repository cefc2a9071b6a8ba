"""A KServe Python model server with a tiny model of known capacity: at most SLOTS requests are
served at once (an asyncio semaphore, as a model with a fixed pool of backend sessions has), each
taking BUSY_MS of the event loop's CPU time (a spin, as a model's Python pre-processing would)
and then WAIT_MS without it.  So a closed loop saturates at SLOTS users, with QPS at most
SLOTS * 1000 / (BUSY_MS + WAIT_MS), wherever the CPU is: the knee does not move when the host is
shared (the suite runs on two cores beside its own load generator).

Serves v2 (/v2/models/spin/infer: FP32 input -> its sum, FP32) and v1 (/v1/models/spin:predict).
Run: python kserve_model.py --http_port PORT --slots 4 --busy-ms 2 --wait-ms 48
Several models of different cost in one server (each its own slots; the model name in the paths):
python kserve_model.py --http_port PORT --model cheap:8:1:9 --model slow:8:2:48
"""

import argparse
import asyncio
import time
import uuid

import kserve
from kserve import InferOutput, InferRequest, InferResponse


class Spin(kserve.Model):
    def __init__(self, name: str, slots: int, busy_ms: float, wait_ms: float):
        super().__init__(name)
        self.slots, self.busy_s, self.wait_s = slots, busy_ms / 1000.0, wait_ms / 1000.0
        self.sem: asyncio.Semaphore | None = None
        self.ready = True

    async def predict(self, payload, headers=None, response_headers=None):
        if self.sem is None:  # made on the server's own event loop
            self.sem = asyncio.Semaphore(self.slots)
        async with self.sem:
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
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--busy-ms", type=float, default=2.0)
    parser.add_argument("--wait-ms", type=float, default=48.0)
    parser.add_argument("--model", action="append", default=[], metavar="NAME:SLOTS:BUSY_MS:WAIT_MS",
                        help="serve this model (repeatable) instead of the one 'spin' of --slots/--busy-ms/--wait-ms")
    args, _ = parser.parse_known_args()
    models = [Spin(name, int(slots), float(busy), float(wait))
              for name, slots, busy, wait in (m.split(":") for m in args.model)]
    kserve.ModelServer().start(models or [Spin("spin", args.slots, args.busy_ms, args.wait_ms)])
