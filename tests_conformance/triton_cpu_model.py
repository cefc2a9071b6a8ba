"""A Triton Python-backend model (its model.py) doing a fixed amount of real CPU work per request
in its stub process: ROUNDS SHA-256 updates of 4 KiB, about 20 ms of one core on an idle machine
of this kind (torchserve_cpu_handler.py does the same).  Each model instance is a stub process of
its own, a child of tritonserver; no batching."""
import hashlib

import triton_python_backend_utils as pb_utils

ROUNDS = 8500


def burn(rounds=ROUNDS):
    h, block = hashlib.sha256(), b"x" * 4096
    for _ in range(rounds):
        h.update(block)
    return h.hexdigest()


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for req in requests:
            x = pb_utils.get_input_tensor_by_name(req, "x").as_numpy()
            burn()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2.0)]))
        return out
