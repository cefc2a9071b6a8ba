"""Inference protocols: how to build a request body, judge a response, check a model is served.

A protocol knows nothing about Locust or recording; the user class in users.py drives it and
the conductor calls its ``preflight``.  Adding a protocol is one module here plus one line in
PROTOCOLS (and its name in kneeswarm.contracts.plan.PROTOCOLS, which the plan validates against; a test
keeps the two equal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kneeswarm.contracts.classes import classes_of

from kneeswarm.locustfiles.protocols.base import (BadPayload, PreflightError, PreparedRequest, Protocol, ProtocolError, StreamTruncated, Tokens, connection_problem, detail, refusal_hint)
from kneeswarm.locustfiles.protocols.http import GenericHTTP
from kneeswarm.locustfiles.protocols.kserve import KServeV2
from kneeswarm.locustfiles.protocols.kserve_grpc import KServeGrpc
from kneeswarm.locustfiles.protocols.mix import Mixed
from kneeswarm.locustfiles.protocols.openai import OpenAI
from kneeswarm.locustfiles.protocols.tfserving import TFServing
from kneeswarm.locustfiles.protocols.torchserve import TorchServe
from kneeswarm.locustfiles.protocols.torchserve_grpc import TorchServeGrpc
from kneeswarm.locustfiles.protocols.triton_stream import TritonStream
from kneeswarm.locustfiles.protocols.workload import Replayed, Traced, token_counter

if TYPE_CHECKING:
    from kneeswarm.contracts.plan import Plan

PROTOCOLS: dict[str, type[Protocol]] = {
    "kserve": KServeV2,
    "openai": OpenAI,
    "torchserve": TorchServe,
    "tfserving": TFServing,
    "http": GenericHTTP,
    "kserve-grpc": KServeGrpc,
    "triton-stream": TritonStream,
    "torchserve-grpc": TorchServeGrpc,
}


def for_plan(plan: Plan, seed: int = 0) -> Protocol:
    """The plan's protocol for one user (ProtocolError when the plan cannot be turned into requests);
    with ``[request] replay`` its requests are the recording's (workload.Replayed), with ``[request]
    trace`` a Mooncake trace's (workload.Traced)."""
    classes = classes_of(plan)
    if classes:  # a traffic mix: a protocol per class, each request drawing its class (mix.py)
        return Mixed(classes, lambda cfg, s: PROTOCOLS[plan.protocol](cfg, seed=s, endpoint=plan.endpoint), seed,
                     plan.endpoint)
    request = vars(plan.request)
    protocol = PROTOCOLS[plan.protocol](request, seed=seed, endpoint=plan.endpoint)
    if request.get("trace"):  # a Mooncake trace: lengths, shared blocks, arrival times (production's, replayed)
        return Traced(protocol, str(request["trace"]), token_counter(request.get("tokenizer")),  # type: ignore[return-value]
                      int(request.get("trace_block_tokens") or 512))
    if request.get("replay"):
        return Replayed(protocol, str(request["replay"]), token_counter(request.get("tokenizer")))  # type: ignore[return-value]
    return protocol


__all__ = ["BadPayload", "PreflightError", "PreparedRequest", "Protocol", "ProtocolError", "StreamTruncated",
           "Tokens", "PROTOCOLS", "for_plan", "connection_problem", "detail", "refusal_hint", "GenericHTTP", "KServeV2", "OpenAI", "TFServing", "TorchServe",
           "KServeGrpc", "TritonStream", "TorchServeGrpc", "Mixed"]
