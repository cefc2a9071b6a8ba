"""LoRA adapters behind the demo target's OpenAI endpoints (``--adapters a,b,c,d --max-loras 2 --swap-ms 30``).

The ground truth of an adapter set larger than a server keeps loaded.  A request names its adapter
as vLLM, SGLang and TGI take it: the OpenAI ``model`` field is the adapter's name (the base model's
name asks for no adapter).  The server has ``--max-loras`` K adapter slots, as vLLM's
``--max-loras``: the adapters that may have requests running at once.  Modelled on vLLM V1's
scheduler (vllm/v1/core/sched/scheduler.py: a waiting request whose adapter would make the batch's
adapters more than ``max_loras`` is skipped, the requests behind it of adapters already running go
on) and its worker's adapter manager (an LRU of the loaded adapters; loading one is done in the
engine step, before the batch runs):

* a request whose adapter has requests running (or loading) joins them at once;
* otherwise, while fewer than K adapters are in use, it takes a slot: an adapter still loaded from
  before (the K most recently used are kept) runs at once; one that is not is **swapped in**,
  evicting the least recently used adapter that nothing holds, which takes ``--swap-ms``; swaps
  are done one at a time and **stall every running generation** for their length (the whole
  engine step waits for the load, as vLLM's does), so an adapter's swap makes every adapter
  slower;
* otherwise it **waits** (first come, first served among the waiters) until an adapter's last
  request ends and frees a slot.

Slot times are kept on a virtual clock (``asyncio``'s loop time): a swap that queued behind
another starts exactly when that one ended.  Not modelled: vLLM's ``--max-cpu-loras`` (a second,
CPU-memory LRU, whose misses load from disk); the engine model (``--kv-tokens``) does not take
adapters.

Exported (metrics.py): vLLM's ``vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}`` (vllm/v1/metrics/loggers.py: a gauge whose value is the time, epoch
seconds, its label set was last current -- ``set_to_current_time`` on every change; label sets
of earlier states stay in the exposition with their older times; names comma-separated, sorted
here); the target's own ground truth ``kneeswarm_target_lora_requests_total{adapter}`` (served),
``kneeswarm_target_lora_swaps_total{adapter}`` (loads into a slot, the first loads included) and
``kneeswarm_target_lora_wait_seconds_total{adapter}`` (arrival to the adapter ready, swap
included).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEFAULT_SWAP_MS = 20.0


def parse_adapters(text: str) -> tuple[str, ...]:
    """``a,b,c`` -> ('a', 'b', 'c'); ValueError (one line) on a bad or repeated name."""
    names = tuple(n.strip() for n in text.split(","))
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not an adapter name (letters, digits, '_', '.', '-')")
    if len(set(names)) != len(names):
        raise ValueError(f"an adapter is named twice in {text!r}")
    return names


def _adapters_arg(text: str) -> tuple[str, ...]:
    try:
        return parse_adapters(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below the minimum 1")
    return value


def _ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be zero or a positive number")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command line's LoRA options (server.py's parser)."""
    g = p.add_argument_group("LoRA adapters behind the OpenAI endpoints (kneeswarm.target.lora; the "
                             "--ttft-ms/--itl-ms schedule, not --kv-tokens)")
    g.add_argument("--adapters", type=_adapters_arg, default=(), metavar="NAME,...",
                   help="adapters served beside the base model, each asked for by its name in 'model' (vLLM's way)")
    g.add_argument("--max-loras", type=_count, default=1, metavar="K",
                   help="adapters that may have requests running at once, the K most recently used kept loaded "
                        "(vLLM --max-loras)")
    g.add_argument("--swap-ms", type=_ms, default=DEFAULT_SWAP_MS, metavar="MS",
                   help="loading an adapter that is not loaded: this long, one at a time, every running "
                        "generation stalled meanwhile")


class Adapters:
    """The adapter slots of one server (see the module docstring)."""

    def __init__(self, metrics: Any, names: tuple[str, ...], max_loras: int, swap_ms: float) -> None:
        self.names = frozenset(names)
        self.max_loras = max_loras
        self.swap_s = swap_ms / 1000.0
        self.metrics = metrics
        self.loaded: OrderedDict[str, None] = OrderedDict()  # the adapters in slots, least recently used first
        self.holders: dict[str, int] = {}  # adapter -> requests admitted to it (loading or running)
        self.ready_at: dict[str, float] = {}  # adapter -> loop time its last swap ends
        self.waiting: list[tuple[str, asyncio.Future[float]]] = []
        self.busy_until = float("-inf")  # the last swap's end (swaps one at a time)
        self.stalled_s = 0.0  # swap time so far: every running generation is held this long
        self.swaps = 0
        metrics.enable_lora(sorted(names), max_loras)
        self._export()

    def _can_run(self, name: str) -> bool:
        return name in self.holders or len(self.holders) < self.max_loras

    def _admit(self, name: str, now: float) -> float:
        """Admit one request of ``name`` (it can run); the loop time its adapter is ready."""
        self.holders[name] = self.holders.get(name, 0) + 1
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return max(now, self.ready_at.get(name, now))
        if len(self.loaded) >= self.max_loras:  # evict the least recently used that nothing holds
            victim = next(n for n in self.loaded if n not in self.holders)
            del self.loaded[victim]
        self.loaded[name] = None
        start = max(now, self.busy_until)
        self.busy_until = self.ready_at[name] = start + self.swap_s
        self.stalled_s += self.swap_s
        self.swaps += 1
        self.metrics.lora_swaps.labels(adapter=name).inc()
        return self.ready_at[name]

    async def acquire(self, name: str) -> float:
        """Hold adapter ``name`` for one request; returns the loop time it may run from (its wait and
        swap behind it).  Release with :meth:`release`, also when the request ends early."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._can_run(name):
            ready = self._admit(name, now)
        else:
            fut: asyncio.Future[float] = loop.create_future()
            self.waiting.append((name, fut))
            self.metrics.llm_waiting.inc()
            self._export()
            try:
                ready = await fut
            except asyncio.CancelledError:  # the client left: an admission handed to it is given back
                if fut.done() and not fut.cancelled():
                    self.release(name)
                raise
            finally:
                self.metrics.llm_waiting.dec()
        self.metrics.lora_wait.labels(adapter=name).inc(max(0.0, ready - now))
        self._export()
        return ready

    def release(self, name: str) -> None:
        """One request of ``name`` ended; its adapter's last frees a slot for the waiters, in order."""
        left = self.holders.get(name, 0) - 1
        if left > 0:
            self.holders[name] = left
        else:
            self.holders.pop(name, None)
            now = asyncio.get_running_loop().time()
            still = []
            for n, fut in self.waiting:
                if fut.done():
                    continue
                if self._can_run(n):
                    fut.set_result(self._admit(n, now))
                else:
                    still.append((n, fut))
            self.waiting = still
        self._export()

    def _export(self) -> None:
        """vLLM's gauge: the label set of this state, its value the time now (set_to_current_time)."""
        waiting = sorted({n for n, fut in self.waiting if not fut.done()})
        self.metrics.lora_info.labels(max_lora=str(self.max_loras), running_lora_adapters=",".join(sorted(self.holders)),
                                      waiting_lora_adapters=",".join(waiting)).set_to_current_time()
