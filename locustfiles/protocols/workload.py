"""Realistic inputs: prompts from a JSONL dataset, or synthetic lengths drawn from a distribution.

Dataset (``[request] dataset = "prompts.jsonl"``, a path relative to the working directory):
one JSON object per line, with ``prompt`` (a string) or ``messages`` (a chat list of
``{"role", "content"}``), and optionally ``max_tokens`` (an integer).  Blank lines are skipped;
anything else is a one-line ``WorkloadError`` naming the file and line.

Lengths (``[request.lengths]``): ``input`` and ``output`` tables, each
``{dist = "fixed" | "uniform" | "normal" | "lognormal", mean, stdev, min, max}`` in tokens;
draws are rounded to integers and clipped to [min, max] (min defaults to 1, max to 100 000).
``lognormal`` takes the mean and stdev of the lengths themselves (not of their logarithm).
Token counts (``TokenCounter``): with ``[request] tokenizer = "tokenizer.json"`` (a Hugging Face
``tokenizers`` file; ``pip install kneeswarm[tokenizer]``) prompts are counted and synthetic ones
built with that tokenizer; without one, a token is a whitespace-separated word (the demo target
counts the same way; a real server's ``usage`` says how far that is off).  A chat's count is the
sum of its messages' contents (a chat template's own tokens are not counted).

Replay (``[request] replay = "recorded.jsonl"``): recorded production requests, one JSON object per
line with ``body`` (the request body exactly as it was sent) and, optionally, ``t`` (seconds since
the recording began).  This is the OpenAI batch-input shape (``{"custom_id", "method", "url",
"body"}``), which such files are accepted as, with the one added field ``t``; a ``url`` must be the
path the plan sends to.  Either every line has ``t`` or none; times never go back.  Bodies are
sent as recorded (the plan's ``model`` fills in only where a body has none) in file order, from one
cursor per load-generator process; after the last line the file starts again.  In open loop with
times, arrivals follow the recorded gaps, scaled so that the step's rate is kept (see ``Replay``).

Mooncake trace (``[request] trace = "trace.jsonl"``, openai): one JSON object per line with
``timestamp`` (milliseconds), ``input_length``, ``output_length`` and ``hash_ids`` (one integer per
block of ``trace_block_tokens`` prompt tokens, 512 in Mooncake's traces; requests with the same id
share that block).  Prompts are synthesised (``TracePrompts``): each hash id's block is drawn from
the id alone, so shared ids are shared tokens; ``output_length`` is the request's ``max_tokens``.
Sent in file order, round and round, timed like a replay (``Replay``: the trace's gaps, scaled to
each step's rate in open loop).  A line with a field missing, times going back, a hash id that is
not an integer, or more hash ids than its input length has blocks: one-line ``WorkloadError``
naming the line, before any load.

Shared prefixes and conversations (``SharedPrefixes``, ``dist_of``): see protocols/openai.py.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kneeswarm.locustfiles.protocols.base import PreparedRequest, ProtocolError

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
MAX_LENGTH = 100_000
#: Synthetic prompts are drawn from these words (one token each without a tokenizer).
WORDS = ("the", "model", "server", "token", "stream", "latency", "queue", "batch", "answer", "load",
         "knee", "swarm", "engine", "request", "user", "step")
RESYNC_S = 5.0  # replay in open loop: a schedule this far behind (no users ran it) restarts at the present
POOL_FROM_VOCAB = 64  # a tokenizer's own one-token words added when too few of WORDS are one token
_counters: dict[str | None, TokenCounter] = {}  # one per tokenizer file and process
_datasets: dict[str, list[dict]] = {}  # loaded once per process, shared by its users
_dataset_tokens: dict[tuple[str, str | None], list[int | None]] = {}  # (dataset, tokenizer) -> tokens per record
_replays: dict[tuple, Replay] = {}  # one per file, protocol and process: its cursor is shared by the users


class WorkloadError(ProtocolError):
    """A dataset or length table that cannot be used; str() is one line."""


@dataclass(frozen=True)
class LengthDist:
    dist: str = "fixed"
    mean: float = 32.0
    stdev: float = 0.0
    min: int = 1
    max: int = MAX_LENGTH

    @classmethod
    def from_table(cls, table: Any, where: str) -> LengthDist:
        if not isinstance(table, dict):
            raise WorkloadError(f"{where} must be a table like {{dist = \"normal\", mean = 128, stdev = 32}}")
        unknown = set(table) - {"dist", "mean", "stdev", "min", "max"}
        if unknown:
            raise WorkloadError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: dist, max, mean, min, stdev)")
        d = cls(**table)
        if d.dist not in DISTRIBUTIONS:
            raise WorkloadError(f"{where}.dist must be one of {', '.join(DISTRIBUTIONS)}, got {d.dist!r}")
        numbers = (d.mean, d.stdev, d.min, d.max)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in numbers):
            raise WorkloadError(f"{where}: mean, stdev, min and max must be finite numbers")
        if d.mean <= 0 or d.stdev < 0 or not 1 <= d.min <= d.max:
            raise WorkloadError(f"{where}: needs mean > 0, stdev >= 0 and 1 <= min <= max")
        return d

    def sample(self, rng: random.Random) -> int:
        """One length in [min, max]."""
        if self.dist == "fixed" or self.stdev == 0:
            x = self.mean
        elif self.dist == "uniform":  # mean +- stdev * sqrt(3) has that mean and stdev
            half = self.stdev * math.sqrt(3.0)
            x = rng.uniform(self.mean - half, self.mean + half)
        elif self.dist == "normal":
            x = rng.gauss(self.mean, self.stdev)
        else:
            x = self._lognormal(rng)
        if not math.isfinite(x):  # extreme tables (stdev >> mean) can overflow: the nearest bound
            x = self.max if x > 0 else self.min
        return int(min(max(round(x), self.min), self.max))


    def _lognormal(self, rng: random.Random) -> float:
        """A lognormal draw whose own mean and stdev are the table's (the mean where that overflows)."""
        try:
            sigma2 = math.log1p((self.stdev / self.mean) ** 2)
            return rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        except (OverflowError, ValueError):  # stdev/mean beyond float range: no shape left to draw
            return self.mean


def load_dataset(path: str) -> list[dict]:
    """The records of a JSONL prompt file (cached per process), or WorkloadError."""
    if path in _datasets:
        return _datasets[path]
    records = [_record(line, f"request.dataset {path}:{number}")
               for number, line in _jsonl_lines(path, f"request.dataset {path}")]
    if not records:
        raise WorkloadError(f"request.dataset {path}: no records")
    _datasets[path] = records
    return records


def dataset_tokens(path: str, counter: TokenCounter) -> list[int | None]:
    """Tokens in of each record of the dataset at ``path`` under ``counter``, None until the record
    is first sent: shared by the process's users, so each prompt is counted once, not per request
    (a tokenizer's encode costs tens of microseconds)."""
    key = (path, counter.path)
    if key not in _dataset_tokens:
        _dataset_tokens[key] = [None] * len(load_dataset(path))
    return _dataset_tokens[key]


def _jsonl_lines(path: str, where: str) -> list[tuple[int, str]]:
    """The non-blank lines of a JSONL file with their 1-based numbers, or WorkloadError."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{where}: cannot read ({type(e).__name__}: {e})") from None
    return [(number, line) for number, line in enumerate(lines, 1) if line.strip()]


def _json_object(line: str, where: str) -> dict:
    """One JSONL line as a JSON object, or WorkloadError naming file and line."""
    try:
        doc = json.loads(line)
    except ValueError as e:
        raise WorkloadError(f"{where}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise WorkloadError(f"{where}: each line must be a JSON object")
    return doc


def _record(line: str, where: str) -> dict:
    doc = _json_object(line, where)
    prompt, messages = doc.get("prompt"), doc.get("messages")
    if isinstance(prompt, str):
        out: dict = {"prompt": prompt}
    elif isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        out = {"messages": [{"role": str(m.get("role", "user")), "content": m["content"]} for m in messages]}
    else:
        raise WorkloadError(f"{where}: needs \"prompt\" (a string) or \"messages\" (a list of {{role, content}})")
    max_tokens = doc.get("max_tokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise WorkloadError(f"{where}: max_tokens must be a positive integer")
        out["max_tokens"] = max_tokens
    return out


def words(record: dict) -> int:
    """Prompt length of a record, in words (the token approximation)."""
    if "prompt" in record:
        return len(record["prompt"].split())
    return sum(len(m["content"].split()) for m in record["messages"])


# -- token counts -------------------------------------------------------------------------------
class TokenCounter:
    """Counts tokens with a Hugging Face tokenizer file, or as whitespace-separated words without one."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._tok = _tokenizer(path) if path else None
        self.pool = self._one_token_words() if self._tok is not None else list(WORDS)

    def count(self, text: str) -> int:
        if self._tok is None:
            return len(text.split())
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_record(self, record: dict) -> int | None:
        """A prompt's or a chat's tokens (a chat: the sum of its messages' contents; a prompt given
        as token ids: their number); None when the record has neither."""
        prompt, messages = record.get("prompt"), record.get("messages")
        if isinstance(prompt, str):
            return self.count(prompt)
        if isinstance(prompt, list):  # /v1/completions also takes token ids or several strings
            return sum(self.count(p) if isinstance(p, str) else 1 for p in prompt)
        if isinstance(messages, list):
            return sum(self.count(m["content"]) for m in messages
                       if isinstance(m, dict) and isinstance(m.get("content"), str))
        return None

    def prompt(self, n: int, rng: random.Random) -> str:
        """A synthetic prompt of ``n`` tokens: ``n`` words that are one token each, in context."""
        return " ".join(rng.choice(self.pool) for _ in range(n))

    def _one_token_words(self) -> list[str]:
        """Words this tokenizer reads as one token alone and after a space (WORDS first, then its
        own vocabulary's alphabetic entries); empty: every prompt is WORDS, counted as it falls."""
        def one(w: str) -> bool:
            return self.count(w) == 1 and self.count(f"{w} {w}") == 2

        pool = [w for w in WORDS if one(w)]
        if len(pool) < 4:
            vocab = sorted(self._tok.get_vocab())  # type: ignore[union-attr]
            found = (w for w in vocab if w.isascii() and w.isalpha() and w not in pool and one(w))
            pool += list(itertools.islice(found, POOL_FROM_VOCAB))  # lazily: a vocabulary can be 200k entries
        if not pool:
            logger.warning("kneeswarm: tokenizer %s has no one-token words; prompt lengths are approximate", self.path)
            return list(WORDS)
        return pool


def _tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise WorkloadError(f"request.tokenizer {path}: needs the tokenizers package "
                            "(pip install 'kneeswarm[tokenizer]')") from None
    if not Path(path).is_file():
        raise WorkloadError(f"request.tokenizer {path}: no such file")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception type for a bad file
        raise WorkloadError(f"request.tokenizer {path}: not a Hugging Face tokenizer.json "
                            f"({' '.join(str(e).split())[:120]})") from None


def token_counter(path: str | None) -> TokenCounter:
    """This process's counter for ``path`` (None: the word approximation), or WorkloadError."""
    if path not in _counters:
        _counters[path] = TokenCounter(path)
    return _counters[path]


# -- replay -------------------------------------------------------------------------------------
class Recorded(NamedTuple):
    body: dict  # the request body as recorded
    t: float | None  # seconds since the recording began (None: no times in the file)
    url: str | None  # the batch-file shape's path, when given


def load_replay(path: str) -> list[Recorded]:
    """The recorded requests of a JSONL file, in order, or WorkloadError (one line, naming file and line)."""
    where = f"request.replay {path}"
    records: list[Recorded] = []
    first = 0
    for number, line in _jsonl_lines(path, where):
        r = _recorded(line, f"{where}:{number}")
        if records and (r.t is None) != (records[0].t is None):
            raise WorkloadError(f"{where}:{number}: every line needs \"t\" or none does "
                                f"(line {first} {'has' if records[0].t is not None else 'has not'})")
        if records and r.t is not None and r.t < records[-1].t:  # type: ignore[operator]
            raise WorkloadError(f"{where}:{number}: times go back (t = {r.t:g} after {records[-1].t:g})")
        first = first or number
        records.append(r)
    if not records:
        raise WorkloadError(f"{where}: no records")
    if records[0].t is not None and len(records) > 1 and records[-1].t == records[0].t:
        raise WorkloadError(f"{where}: every t is {records[0].t:g}: the recording spans no time")
    return records


def _recorded(line: str, where: str) -> Recorded:
    doc = _json_object(line, where)
    body = doc.get("body")
    if not isinstance(body, dict):
        raise WorkloadError(f"{where}: needs \"body\" (the request body, a JSON object)")
    t = doc.get("t")
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0):
        raise WorkloadError(f"{where}: t must be a number of seconds >= 0, got {t!r}")
    url = doc.get("url")
    if url is not None and not isinstance(url, str):
        raise WorkloadError(f"{where}: url must be a string")
    return Recorded(body, None if t is None else float(t), url)


class Replay:
    """One recording and the process's place in it (shared by every user of the process).

    ``next()`` hands the recorded requests out in file order, round and round.  ``ticket(rate)``
    (open loop, a recording with times) also says when to send: the recorded gap before each
    request, multiplied by ``recorded rate / rate`` so that the arrivals run at ``rate`` (this
    process's share of the step's rate) with the recording's shape; a step whose rate equals the
    recording's own mean rate (``recorded_rate``) replays it at its recorded speed.  After the
    last request the gap back to the first is the recording's mean gap.
    """

    def __init__(self, records: list[Recorded], requests: list[PreparedRequest]):
        self.records = records
        self.requests = requests
        self.i = -1
        self.timed = records[0].t is not None and len(records) > 1
        span = (records[-1].t or 0.0) - (records[0].t or 0.0)
        self.recorded_rate = (len(records) - 1) / span if self.timed else None
        self._next_t: float | None = None  # open loop: intended time of the last ticket

    def next(self) -> PreparedRequest:
        self.i = (self.i + 1) % len(self.requests)
        return self.requests[self.i]

    def gap(self, i: int) -> float:
        """Recorded seconds between request i and the one before it (the mean gap before the first)."""
        if i == 0:
            return 1.0 / self.recorded_rate  # type: ignore[operator]
        return self.records[i].t - self.records[i - 1].t  # type: ignore[operator]

    def ticket(self, rate: float, now: float) -> tuple[float, PreparedRequest]:
        """(intended send time, request) of the next arrival at ``rate`` requests/s (open loop, timed).
        A schedule more than RESYNC_S behind ``now`` (no users ran it) starts again from ``now``."""
        if self._next_t is None or now - self._next_t > RESYNC_S:
            self._next_t = now
        else:
            self._next_t += self.gap((self.i + 1) % len(self.requests)) * self.recorded_rate / rate  # type: ignore[operator]
        return self._next_t, self.next()


def replay_for(path: str, key: tuple, build: Any) -> Replay:
    """This process's Replay of ``path`` for the protocol ``key`` names (built once:
    ``build(record, where) -> PreparedRequest``)."""
    if key not in _replays:
        records = load_replay(path)
        _replays[key] = Replay(records, [build(r, f"request.replay {path}: request {i + 1}")
                                         for i, r in enumerate(records)])
    return _replays[key]


class Replayed:
    """A protocol whose requests are a recording's bodies; all else (path, headers, how answers
    are judged, health and preflight) is the plan's protocol's own."""

    def __init__(self, inner: Any, path: str, counter: TokenCounter):
        self.inner = inner
        template = inner.next_request()  # the protocol's method, path and headers
        key = (path, inner.name, template.path, inner.cfg.get("model"), counter.path)
        self.replay = replay_for(path, key, lambda r, where: _replayed_request(inner, template, r, where, counter))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_request(self) -> PreparedRequest:
        return self.replay.next()


def _replayed_request(inner: Any, template: PreparedRequest, r: Recorded, where: str,
                      counter: TokenCounter) -> PreparedRequest:
    """One recorded body as the protocol would send it (OpenAI: streamed when the body says so)."""
    if r.url is not None and r.url.split("?")[0] != template.path:
        raise WorkloadError(f"{where} was sent to {r.url} but the plan sends to {template.path}")
    body = r.body
    llm = inner.name == "openai"
    if llm and "model" not in body:
        body = {"model": inner.cfg.get("model", "demo"), **body}
    data = json.dumps(body, separators=(",", ":")).encode()
    return PreparedRequest(template.method, template.path, data, template.headers,
                           tokens_in=counter.count_record(body) if llm else None,
                           stream=llm and body.get("stream") is True, items=template.items)


# -- shared prefixes, conversations, Mooncake traces (LLM serving as it is used) ------------------
def dist_of(value: Any, where: str, minimum: int = 1) -> LengthDist | None:
    """A number (fixed) or a LengthDist table; None for 0 (``think_ms = 0``: no think time)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value == 0 and minimum == 0:
            return None
        if not math.isfinite(value) or value < max(1, minimum):
            raise WorkloadError(f"{where} must be >= {max(1, minimum)} or a table like "
                                "{dist = \"normal\", mean = 4, stdev = 1}")
        return LengthDist(mean=float(value), min=1, max=max(int(value), MAX_LENGTH))
    return LengthDist.from_table(value, where)


class SharedPrefixes:
    """``[request.prefix] tokens, count, share``: ``count`` prompts of ``tokens`` tokens, the same in
    every load-generator process (drawn from the plan's seed only); each request starts with one of
    them (chosen uniformly) with probability ``share``."""

    def __init__(self, table: dict, counter: TokenCounter, seed: Any = 0):
        self.tokens = int(table.get("tokens", 1))
        self.count = int(table.get("count", 1))
        self.share = float(table.get("share", 1.0))
        self.texts = [counter.prompt(self.tokens, random.Random(f"prefix:{seed}:{k}")) for k in range(self.count)]
        self.token_counts = [counter.count(t) for t in self.texts]

    def draw(self, rng: random.Random) -> int | None:
        """The prefix a new request starts with, or None."""
        if self.share <= 0 or rng.random() >= self.share:
            return None
        return rng.randrange(self.count)


class TraceRecord(NamedTuple):
    t: float  # seconds since the trace began (its timestamp is in milliseconds)
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]  # one per block of the prompt, in order; a shared id = shared tokens


TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _trace_record(line: str, where: str, block_tokens: int) -> TraceRecord:
    doc = _json_object(line, where)
    missing = [f for f in TRACE_FIELDS if f not in doc]
    if missing:
        raise WorkloadError(f"{where}: missing {', '.join(repr(f) for f in missing)} "
                            f"(a Mooncake trace line has {', '.join(TRACE_FIELDS)})")
    t, n_in, n_out, ids = (doc[f] for f in TRACE_FIELDS)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        raise WorkloadError(f"{where}: timestamp must be milliseconds >= 0, got {t!r}")
    if not _positive_int(n_in) or not _positive_int(n_out):
        raise WorkloadError(f"{where}: input_length and output_length must be integers >= 1, "
                            f"got {n_in!r} and {n_out!r}")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise WorkloadError(f"{where}: hash_ids must be a list of integers, got {str(ids)[:60]}")
    if len(ids) > -(-n_in // block_tokens):
        raise WorkloadError(f"{where}: {len(ids)} hash_ids are more blocks than input_length {n_in} holds at "
                            f"{block_tokens} tokens a block (request.trace_block_tokens)")
    return TraceRecord(float(t) / 1000.0, n_in, n_out, tuple(ids))


def load_trace(path: str, block_tokens: int = 512) -> list[TraceRecord]:
    """A Mooncake trace (JSONL), in order, or WorkloadError (one line naming file and line)."""
    where = f"request.trace {path}"
    records: list[TraceRecord] = []
    for number, line in _jsonl_lines(path, where):
        r = _trace_record(line, f"{where}:{number}", block_tokens)
        if records and r.t < records[-1].t:
            raise WorkloadError(f"{where}:{number}: times go back (timestamp {r.t * 1000:g} after "
                                f"{records[-1].t * 1000:g})")
        records.append(r)
    if not records:
        raise WorkloadError(f"{where}: no records")
    if len(records) > 1 and records[-1].t == records[0].t:
        raise WorkloadError(f"{where}: every timestamp is {records[0].t * 1000:g}: the trace spans no time")
    return records


class TracePrompts:
    """Prompts synthesised from a trace: block j of a request is the text of its hash id j
    (``block_tokens`` words drawn from the id alone, so requests sharing an id share those tokens,
    the last block cut to the input length); tokens beyond its hash ids are this sending's own
    (drawn afresh each time the request is sent, in each process: a trace sent round and round
    shares what its hash ids say, nothing more)."""

    CACHED_BLOCKS = 4096

    def __init__(self, counter: TokenCounter, block_tokens: int, seed: Any = 0):
        self.counter, self.block_tokens, self.seed = counter, block_tokens, seed
        self._blocks: dict[int, list[str]] = {}
        self._own = random.Random()  # the tokens beyond the hash ids: never the same twice

    def block(self, h: int) -> list[str]:
        if h not in self._blocks:
            if len(self._blocks) >= self.CACHED_BLOCKS:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[h] = self.counter.prompt(self.block_tokens, random.Random(f"trace:{self.seed}:{h}")).split()
        return self._blocks[h]

    def prompt(self, r: TraceRecord) -> str:
        words: list[str] = []
        for h in r.hash_ids:
            words += self.block(h)[:r.input_length - len(words)]
        rest = r.input_length - len(words)
        if rest > 0:
            words += self.counter.prompt(rest, self._own).split()
        return " ".join(words)


class _LazyRequests:
    """A trace's requests, built when first sent (a whole trace's prompts would not fit in memory)."""

    def __init__(self, records: list[TraceRecord], build: Any):
        self.records, self.build = records, build

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> PreparedRequest:
        return self.build(self.records[i])


class Traced(Replayed):
    """A protocol (openai) whose requests follow a Mooncake trace: its lengths, shared blocks and
    arrival times (workload.Replay hands them out and, in open loop, times them)."""

    def __init__(self, inner: Any, path: str, counter: TokenCounter, block_tokens: int):  # noqa: D107
        self.inner = inner
        key = ("trace", path, block_tokens, inner.cfg.get("model"), counter.path, inner.cfg.get("endpoint"))
        if key not in _replays:
            records = load_trace(path, block_tokens)
            prompts = TracePrompts(counter, block_tokens, inner.cfg.get("seed", 0))

            def build(r: TraceRecord) -> PreparedRequest:
                text = prompts.prompt(r)
                return inner._build(text, inner.stream, max_tokens=r.output_length, tokens_in=counter.count(text))

            _replays[key] = Replay([Recorded({}, r.t, None) for r in records], _LazyRequests(records, build))  # type: ignore[arg-type]
        self.replay = _replays[key]
