"""RowBuffer keeps what most requests lack (failures, token counts, streamed answers) sparse and
spreads it into full columns when the rows are taken: every row must come out exactly as the
request event described it, whatever the mix and order of requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kneeswarm.locustfiles.recorder import WIRE_COLUMNS, RowBuffer, categorize



class Resp:
    def __init__(self, status: int):
        self.status_code = status


event = st.fixed_dictionaries({
    "status": st.sampled_from([0, 200, 200, 429, 503]),
    "failed": st.booleans(),
    "tokens": st.none() | st.tuples(st.none() | st.integers(0, 9), st.none() | st.integers(0, 9),
                                    st.none() | st.floats(0, 100)),
    "stream": st.none() | st.tuples(st.lists(st.floats(0, 50), max_size=4), st.booleans(),
                                    st.none() | st.integers(0, 9), st.integers(0, 9),
                                    st.none() | st.integers(0, 9), st.none() | st.integers(0, 9)),
    "latency": st.floats(0, 1000),
    "tags": st.none() | st.tuples(st.none() | st.integers(0, 7), st.none() | st.integers(1, 9),
                                  st.none() | st.sampled_from(["cheap", "slow"])),  # (prefix, turn, class)
    "resent": st.sampled_from([None, None, 1, 2]),  # users.py: sent again after a clean close
})


def expected_row(i: int, e: dict) -> dict:
    """The row written out by hand from the event, column by column (no RowBuffer code)."""
    exc = ConnectionResetError("reset") if e["failed"] else None
    tin, tout, ttft = e["tokens"] or (None, None, None)
    itl, counted, usage, chunks, tokenizer, pinned = e["stream"] or (None,) * 6
    return {"t_start": 100.0 + i, "latency_ms": e["latency"], "bytes": i, "ok": exc is None, "status": e["status"],
            "error": None if exc is None else categorize(e["status"], exc), "name": f"n{i % 3}",
            "tokens_in": tin, "tokens_out": tout, "ttft_ms": ttft,
            "itl_ms": itl, "tokens_counted": counted, "usage_out": usage, "chunks_out": chunks,
            "tokens_tokenizer": tokenizer, "tokens_pinned": pinned,
            "prefix": (e["tags"] or (None, None))[0], "turn": (e["tags"] or (None, None))[1],
            "resent": e["resent"], "class": (e["tags"] or (None, None, None))[2]}


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=40), st.integers(0, 40))
def test_every_row_comes_out_as_its_event_said(events, cut):
    buf = RowBuffer()
    taken: list[dict] = []
    for i, e in enumerate(events):
        if i == cut:  # a report in the middle: the next rows start a fresh buffer
            cols = buf.take()
            taken += [{c: cols[c][k] for c in WIRE_COLUMNS} for k in range(len(cols["t_start"]))]
        context = {}
        if e["tokens"]:
            context["kneeswarm"] = e["tokens"]
        if e["stream"]:
            context["kneeswarm_stream"] = e["stream"]
        if e["tags"]:
            context["kneeswarm_tags"] = e["tags"]
        if e["resent"]:
            context["kneeswarm_resent"] = e["resent"]
        buf.on_request("POST", f"n{i % 3}", e["latency"], i, Resp(e["status"]) if e["status"] else None,
                       context, ConnectionResetError("reset") if e["failed"] else None, start_time=100.0 + i)
    cols = buf.take()
    assert set(cols) == set(WIRE_COLUMNS) and len({len(v) for v in cols.values()}) <= 1
    taken += [{c: cols[c][k] for c in WIRE_COLUMNS} for k in range(len(cols["t_start"]))]
    assert taken == [expected_row(i, e) for i, e in enumerate(events)]
    assert buf.take() == {c: [] for c in WIRE_COLUMNS}
