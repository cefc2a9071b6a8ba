"""The demo target's OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions.

Every token is one real step of the target's engine (onnx mode: one ONNX Runtime run of the
demo model through the same request pool as KServe inference; the next token's input is made
from the previous token, so the steps form a chain), and is released on a known schedule: the
first text token ``--ttft-ms`` D after the request arrived, each later one ``--itl-ms`` G after
the one before (token k at arrival + D + k*G; a step that computes longer than its slot is
released late, as a saturated server's would be).  Tests compare what the client measures
with D and G.

Output length: ``max_tokens`` (default 16, as vLLM), cut to ``--output-tokens`` N when N > 0
(the model "meets its end of sequence"), unless the request says ``ignore_eos``;
``min_tokens`` raises it (vLLM's extension).  Prompt tokens are counted as whitespace-separated
words, the same approximation the kneeswarm client uses without a tokenizer.

``--usage-offset K`` makes ``usage.completion_tokens`` say K tokens more than were produced (a
server whose own count disagrees with what it streamed: the client's token-count check must say so
where it has an independent count -- the plan's tokenizer or a pinned length).

``--tokens-per-chunk N`` merges N tokens into each streamed chunk (the last chunk may hold fewer), sent
when its last token is released, as a server that detokenizes incrementally does: the first chunk
leaves D + (N-1)*G after arrival and the chunks N*G apart; ``usage`` still counts tokens.
``--no-text-every K`` makes every K-th streamed answer (the K-th, 2K-th ... this server streams)
send its chunks with empty text, usage still counting the tokens: a stream with no first token.

With ``--models cheap:5,slow:40`` (mix.py) each model is served under its own name (the request's
``model``, listed by /v1/models): a request first holds its model's slot for its service time, as
on the KServe endpoint, then gets its tokens on the schedule above (counted from its arrival: a
token due during the wait leaves at its end), and ``vllm:request_success_total{model_name}``
counts each model apart; an unknown model is vLLM's 404 ``NotFoundError``.

``--adapters a,b --max-loras K`` serves LoRA adapters under their names beside the base model, K
at once, swapping the others in (lora.py): a request's schedule starts when its adapter is ready,
and a swap stalls every running generation for its length.

Streams follow vLLM: a first chunk with only ``role``, one chunk per token (or per N), ``finish_reason`` on
the last token's chunk, an extra ``usage`` chunk (``choices: []``) when the request asks
``stream_options.include_usage``, then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kneeswarm.target.engine import Rejected
from kneeswarm.target.gate import ARRIVED
from kneeswarm.target.llmengine import LLMEngine, PromptTooLong
from kneeswarm.target.lora import Adapters
from kneeswarm.target.metrics import TargetMetrics

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16
DEFAULT_MAX_BATCH = 256  # vLLM's max_num_seqs default
DEFAULT_DECODE_MS = 10.0
# asyncio's epoll wait rounds its timeout up to whole milliseconds, so a sleep ends 0-1 ms after
# it was due (plus scheduling); aiming this much early centres each release on its due time.
TIMER_SLACK_S = 0.0005
VOCAB = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi")


class BadLLMRequest(ValueError):
    """A completion request this server cannot serve: 400."""


@dataclass(frozen=True)
class LLMConfig:
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    output_tokens: int = 0  # 0: produce max_tokens
    usage_offset: int = 0  # usage.completion_tokens = tokens produced + this (never below 0)
    tokens_per_chunk: int = 1  # tokens merged into one streamed chunk
    no_text_every: int = 0  # every K-th streamed answer sends its tokens in chunks without text (0: none)
    # the engine model (llmengine.py): on when kv_tokens > 0; then ttft_ms and itl_ms are not used
    kv_tokens: int = 0
    max_batch: int = DEFAULT_MAX_BATCH
    prefill_ms_per_token: float = 0.0
    decode_ms: float = DEFAULT_DECODE_MS
    decode_ms_per_seq: float = 0.0
    prefix_cache_blocks: int = 0  # the engine model's prefix cache, in blocks (0: none)
    # LoRA adapters (lora.py): served under their names beside the base model; not with kv_tokens
    adapters: tuple[str, ...] = ()
    max_loras: int = 1
    swap_ms: float = 0.0


@dataclass
class Completion:
    model: str
    chat: bool
    prompt_tokens: int
    n: int  # tokens to generate
    finish: str  # "length" or "stop"
    stream: bool
    usage: bool
    words: list[str] | None = None  # the prompt's words (the engine model's prefix cache reads them)


def parse_completion(doc: Any, chat: bool, cfg: LLMConfig) -> Completion:
    """The request's model, prompt length and output length, or BadLLMRequest."""
    if not isinstance(doc, dict):
        raise BadLLMRequest("body must be a JSON object")
    if chat:
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadLLMRequest("'messages' must be a non-empty list of objects")
        prompt = " ".join(str(m.get("content") or "") for m in messages)
    else:
        given = doc.get("prompt")
        if not isinstance(given, str):
            raise BadLLMRequest("'prompt' must be a string")
        prompt = given
    max_tokens = doc.get("max_tokens", doc.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadLLMRequest(f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    n = max_tokens
    if cfg.output_tokens and not doc.get("ignore_eos"):
        n = min(n, cfg.output_tokens)
    min_tokens = doc.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool):
        n = min(max_tokens, max(n, min_tokens))
    options = doc.get("stream_options") or {}
    words = prompt.split()
    return Completion(model=str(doc.get("model", "")), chat=chat, prompt_tokens=len(words), n=n,
                      finish="length" if n == max_tokens else "stop", stream=bool(doc.get("stream")),
                      usage=bool(isinstance(options, dict) and options.get("include_usage")), words=words)


class TokenChain:
    """One token per engine step: the next input is made from the previous token."""

    def __init__(self, engine: Any, input_dim: int):
        self.engine = engine  # OnnxEngine (real compute) or None (knee mode: schedule only)
        self.input_dim = input_dim

    async def step(self, prev: int) -> int:
        if self.engine is None:
            return (prev * 7 + 3) % len(VOCAB)
        x = np.zeros((1, self.input_dim), dtype=np.float32)
        x[0, prev % self.input_dim] = 1.0
        x[0, (prev * 7 + 3) % self.input_dim] = -1.0
        out = await self.engine.infer(x)
        return int(np.argmax(out[0])) + prev + 1


def llm_routes(model_name: str, chain: TokenChain, metrics: TargetMetrics, cfg: LLMConfig,
               ready: Any, also: tuple[str, ...] = (), mix: Any = None) -> list[Route]:
    """The OpenAI-compatible routes; ``ready()`` says whether the server is ready.  ``--models``
    (mix.py): ``also`` the further models served, ``mix`` the MixEngine whose ``infer(model)``
    each request waits for first (its model's slot for its service time), then its tokens."""
    models_served = (model_name, *also, *cfg.adapters)
    streams = itertools.count(1)  # streamed answers so far (--no-text-every)
    engine = (LLMEngine(metrics, cfg.kv_tokens, cfg.max_batch, cfg.prefill_ms_per_token, cfg.decode_ms,
                        cfg.decode_ms_per_seq, cfg.prefix_cache_blocks)
              if cfg.kv_tokens > 0 else None)
    adapters = Adapters(metrics, cfg.adapters, cfg.max_loras, cfg.swap_ms) if cfg.adapters else None

    async def health(request: Request) -> Response:
        return Response(status_code=200 if ready() else 503)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_card(n, model_name if n in cfg.adapters else None)
                                                        for n in models_served]})

    def handler(chat: bool) -> Any:
        async def complete(request: Request) -> Response:
            try:
                c = parse_completion(json.loads(await request.body()), chat, cfg)
            except (ValueError, BadLLMRequest) as e:
                metrics.requests.labels(code="400").inc()
                return _error(400, f"bad request: {e}", "BadRequestError")
            metrics.record_received("openai", c.model, 1)
            if c.model not in models_served:
                metrics.requests.labels(code="404").inc()
                return _error(404, f"The model `{c.model}` does not exist.", "NotFoundError")
            if engine is not None:
                try:
                    engine.check(c.prompt_tokens, c.n)
                except PromptTooLong as e:
                    metrics.requests.labels(code="400").inc()
                    return _error(400, f"bad request: {e}", "BadRequestError")
            if mix is not None:  # --models: the model's own cost first (its slot, its service time)
                try:
                    await mix.infer(c.model)
                except Rejected as e:
                    metrics.rejected.inc()
                    metrics.requests.labels(code="503").inc()
                    return _error(503, str(e), "ServiceUnavailableError")
            metrics.prompt_tokens.inc(c.prompt_tokens)
            gen = Generation(c, chain, metrics, cfg, request.scope.get(ARRIVED), engine)
            gen.adapters = adapters if c.model in cfg.adapters else None
            if c.stream and cfg.no_text_every and next(streams) % cfg.no_text_every == 0:
                gen.no_text = True
            if c.stream:
                return StreamingResponse(gen.sse(), media_type="text/event-stream")
            return JSONResponse(await gen.whole())

        return complete

    return [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/chat/completions", handler(True), methods=["POST"]),
        Route("/v1/completions", handler(False), methods=["POST"]),
    ]


def _card(name: str, parent: str | None) -> dict[str, Any]:
    """/v1/models' entry of a model; vLLM lists an adapter with its base model as ``parent``."""
    card: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": "kneeswarm"}
    return {**card, "root": name, "parent": parent} if parent else card


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": kind, "code": status}, status_code=status)


class Generation:
    """One request's tokens, released on the D + k*G schedule."""

    def __init__(self, c: Completion, chain: TokenChain, metrics: TargetMetrics, cfg: LLMConfig,
                 arrived: float | None = None, engine: LLMEngine | None = None):
        self.c, self.chain, self.metrics, self.cfg, self.engine = c, chain, metrics, cfg, engine
        self.id = f"cmpl-{uuid.uuid4().hex[:16]}"
        self.created = int(time.time())
        self.arrived = arrived if arrived is not None else time.perf_counter()  # the schedule's origin
        self.no_text = False  # stream the tokens in chunks with empty text (--no-text-every)
        self.adapters: Adapters | None = None  # the adapter slots, where the request names an adapter

    async def tokens(self) -> AsyncIterator[str]:
        if self.engine is not None:
            async for text in self._engine_tokens(self.engine):
                yield text
            return
        m, prev, last = self.metrics, self.c.prompt_tokens, 0.0
        slots, origin, stall0 = self.adapters, self.arrived, 0.0
        if slots is not None:  # wait for the adapter (its slot, its swap): the schedule starts when it is ready
            asked = asyncio.get_running_loop().time()
            origin += max(0.0, await slots.acquire(self.c.model) - asked)  # raising, it holds nothing
            stall0 = slots.stalled_s
        m.llm_running.inc()
        try:
            for k in range(self.c.n):
                prev = await self.chain.step(prev)
                stalled = slots.stalled_s - stall0 if slots is not None else 0.0  # swaps since it started held it
                due = origin + stalled + (self.cfg.ttft_ms + k * self.cfg.itl_ms) / 1000.0
                delay = due - time.perf_counter() - TIMER_SLACK_S
                if delay > 0:
                    await asyncio.sleep(delay)
                last = self._token_out(k, last)
                yield VOCAB[prev % len(VOCAB)] + " "
            self._done()
        finally:
            m.llm_running.dec()
            if slots is not None:
                slots.release(self.c.model)

    def _token_out(self, k: int, last: float) -> float:
        """Token ``k`` leaves now: its time to the first token (k = 0) or from the one before
        (``last``) and the count, in /metrics; returns now."""
        m, now = self.metrics, time.perf_counter()
        if k == 0:
            m.ttft.observe(now - self.arrived)
        else:
            m.itl.observe(now - last)
        m.generation_tokens.inc()
        return now

    def _done(self) -> None:
        """Every token left: the request counted as served, with its end-to-end time."""
        m = self.metrics
        m.llm_success.labels(finished_reason=self.c.finish, model_name=self.c.model).inc()
        if self.adapters is not None:
            m.lora_requests.labels(adapter=self.c.model).inc()
        m.e2e.observe(time.perf_counter() - self.arrived)
        m.requests.labels(code="200").inc()

    async def _engine_tokens(self, engine: LLMEngine) -> AsyncIterator[str]:
        """The tokens as the engine model produces them (its batch, its cache, its preemptions)."""
        prev, last = self.c.prompt_tokens, 0.0
        seq = engine.submit(self.c.prompt_tokens, self.c.n, self.c.words)
        try:
            for k in range(self.c.n):
                await seq.out.get()
                last = self._token_out(k, last)
                prev = (prev * 7 + 3) % len(VOCAB)
                yield VOCAB[prev] + " "
            self._done()
        finally:
            engine.abort(seq)  # a client that left frees its KV (no-op once done)

    def _chunk(self, text: str | None, finish: str | None, role: bool = False) -> bytes:
        c = self.c
        if c.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        doc = {"id": self.id, "object": obj, "created": self.created, "model": c.model, "choices": [choice]}
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def _usage(self) -> dict:
        out = max(0, self.c.n + self.cfg.usage_offset)  # --usage-offset: a count that disagrees on purpose
        return {"prompt_tokens": self.c.prompt_tokens, "completion_tokens": out,
                "total_tokens": self.c.prompt_tokens + out}

    async def sse(self) -> AsyncIterator[bytes]:
        if self.c.chat:
            yield self._chunk(None, None, role=True)
        k, merged, per = 0, [], self.cfg.tokens_per_chunk
        async for text in self.tokens():
            k += 1
            merged.append(text)
            if len(merged) == per or k == self.c.n:
                yield self._chunk("" if self.no_text else "".join(merged), self.c.finish if k == self.c.n else None)
                merged = []
        if self.c.usage:
            doc: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk" if self.c.chat else "text_completion",
                   "created": self.created, "model": self.c.model, "choices": [], "usage": self._usage()}
            yield b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def whole(self) -> dict:
        text = "".join([t async for t in self.tokens()])
        if self.c.chat:
            choice: dict = {"index": 0, "message": {"role": "assistant", "content": text},
                            "logprobs": None, "finish_reason": self.c.finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.c.finish}
        return {"id": self.id, "object": "chat.completion" if self.c.chat else "text_completion",
                "created": self.created, "model": self.c.model, "choices": [choice], "usage": self._usage()}
