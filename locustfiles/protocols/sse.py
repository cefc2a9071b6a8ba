"""Server-sent events, as OpenAI-compatible servers stream them, read line by line.

``SSEDecoder.line`` takes one line as it arrives (with or without its ``\\n``/``\\r\\n``)
and returns an event's data once the blank line that ends the event has arrived.  Only
``data:`` fields matter here; ``event:``, ``id:``, ``retry:`` and ``:`` comments (some
servers send them as keep-alives) are skipped.  Several ``data:`` lines in one event are
joined with ``\\n`` (the SSE specification).  A space after the colon is optional: vLLM, SGLang,
llama.cpp and OpenAI send ``data: {...}``; some proxies send ``data:{...}``.

``ChatStream`` judges one OpenAI streamed answer event by event and keeps its timing: the
arrival of the first chunk that carries text (TTFT; vLLM's and OpenAI's first chat chunk
often carries only ``role``), the gap before every later text chunk (ITL), the end marker
(``[DONE]``) and the ``finish_reason``, and the ``usage`` object (sent in one extra last chunk
only when the request asked ``stream_options: {"include_usage": true}``; vLLM, SGLang and
OpenAI honour it, llama.cpp sends usage on its last chunk anyway, some servers never do).
A chunk is not a token: servers that detokenize incrementally, SGLang's ``--stream-interval`` > 1
and speculative decoding put several tokens in one chunk.  Tokens out are the server's ``usage``
where it sent one; else the plan's tokenizer over the streamed text (``count``: then every chunk's
text is kept, and the fast paths below are skipped); else the text chunks, flagged as counted.
The tokenizer's count is kept beside usage (``tokens_tokenizer``) as an independent check of it.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from kneeswarm.locustfiles.protocols.base import BadPayload, StreamTruncated, parse_json

logger = logging.getLogger(__name__)

DONE = b"[DONE]"
EVENT_END = b"\n\n"  # a blank line ends an event
FAST_TAIL = b'"finish_reason":null}]}'  # how a compact mid-stream chunk ends
FAST_TAIL_LEN = len(FAST_TAIL)
# ... and how a compact last chunk ends (its finish_reason a plain word: "stop", "length", ...)
FINISH_TAIL = re.compile(rb'"finish_reason":"[a-z_]{1,32}"}]}\Z')
FINISH_TAIL_LEN = 60  # bytes of a chunk's end that FINISH_TAIL is matched against
QUOTE = ord('"')


class SSEDecoder:
    """Lines in, complete event data out."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: bytes | None = None

    def line(self, line: bytes) -> bytes | None:
        """Feed one line; return the data of the event this blank line completes, else None."""
        line = line.rstrip(b"\r\n")
        if not line:
            data, self._data = self._data, None
            return data
        if line[:5] == b"data:":
            value = line[6:] if line[5:6] == b" " else line[5:]
            self._data = value if self._data is None else self._data + b"\n" + value
        return None

    def end(self) -> bytes | None:
        """The stream closed: an event still pending (its blank line never came) is delivered."""
        data, self._data = self._data, None
        return data


class ChatStream:
    """One streamed OpenAI answer: feed events with their arrival time, then ``result``."""

    __slots__ = ("t0", "text_key", "first", "last", "itl_ms", "chunks", "done", "finished",
                 "usage_in", "usage_out", "events", "_mark", "count", "texts")

    def __init__(self, t0: float, chat: bool = True, count: Callable[[str], int] | None = None,
                 keep_text: bool = False):
        self.t0 = t0  # perf_counter() just before the request was sent
        self.text_key = "delta" if chat else "text"
        self.first: float | None = None  # arrival of the first text chunk
        self.last = 0.0
        self.itl_ms: list[float] = []
        self.chunks = 0  # chunks that carried text
        self.done = False  # [DONE] seen
        self.finished = False  # a finish_reason seen
        self.usage_in: int | None = None
        self.usage_out: int | None = None
        self.events = 0
        self._mark = b'"content":"' if chat else b'"text":"'
        self.count = count  # the plan's tokenizer (TokenCounter.count), or None
        # each text chunk, when counted (or kept: a conversation's next turn carries the answer)
        self.texts: list[str] | None = [] if count is not None or keep_text else None

    def event(self, data: bytes, now: float) -> None:
        """One event's data, arrived at ``now`` (perf_counter seconds); BadPayload if it is not a chunk."""
        self.events += 1
        if data == DONE:
            self.done = True
            return
        # The hot path: a compact mid-stream chunk whose last field is a null finish_reason (vLLM,
        # OpenAI and Ollama lay them out so) is judged by two byte operations, ~0.5 us where
        # json.loads costs ~5 us; any other chunk (the last one, usage, errors, other layouts) is
        # parsed in full below.  An escaped quote cannot fake the marker: in a JSON string it
        # reads \".  (One choice per request: kneeswarm never asks for n > 1.)
        # The same holds for the compact last chunk of a stream (a finish_reason word, no usage).
        last = data[-FAST_TAIL_LEN:] != FAST_TAIL
        if self.texts is None and (not last or FINISH_TAIL.search(data, max(0, len(data) - FINISH_TAIL_LEN))) \
                and b'"usage":{' not in data:
            i = data.find(self._mark)
            if i >= 0:
                if data[i + len(self._mark):i + len(self._mark) + 1] != b'"':
                    self._token(now)
                self.finished = self.finished or last
                return
        try:
            doc = parse_json(data)
        except (ValueError, UnicodeDecodeError):
            raise BadPayload(f"stream chunk {self.events} is not JSON: {data[:60]!r}") from None
        if not isinstance(doc, dict):
            raise BadPayload(f"stream chunk {self.events} is not a JSON object")
        if "error" in doc:  # vLLM and llama.cpp report a failure mid-stream this way
            raise BadPayload(f"stream chunk {self.events} is an error: {str(doc['error'])[:120]}")
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        choices = doc.get("choices")
        if not choices or not isinstance(choices, list):
            return  # the include_usage chunk has "choices": []
        choice = choices[0]
        if not isinstance(choice, dict):
            raise BadPayload(f"stream chunk {self.events}: choices[0] is not an object")
        text = choice.get(self.text_key)
        if isinstance(text, dict):  # chat: the delta object
            text = text.get("content")
        if isinstance(text, str) and text:
            if self.texts is not None:
                self.texts.append(text)
            self._token(now)
        if choice.get("finish_reason"):
            self.finished = True

    def block(self, block: bytes, now: float) -> None:
        """Complete events (each ended by a blank line, the last one's blank line cut off) that
        arrived together at ``now``: the same as feeding their lines one by one, but a compact
        mid-stream chunk costs a slice, a scan and a find (a fast stream's events mostly arrive
        several per read, and per-line calls were most of the generator's cost)."""
        if b"\r" in block or self.texts is not None:  # CRLF lines, or text kept: event by event
            decoder = SSEDecoder()
            for line in (block + b"\n\n").split(b"\n"):
                data = decoder.line(line)
                if data is not None:
                    self.event(data, now)
            return
        mark, skip, texts, fast = self._mark, len(self._mark), 0, 0
        events = block.split(b"\n\n")
        # One line per event (the usual case) is checked once for the whole block; otherwise each
        # event with a line break inside goes the slow way (its data lines are joined first).
        one_line = block.count(b"\n") == 2 * (len(events) - 1)
        # ... and so is whether every event is one "data: " line (then only the tail is checked per event)
        all_data = one_line and block.count(b"\n\ndata: ") == len(events) - 1 and block.startswith(b"data: ")
        for e in events:
            if e.endswith(FAST_TAIL) and (all_data or (e.startswith(b"data: ") and (one_line or b"\n" not in e))):
                i = e.find(mark)
                if i >= 0:
                    fast += 1
                    if e[i + skip] != QUOTE:  # i + skip < len(e): the tail follows the mark
                        texts += 1
                    continue
            if (one_line or b"\n" not in e) and e.startswith(b"data:"):  # one data line: its data
                self.events += fast
                fast = 0
                self.event(e[6:] if e[5:6] == b" " else e[5:], now)
                continue
            self.events += fast
            fast = 0
            decoder = SSEDecoder()  # anything else: exactly as line by line
            for line in e.split(b"\n"):
                decoder.line(line)
            data = decoder.line(b"")
            if data is not None:
                self.event(data, now)
        self.events += fast
        if texts:
            self._token(now)
            self.itl_ms.extend([0.0] * (texts - 1))  # arrived together: no gap between them
            self.chunks += texts - 1

    def _token(self, now: float) -> None:
        if self.first is None:
            self.first = now
        else:
            self.itl_ms.append((now - self.last) * 1000.0)
        self.last = now
        self.chunks += 1

    def _usage(self, usage: dict[str, Any]) -> None:
        pin, pout = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(pin, int) and not isinstance(pin, bool):
            self.usage_in = pin
        if isinstance(pout, int) and not isinstance(pout, bool):
            self.usage_out = pout

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.t0) * 1000.0

    @property
    def tokens_counted(self) -> bool:
        """True when tokens out were counted by the client (the server sent no usage)."""
        return self.usage_out is None

    @property
    def tokens_tokenizer(self) -> int | None:
        """The plan's tokenizer over the whole streamed text (None without a tokenizer)."""
        return None if self.count is None or self.texts is None else self.count("".join(self.texts))

    @property
    def tokens_out(self) -> int:
        if self.usage_out is not None:
            return self.usage_out
        counted = self.tokens_tokenizer
        return self.chunks if counted is None else counted

    def check_complete(self) -> None:
        """StreamTruncated unless the stream ended properly ([DONE] or a finish_reason)."""
        if not (self.done or self.finished):
            raise StreamTruncated(
                f"stream ended after {self.events} events ({self.chunks} with text) without [DONE] or finish_reason")


def parse_stream(body: bytes, chat: bool = True) -> ChatStream:
    """A whole SSE body judged at once (tests, preflight); times are event indices."""
    decoder, stream = SSEDecoder(), ChatStream(0.0, chat)
    for i, line in enumerate(body.split(b"\n")):
        data = decoder.line(line)
        if data is not None:
            stream.event(data, float(i))
    tail = decoder.end()
    if tail is not None:
        stream.event(tail, float(len(body)))
    return stream


class Arrivals:
    """Bytes of an SSE body as they arrive, handed to ``stream`` event by event or, where it
    can, a whole arrival's complete events at once (``ChatStream.block``: one timestamp each)."""

    __slots__ = ("stream", "decoder", "pending", "crlf")

    def __init__(self, stream: ChatStream):
        self.stream = stream
        self.decoder = SSEDecoder()
        self.pending = b""
        self.crlf = False

    def feed(self, chunk: bytes, now: float) -> None:
        data = self.pending + chunk
        self.crlf = self.crlf or b"\r" in data
        if self.crlf:  # CRLF lines (rare): line by line, the decoder strips the \r
            *lines, self.pending = data.split(b"\n")
            for line in lines:
                event = self.decoder.line(line)
                if event is not None:
                    self.stream.event(event, now)
            return
        end = data.rfind(EVENT_END)
        if end >= 0:
            self.stream.block(data[:end], now)
        self.pending = data[end + len(EVENT_END):] if end >= 0 else data

    def close(self, now: float) -> None:
        """The body ended: an event still pending (no blank line after it) is delivered."""
        for line in self.pending.split(b"\n") if self.pending else ():
            event = self.decoder.line(line)
            if event is not None:
                self.stream.event(event, now)
        self.pending = b""
        tail = self.decoder.end()
        if tail is not None:
            self.stream.event(tail, now)
