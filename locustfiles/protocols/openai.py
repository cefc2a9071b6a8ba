"""OpenAI-compatible LLM servers: /v1/chat/completions and /v1/completions, streamed or not.

Works against the conventions of vLLM, SGLang, TGI (its /v1 Messages API), llama.cpp's server
and Ollama (its /v1 compatibility layer); the differences that matter:
- ``stream_options: {"include_usage": true}``: vLLM, SGLang and OpenAI send one extra last
  chunk with ``usage`` (``choices: []``); llama.cpp puts usage (and its own ``timings``) on its
  last chunk; TGI and older Ollama ignore the option: tokens are then counted from chunks and
  the row says so (see sse.py).
- ``ignore_eos`` and ``min_tokens`` (pin the output length) are vLLM/SGLang sampling extensions;
  they are sent only when the plan sets them, since strict servers reject unknown fields.
- Health: vLLM, SGLang and TGI serve ``GET /health``; llama.cpp ``/health``; Ollama ``/``.
  ``health_path`` in the plan overrides it.  Preflight: ``GET /v1/models`` must list the model
  (every one of them serves it); a server without it gets one one-token request instead.

Prompt length: counted with the plan's ``tokenizer`` (a tokenizer.json) when given, else
approximated by whitespace-separated words (workload.TokenCounter); where the server reports ``usage`` its
``prompt_tokens`` replaces the approximation in the row.

Workloads (workload.py): ``dataset`` (JSONL prompts or chats, each user starting at its own
place in the file) or ``[request.lengths]`` (input and output lengths drawn per request from a
distribution; LENGTH_VARIANTS bodies pre-built per user).

Shared prefixes (``[request.prefix] tokens, count, share``, workload.SharedPrefixes): each request
starts with one of ``count`` prompts of ``tokens`` tokens (a chat's system message; a completion's
first words) with probability ``share``; the rest is the request's own message, whose first word is
a nonce (``u<user>n<k>``), so that nothing after the prefix is ever shared by chance.  Bodies are
then built per request; the row records which prefix (``prefix``).

Conversations (``[request.conversation] turns, think_ms``): each user runs sessions of ``turns``
turns (a number, or a distribution table as in ``[request.lengths]``); each turn sends the whole
history -- every message so far, with the answers the server gave -- plus a new user message, and
waits ``think_ms`` before the next turn (``[load] wait_ms`` between sessions).  With a dataset, a
session is one record: its user messages are the turns (its assistant messages are replaced by the
server's answers).  A failed turn ends its session.  The row records the turn number (``turn``).
The answer comes back through :meth:`OpenAI.answered` (users.py calls it after each turn).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import (BODY_VARIANTS, BadPayload, PreflightError, PreparedRequest, Protocol, Tokens, parse_json)
from kneeswarm.locustfiles.protocols.sse import ChatStream
from kneeswarm.locustfiles.protocols.workload import (WORDS, LengthDist, SharedPrefixes, dataset_tokens, dist_of, load_dataset, token_counter)

logger = logging.getLogger(__name__)

LENGTH_VARIANTS = 256  # bodies pre-built per user from [request.lengths] draws
__all__ = ["OpenAI", "WORDS"]


def pinned_length(body: dict) -> int | None:
    """The output length a request body pins, or None: ``max_tokens`` when it says ``ignore_eos``
    or a ``min_tokens`` of at least ``max_tokens`` (the server must then make exactly that many)."""
    n, low = body.get("max_tokens"), body.get("min_tokens")
    if not isinstance(n, int):
        return None
    return n if body.get("ignore_eos") or (isinstance(low, int) and low >= n) else None


@dataclasses.dataclass
class Session:
    """One user's conversation: the turn it is at, its history and what comes next."""

    turns_dist: LengthDist
    think: LengthDist | None
    turns: int = 0
    turn: int = 0
    prefix: int | None = None
    system: list[dict] = dataclasses.field(default_factory=list)
    history: list[dict] = dataclasses.field(default_factory=list)
    pending: list[dict] = dataclasses.field(default_factory=list)  # the turn in flight's messages
    scripted: list[str] = dataclasses.field(default_factory=list)  # a dataset record's user messages

    @property
    def over(self) -> bool:
        return self.turn >= self.turns

    @classmethod
    def from_cfg(cls, table: dict | None, seed: int) -> Session | None:
        if table is None:  # an empty [request.conversation] is one: its defaults (1 turn, no think time)
            return None
        turns = dist_of(table.get("turns", 1), "request.conversation.turns")
        assert turns is not None  # dist_of gives None only for a 0 where 0 is allowed (minimum 0)
        return cls(turns, dist_of(table.get("think_ms", 0), "request.conversation.think_ms", minimum=0))


class OpenAI(Protocol):
    name = "openai"
    health_path = "/health"
    _last_text: str | None = None
    _lengths: tuple[LengthDist, LengthDist] | None = None  # [request.lengths] (input, output)

    def __init__(self, request_cfg: dict, seed: int = 0, endpoint: EndpointPlan | None = None):
        super().__init__(request_cfg, seed, endpoint)
        self.model = request_cfg.get("model", "demo")
        self.chat = request_cfg.get("endpoint", "chat") == "chat"
        self.stream = bool(request_cfg.get("stream", True))
        default = "/v1/chat/completions" if self.chat else "/v1/completions"
        self.path = request_cfg.get("path") or default
        rng = random.Random(f"{request_cfg.get('seed', 0)}:{seed}")
        self.counter = token_counter(request_cfg.get("tokenizer"))  # a tokenizer, or words
        self._dataset: list[dict] | None = None
        self._i = 0
        self._rng = rng
        self._prefixes = (SharedPrefixes(request_cfg["prefix"], self.counter, request_cfg.get("seed", 0))
                          if request_cfg.get("prefix") is not None else None)
        self._session = Session.from_cfg(request_cfg.get("conversation"), seed)
        if request_cfg.get("dataset"):
            self._dataset = load_dataset(str(request_cfg["dataset"]))
            self._dataset_tokens = dataset_tokens(str(request_cfg["dataset"]), self.counter)
            self._i = rng.randrange(len(self._dataset))  # each user starts at its own place
            self._requests = []
        elif request_cfg.get("lengths"):
            self._requests = self._from_lengths(request_cfg["lengths"], rng)
        else:
            fixed = request_cfg.get("data", "random") == "fixed" or request_cfg.get("prompt")
            self._requests = [self._build(self._prompt(rng), self.stream) for _ in range(1 if fixed else BODY_VARIANTS)]

    def _from_lengths(self, table: dict, rng: random.Random) -> list[PreparedRequest]:
        inp = LengthDist.from_table(table.get("input", {"mean": self.cfg.get("prompt_tokens", 32)}),
                                    "request.lengths.input")
        out = LengthDist.from_table(table.get("output", {"mean": self.cfg.get("max_tokens", 64)}),
                                    "request.lengths.output")
        self._lengths = (inp, out)
        return [self._build(self.counter.prompt(inp.sample(rng), rng), self.stream,
                            max_tokens=out.sample(rng)) for _ in range(LENGTH_VARIANTS)]

    def _prompt(self, rng: random.Random) -> str:
        if self.cfg.get("prompt"):
            return str(self.cfg["prompt"])
        return self.counter.prompt(int(self.cfg.get("prompt_tokens", 32)), rng)

    def _build(self, prompt: str, stream: bool, max_tokens: int | None = None,
               messages: list[dict] | None = None, tokens_in: int | None = None) -> PreparedRequest:
        body: dict = {"model": self.model}
        if self.chat:
            body["messages"] = messages or [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt if messages is None else "\n".join(m["content"] for m in messages)
        body["max_tokens"] = max_tokens or int(self.cfg.get("max_tokens", 64))
        body["stream"] = stream
        if stream and self.cfg.get("include_usage", True):
            body["stream_options"] = {"include_usage": True}
        if self.cfg.get("ignore_eos"):
            body["ignore_eos"] = True
        if self.cfg.get("min_tokens") is not None:
            body["min_tokens"] = int(self.cfg["min_tokens"])
        if self.cfg.get("lora") is not None:  # llama.cpp's per-request adapters: [{"id": N, "scale": x}]
            body["lora"] = [{"id": int(a["id"]), "scale": float(a.get("scale", 1.0))} for a in self.cfg["lora"]]
        data = json.dumps(body, separators=(",", ":")).encode()
        if tokens_in is None:
            tokens_in = self.counter.count_record({"prompt": prompt} if messages is None else {"messages": messages})
        return PreparedRequest("POST", self.path, data, self.headers, tokens_in=tokens_in, stream=stream,
                               tokens_pinned=pinned_length(body))

    def next_request(self) -> PreparedRequest:
        if self._session is not None:
            return self._turn(self._session)
        if self._prefixes is not None:
            k = self._prefixes.draw(self._rng)
            text, max_tokens = self._message()
            return self._prefixed(k, [{"role": "user", "content": text}], max_tokens)
        self._i += 1
        if self._dataset is not None:  # built per request: an LLM request's ~10 us, no per-user copy
            k = self._i % len(self._dataset)
            r, tokens_in = self._dataset[k], self._dataset_tokens[k]
            if tokens_in is None:  # first time this process sends the record: counted once
                tokens_in = self._dataset_tokens[k] = self.counter.count_record(r)
            return self._build(r.get("prompt", ""), self.stream, r.get("max_tokens"), r.get("messages"), tokens_in)
        return self._requests[self._i % len(self._requests)]

    def new_stream(self, t0: float) -> ChatStream:
        """A streamed answer's state; with the plan's tokenizer its text is kept and counted (and
        kept in a conversation: the next turn carries it)."""
        return ChatStream(t0, self.chat, self.counter.count if self.counter.path else None,
                          keep_text=self._session is not None)

    # -- shared prefixes and conversations (LLM serving as it is used) ------------------------------
    def _message(self) -> tuple[str, int | None]:
        """A new user message and its max_tokens: a dataset record's text, or a synthetic prompt
        (``[request.lengths]`` or ``prompt_tokens``) whose first word is a nonce."""
        self._i += 1
        if self._dataset is not None:
            r = self._dataset[self._i % len(self._dataset)]
            text = r["prompt"] if "prompt" in r else "\n".join(m["content"] for m in r["messages"])
            return f"u{self.seed}n{self._i} {text}", r.get("max_tokens")
        n, max_tokens = int(self.cfg.get("prompt_tokens", 32)), None
        if self._lengths is not None:
            n, max_tokens = self._lengths[0].sample(self._rng), self._lengths[1].sample(self._rng)
        rest = self.counter.prompt(n - 1, self._rng) if n > 1 else ""
        return f"u{self.seed}n{self._i} {rest}".rstrip(), max_tokens

    def _prefixed(self, k: int | None, messages: list[dict], max_tokens: int | None,
                  turn: int | None = None) -> PreparedRequest:
        """A request of ``messages`` behind shared prefix ``k`` (None: none), tagged for its row."""
        tokens = sum(self.counter.count(m["content"]) for m in messages)
        if k is not None:
            assert self._prefixes is not None
            messages = [{"role": "system", "content": self._prefixes.texts[k]}, *messages]
            tokens += self._prefixes.token_counts[k]
        req = self._build("", self.stream, max_tokens, messages, tokens_in=tokens)
        return dataclasses.replace(req, prefix=k, turn=turn)

    def _turn(self, s: Session) -> PreparedRequest:
        """The session's next turn (a new session when the last one is over)."""
        if s.over:
            self._new_session(s)
        s.turn += 1
        if s.scripted:
            text, max_tokens = s.scripted[s.turn - 1], None
        else:
            text, max_tokens = self._message()
        s.pending = [*s.history, {"role": "user", "content": text}]
        return self._prefixed(s.prefix, [*s.system, *s.pending], max_tokens, turn=s.turn)

    def _new_session(self, s: Session) -> None:
        s.turn, s.history, s.system, s.scripted = 0, [], [], []
        s.prefix = self._prefixes.draw(self._rng) if self._prefixes is not None else None
        if self._dataset is not None:  # a record is a whole conversation: its user messages are the turns
            self._i += 1
            r = self._dataset[self._i % len(self._dataset)]
            messages = r.get("messages") or [{"role": "user", "content": r["prompt"]}]
            s.system = [m for m in messages[:1] if m["role"] == "system"]
            s.scripted = [m["content"] for m in messages if m["role"] == "user"] or [messages[-1]["content"]]
            s.turns = len(s.scripted)
        else:
            s.turns = s.turns_dist.sample(self._rng)

    def answered(self, ok: bool, stream: ChatStream | None) -> None:
        """A conversation turn's outcome (users.py): its answer joins the history; a failure ends the session."""
        s = self._session
        if s is None:
            return
        text = "".join(stream.texts or []) if stream is not None else self._last_text
        if not ok or text is None:
            s.turns = s.turn  # over: the next request starts a new session
            return
        s.history = [*s.pending, {"role": "assistant", "content": text}]

    def think_s(self, between_sessions: float) -> float:
        """Seconds to wait before the next request: think_ms within a session, else ``between_sessions``."""
        s = self._session
        if s is None or s.over or s.think is None:
            return between_sessions
        return s.think.sample(self._rng) / 1000.0

    def check_response(self, body: bytes) -> Tokens | None:
        """A whole (not streamed) answer: choices with text, and usage when the server sends it."""
        try:
            doc = parse_json(body)
        except (ValueError, TypeError) as e:
            raise BadPayload(f"response is not JSON: {e}") from None
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise BadPayload("response has no 'choices'")
        first = choices[0]
        text = (first.get("message") or {}).get("content") if self.chat else first.get("text")
        if not isinstance(text, str):
            raise BadPayload("response's first choice has no text")
        self._last_text = text  # a conversation's next turn carries it (answered)
        usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
        tin, tout = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return Tokens(tin if isinstance(tin, int) else None, tout if isinstance(tout, int) else None)

    def preflight(self, base_url: str, timeout: float = 10.0) -> None:
        r = self._http("GET", base_url, "/v1/models", timeout)
        if 200 <= r.status_code < 300:
            try:
                ids = [m.get("id") for m in r.json().get("data", []) if isinstance(m, dict)]
            except (ValueError, AttributeError):
                ids = None
            if ids is not None:
                if self.model not in ids:
                    served = ", ".join(repr(i) for i in ids[:8]) or "none"
                    raise PreflightError(self.redact(
                        f"model {self.model!r} is not served by {base_url} (GET /v1/models lists {served})"))
                return
        elif r.status_code in (401, 403):
            raise PreflightError(self._refusal(base_url, "GET /v1/models", r) + " (check request.api_key_env)")
        # No usable model list: one one-token request must succeed instead.
        req = self._build("hi", stream=False, max_tokens=1)
        r = self._http("POST", base_url, req.path, timeout, data=req.body)
        if not 200 <= r.status_code < 300:
            raise PreflightError(self._refusal(base_url, f"POST {req.path} (one token)", r))
