"""A TorchServe custom handler that streams: each request is answered with RESPONSES answers of
text "tok ", the first FIRST_S after the request reached the handler (an LLM's prefill), the others
PACE_S apart (its decode steps) -- the first RESPONSES - 1 sent as intermediate answers
(``send_intermediate_predict_response``, what TorchServe's gRPC StreamPredictions streams), the last
returned -- and its own times printed to the worker's log: "streamed <t_request> <t_1> ... <t_N>"."""
import time

from ts.handler_utils.utils import send_intermediate_predict_response

RESPONSES, PACE_S, FIRST_S = 8, 0.04, 0.2


def handle(data, context):
    if data is None:  # the worker's initialisation call
        return None
    t_req, sent = time.time(), []
    for i in range(RESPONSES - 1):
        time.sleep(FIRST_S if i == 0 else PACE_S)
        sent.append(time.time())
        send_intermediate_predict_response(["tok "] * len(data), context.request_ids, "Intermediate Prediction success",
                                           200, context)
    time.sleep(PACE_S)
    sent.append(time.time())
    print("streamed " + " ".join(f"{t:.6f}" for t in [t_req, *sent]), flush=True)
    return ["tok "] * len(data)
