"""A TorchServe custom handler with no weights and a known service time: each request takes
SERVICE_S in its worker process (one request at a time per worker: batch size 1), so a model
with W workers serves at most W * 1 / SERVICE_S requests/s and a closed loop saturates at W users."""
import json
import time

SERVICE_S = 0.05


def handle(data, context):
    if data is None:  # the worker's initialisation call
        return None
    out = []
    for row in data:
        body = row.get("body") or row.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = json.loads(body)
        time.sleep(SERVICE_S)
        out.append({"n": len(body.get("data", [])) if isinstance(body, dict) else 0})
    return out
