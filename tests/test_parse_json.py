"""parse_json (the answer checks' JSON parser) gives the standard library's verdict at orjson's
speed: for any text, the same document as json.loads (integers beyond 64 bits as floats), or a
ValueError where json.loads raises one, including what orjson alone would refuse (NaN, Infinity,
UTF-16)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneeswarm.locustfiles.protocols.base import parse_json

JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=12)


def same(a, b) -> bool:
    """Equal documents, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, float) and isinstance(b, int) and not isinstance(b, bool) and abs(b) >= 2**64:
        return a == float(b)  # orjson reads integers beyond 64 bits as floats
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(JSON, st.sampled_from(["utf-8", "utf-16"]), st.booleans())
def test_documents_come_out_as_json_loads_reads_them(doc, encoding, compact):
    body = json.dumps(doc, separators=(",", ":") if compact else None).encode(encoding)
    assert same(parse_json(body), json.loads(body))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_any_bytes_get_json_loads_verdict(body):
    try:
        expected = json.loads(body)
    except ValueError:
        with pytest.raises(ValueError):
            parse_json(body)
        return
    assert same(parse_json(body), expected)


def test_what_orjson_alone_refuses_is_still_read():
    assert math.isnan(parse_json(b'{"x": NaN}')["x"]) and parse_json(b"[Infinity]") == [math.inf]
    assert parse_json(b"[123456789012345678901234567890]") == [1.2345678901234568e29]  # as a float
    assert parse_json('{"k": "é"}'.encode("utf-16")) == {"k": "é"}
