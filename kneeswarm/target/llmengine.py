"""A model of an LLM serving engine (vLLM-like) behind the demo target's OpenAI endpoints.

Enabled with ``--kv-tokens K`` (> 0).  Known delays, no CPU work: a 2-core machine under load does
not distort it (the steps run on a virtual clock, as engine.py's KneeEngine does).

``Scheduler`` is the engine's logic, pure and synchronous (the unit tests hold it against its
closed form); ``LLMEngine`` drives it in real time on the event loop and exports its state.

One engine step (vLLM V1's scheduler, simplified to one sequence per request):

1. The running sequences each need room for one more token in the KV cache.  While the cache
   cannot hold them, the sequence admitted last is **preempted**: its KV is freed, it goes back to
   the front of the waiting queue and, when admitted again, recomputes its prompt and the tokens it
   had produced (vLLM's recompute preemption; ``num_preemptions`` counts each).
2. If nothing was preempted in this step, waiting sequences are admitted in FIFO order while the
   batch holds fewer than ``max_batch`` and the cache has room for their tokens plus one.
3. The step lasts ``decode_s`` + ``decode_s_per_seq`` x (sequences in the batch) +
   ``prefill_s_per_token`` x (tokens prefilled in it) -- a decode step that grows with the batch, as
   a memory-bound GPU's does (the weights read once, each sequence's KV read on top); at its end every
   running sequence has produced one token (a newly admitted one its first: TTFT includes its
   prefill), and those that produced their last leave, freeing their KV.

Closed form, a cache that never fills: one request of P prompt tokens and n output tokens gets
its first token ``decode_s + P * prefill_s_per_token`` after it arrived at an idle engine and each
later one ``decode_s`` after the one before; B <= max_batch requests arriving together all get their
first token after ``decode_s + B * P * prefill_s_per_token``.  A batch of ``max_batch`` sequences
never preempts while ``max_batch * (P + n) <= K``.

Exported (vLLM V1's names, vllm/v1/metrics/loggers.py): ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (0..1), ``vllm:num_preemptions_total``,
and per finished request, on the model's clock, ``vllm:request_queue_time_seconds`` (arrival to
first scheduled), ``vllm:request_prefill_time_seconds`` (first scheduled to first token) and
``vllm:request_decode_time_seconds`` (first token to last); the prompt and generation token
counters are llm.py's.

Prefix cache (``--prefix-cache-blocks N`` > 0, :class:`PrefixCache`): vLLM's automatic prefix
caching, simplified.  A prompt (its words: the target counts a token per word) is cut into blocks
of ``BLOCK_TOKENS``; each full block is known by a hash chained over every block before it, so a
block is found only behind the same prefix.  A request's hit is its longest run of leading
blocks found in the cache, capped so that its last prompt token is computed (vLLM: at most
``num_tokens - 1`` tokens come from the cache), and the prefill computes only the tokens after
it.  Its blocks are then put in the cache at once (looked up and inserted when the request
arrives: a second request behind the same new prefix hits even while the first still prefills),
least recently used first out once the cache holds N blocks.  The cache is apart from
``--kv-tokens`` (a sequence's KV is counted whole).  Exported as vLLM V1's counters, in tokens:
``vllm:prefix_cache_queries_total`` (prompt tokens looked up) and ``vllm:prefix_cache_hits_total``
(tokens found); without the cache neither moves (vLLM records no stats when caching is off).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

BLOCK_TOKENS = 16  # tokens per prefix-cache block (vLLM's default block_size)


class PromptTooLong(ValueError):
    """The request could never fit the KV cache alone: 400 (vLLM: longer than max_model_len)."""


@dataclass(eq=False)
class Seq:
    """One request's sequence: its prompt, how many tokens it must produce, what it holds."""

    prompt: int
    n: int
    produced: int = 0
    cached: int = 0  # tokens held in the KV cache (0 while waiting)
    hit: int = 0  # leading prompt tokens found in the prefix cache (not prefilled)
    preempted: int = 0  # times it was preempted
    out: Any = field(default=None, repr=False)  # the driver's per-token queue
    # the driver's clock (event-loop seconds): arrived, first scheduled, first token
    t_arrived: float | None = None
    t_scheduled: float | None = None
    t_first: float | None = None

    @property
    def done(self) -> bool:
        return self.produced >= self.n


@dataclass
class StepResult:
    duration_s: float
    produced: list[Seq]  # sequences that produced one token in this step
    prefilled: int  # tokens (re)computed by prefill in this step
    preempted: int  # sequences preempted in this step


class Scheduler:
    """Continuous batching over a KV cache of ``kv_tokens`` tokens (see the module docstring)."""

    def __init__(self, kv_tokens: int, max_batch: int, prefill_s_per_token: float, decode_s: float,
                 decode_s_per_seq: float = 0.0) -> None:
        if kv_tokens < 2 or max_batch < 1:
            raise ValueError("kv_tokens must be >= 2 and max_batch >= 1")
        self.kv_tokens = kv_tokens
        self.max_batch = max_batch
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s = decode_s
        self.decode_s_per_seq = decode_s_per_seq
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.used = 0  # KV tokens held
        self.preemptions = 0

    def check(self, prompt: int, n: int) -> None:
        """PromptTooLong when prompt + n tokens exceed the whole cache (it could never finish)."""
        if prompt + n > self.kv_tokens:
            raise PromptTooLong(f"prompt ({prompt}) + max_tokens ({n}) tokens exceed the KV cache "
                                f"({self.kv_tokens} tokens, --kv-tokens)")

    def add(self, seq: Seq) -> None:
        self.check(seq.prompt, seq.n)
        self.waiting.append(seq)

    def abort(self, seq: Seq) -> None:
        """Drop a sequence (its client left), freeing what it holds."""
        if seq in self.running:
            self.running.remove(seq)
            self.used -= seq.cached
            seq.cached = 0
        elif seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def usage(self) -> float:
        """KV-cache usage, 0..1 (vllm:kv_cache_usage_perc)."""
        return self.used / self.kv_tokens

    def _preempt(self) -> int:
        count = 0
        while self.running and self.used + len(self.running) > self.kv_tokens and len(self.running) > 1:
            victim = self.running.pop()
            self.used -= victim.cached
            victim.cached = 0
            victim.preempted += 1
            self.waiting.appendleft(victim)
            count += 1
        self.preemptions += count
        return count

    def _admit(self) -> int:
        prefilled = 0
        while self.waiting and len(self.running) < self.max_batch:
            s = self.waiting[0]
            need = s.prompt + s.produced  # a preempted sequence recomputes what it had
            if self.used + need + 1 + len(self.running) > self.kv_tokens:
                break
            self.waiting.popleft()
            self.running.append(s)
            s.cached = need
            self.used += need
            prefilled += need - s.hit
        return prefilled

    def schedule(self) -> StepResult:
        """Preempt, admit and time one step; its tokens come with :meth:`complete` at its end.
        Between the two the state is the batch as it runs (what the metrics show)."""
        preempted = self._preempt()
        prefilled = 0 if preempted else self._admit()
        batch = list(self.running)
        duration = (self.decode_s + self.decode_s_per_seq * len(batch) + prefilled * self.prefill_s_per_token
                    if batch else 0.0)
        return StepResult(duration, batch, prefilled, preempted)

    def complete(self, r: StepResult) -> None:
        """The step's end: each sequence of its batch produced one token; the finished ones leave."""
        for s in r.produced:
            if s not in self.running:  # aborted while the step ran
                continue
            s.produced += 1
            s.cached += 1
            self.used += 1
            if s.done:
                self.running.remove(s)
                self.used -= s.cached
                s.cached = 0

    def step(self) -> StepResult:
        """One whole engine step: its duration and what it produced (nothing when idle)."""
        r = self.schedule()
        self.complete(r)
        return r


class PrefixCache:
    """Blocks of ``block_tokens`` words known by their chained hash, ``blocks`` at most (LRU)."""

    def __init__(self, blocks: int, block_tokens: int = BLOCK_TOKENS) -> None:
        self.blocks = blocks
        self.block_tokens = block_tokens
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, found in the cache

    def _hashes(self, words: list[str]) -> list[bytes]:
        out, prev, b = [], b"", self.block_tokens
        for i in range(len(words) // b):
            prev = hashlib.blake2b(prev + "\x00".join(words[i * b:(i + 1) * b]).encode(), digest_size=16).digest()
            out.append(prev)
        return out

    def lookup(self, words: list[str]) -> int:
        """Tokens of ``words`` found (leading full blocks, at most len - 1); the blocks are cached now."""
        hashes = self._hashes(words)
        found = 0
        for h in hashes:
            if h not in self._lru:
                break
            found += 1
        hit = min(found * self.block_tokens, max(0, (len(words) - 1) // self.block_tokens * self.block_tokens))
        for h in hashes:
            self._lru[h] = None
            self._lru.move_to_end(h)
        while len(self._lru) > self.blocks:
            self._lru.popitem(last=False)
        self.queries += len(words)
        self.hits += hit
        return hit


class LLMEngine:
    """Runs the Scheduler in real time: steps end on a virtual clock, tokens are released at their end."""

    def __init__(self, metrics: Any, kv_tokens: int, max_batch: int, prefill_ms_per_token: float,
                 decode_ms: float, decode_ms_per_seq: float = 0.0, prefix_cache_blocks: int = 0) -> None:
        self.sched = Scheduler(kv_tokens, max_batch, prefill_ms_per_token / 1000.0, decode_ms / 1000.0,
                               decode_ms_per_seq / 1000.0)
        self.prefix_cache = PrefixCache(prefix_cache_blocks) if prefix_cache_blocks > 0 else None
        self.metrics = metrics
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._export()

    def check(self, prompt: int, n: int) -> None:
        self.sched.check(prompt, n)

    def submit(self, prompt: int, n: int, words: list[str] | None = None) -> Seq:
        """Queue a sequence (``words``: its prompt, for the prefix cache); its ``out`` queue gets one
        item per token produced."""
        seq = Seq(prompt=prompt, n=n, out=asyncio.Queue(), t_arrived=asyncio.get_running_loop().time())
        if self.prefix_cache is not None and words is not None:
            seq.hit = self.prefix_cache.lookup(words)
            self.metrics.prefix_queries.inc(len(words))
            self.metrics.prefix_hits.inc(seq.hit)
        self.sched.add(seq)
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        assert self._wake is not None
        self._wake.set()
        self._export()
        return seq

    def abort(self, seq: Seq) -> None:
        if not seq.done:
            self.sched.abort(seq)
            self._export()

    def _export(self) -> None:
        m, s = self.metrics, self.sched
        m.llm_running.set(len(s.running))
        m.llm_waiting.set(len(s.waiting))
        m.kv_usage.set(s.usage)

    def _timed(self, s: Seq, t: float) -> None:
        """Record a sequence's phases once it produced its first token (t) and when it is done."""
        if s.t_first is None and s.produced >= 1:
            s.t_first = t
        arrived, scheduled, first = s.t_arrived, s.t_scheduled, s.t_first
        if s.done and arrived is not None and scheduled is not None and first is not None:
            m = self.metrics
            m.queue_time.observe(max(0.0, scheduled - arrived))
            m.prefill_time.observe(first - scheduled)
            m.decode_time.observe(t - first)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        t = loop.time()  # the virtual clock: when the current step started
        while True:
            if not self.sched.busy:
                self._wake.clear()
                await self._wake.wait()
                t = loop.time()
            before = self.sched.preemptions
            r = self.sched.schedule()
            self.metrics.preemptions.inc(self.sched.preemptions - before)
            self._export()  # the batch as it runs this step, its KV before the step's new tokens
            for s in r.produced:
                if s.t_scheduled is None:
                    s.t_scheduled = t
            if not r.produced:  # nothing runnable (cannot happen while busy: the first always fits)
                await asyncio.sleep(0)
                t = loop.time()
                continue
            t += r.duration_s
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.sched.complete(r)
            for s in r.produced:
                self._timed(s, t)
                if s.out is not None:
                    s.out.put_nowait(None)
            self._export()
