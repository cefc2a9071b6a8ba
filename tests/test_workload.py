"""Workloads: the JSONL dataset loader and the length generator (hypothesis), and a real run
whose prompts the demo target counts."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.protocols.workload import LengthDist, WorkloadError, load_dataset, words

T = TypeVar("T")


def write_jsonl(tmp_path, lines: list[str], name: str = "p.jsonl") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_dataset_prompts_and_chats_become_requests_in_turn(tmp_path):
    path = write_jsonl(tmp_path, ['{"prompt": "one two three", "max_tokens": 7}', "",
                                  '{"messages": [{"role": "system", "content": "be brief"}, '
                                  '{"role": "user", "content": "a b c d"}]}'])
    p = for_plan(plan_from_dict({"protocol": "openai", "request": {"dataset": path}}), seed=0)
    bodies = [json.loads(p.next_request().body) for _ in range(4)]
    lengths = [p.next_request().tokens_in for _ in range(2)]
    assert sorted(lengths) == [3, 6]  # "be brief" + "a b c d"
    by_kind = {b["messages"][-1]["content"]: b for b in bodies}
    assert by_kind["one two three"]["max_tokens"] == 7
    assert by_kind["a b c d"]["messages"][0] == {"role": "system", "content": "be brief"}
    assert by_kind["a b c d"]["max_tokens"] == 64  # the plan's default where the record has none


@pytest.mark.parametrize("line, message", [
    ("{nope", "not JSON"), ("[1]", "must be a JSON object"), ('{"text": "x"}', 'needs "prompt"'),
    ('{"prompt": "x", "max_tokens": 0}', "max_tokens must be a positive integer"),
    ('{"messages": [{"role": "user"}]}', 'needs "prompt"'),
])
def test_a_bad_dataset_line_is_one_line_naming_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path, ['{"prompt": "ok"}', line], name=f"bad{abs(hash(line))}.jsonl")
    with pytest.raises(WorkloadError) as e:
        load_dataset(path)
    assert f"{path}:2" in str(e.value) and message in str(e.value) and "\n" not in str(e.value)


def test_dataset_and_lengths_tables_are_checked(tmp_path):
    with pytest.raises(PlanError, match="not both"):
        plan_from_dict({"request": {"dataset": "x.jsonl", "lengths": {"input": {"mean": 3}}}})
    with pytest.raises(PlanError, match="input and/or an output"):
        plan_from_dict({"request": {"lengths": {"inputs": {"mean": 3}}}})
    with pytest.raises(WorkloadError, match="dist must be one of"):
        LengthDist.from_table({"dist": "zipf"}, "request.lengths.input")
    with pytest.raises(WorkloadError, match="cannot read"):
        load_dataset(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize("dist", ["uniform", "normal", "lognormal"])
def test_length_distributions_have_the_planned_mean_and_stdev(dist):
    d = LengthDist.from_table({"dist": dist, "mean": 200, "stdev": 40, "min": 1, "max": 10_000}, "t")
    rng = random.Random(1)
    x = np.array([d.sample(rng) for _ in range(20_000)], dtype=float)
    assert x.mean() == pytest.approx(200, rel=0.02) and x.std() == pytest.approx(40, rel=0.05)


@settings(max_examples=300, deadline=None)
@example(dist="lognormal", mean=1e-300, stdev=1e300, lo=1, hi=10, seed=0)
@example(dist="normal", mean=1e300, stdev=1e300, lo=1, hi=10, seed=0)
@example(dist="lognormal", mean=1.1041820044770857e-215, stdev=1.0, lo=1, hi=1, seed=0)
@given(dist=st.sampled_from(["fixed", "uniform", "normal", "lognormal"]),
       mean=st.one_of(st.floats(min_value=-10, max_value=1e6), st.floats(allow_nan=True)),
       stdev=st.one_of(st.floats(min_value=-10, max_value=1e6), st.floats(allow_nan=True)),
       lo=st.integers(min_value=-5, max_value=1000), hi=st.integers(min_value=-5, max_value=100_000),
       seed=st.integers(0, 1000))
def test_the_length_generator_survives_any_table(dist, mean, stdev, lo, hi, seed):
    try:
        d = LengthDist.from_table({"dist": dist, "mean": mean, "stdev": stdev, "min": lo, "max": hi}, "t")
    except WorkloadError as e:
        assert "\n" not in str(e)
        return
    assert math.isfinite(d.mean) and d.mean > 0 and 1 <= d.min <= d.max
    rng = random.Random(seed)
    for _ in range(20):
        n = d.sample(rng)
        assert isinstance(n, int) and d.min <= n <= d.max


def loaded_or_refused(load: Callable[[str], list[T]], path: Path, lines: list[str]) -> list[T] | None:
    """``load`` on a file of these lines: its records, or None when it refused the file as bad input
    must be refused (a WorkloadError of one line that names the file)."""
    path.write_text("\n".join(lines), encoding="utf-8")
    try:
        return load(str(path))
    except WorkloadError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from([
    '{"prompt": "a b"}', '{"messages": [{"role": "user", "content": "x y z"}], "max_tokens": 3}',
    '{"prompt": 1}', '{"max_tokens": true, "prompt": ""}', "null", "{}"])), max_size=12))
def test_the_dataset_loader_survives_any_file(tmp_path_factory, lines):
    records = loaded_or_refused(load_dataset, tmp_path_factory.mktemp("ds") / "d.jsonl", lines)
    if records is None:
        return
    assert records and all(words(r) >= 0 for r in records)
    assert all(("prompt" in r) != ("messages" in r) for r in records)


@pytest.mark.long
@pytest.mark.slow
def test_dataset_prompts_reach_the_target_with_their_lengths(tmp_path):
    """The target's own prompt-token counter equals the sum of the rows' tokens_in."""
    import requests

    from kneeswarm.collectors.prometheus import parse_exposition
    from kneeswarm.launch.cli import start_target, stop_target
    from kneeswarm.contracts.rundir import RunDir
    from test_streaming import TINY_MODEL, run_probe

    path = write_jsonl(tmp_path, [json.dumps({"prompt": " ".join(["w"] * n), "max_tokens": 2}) for n in (3, 10, 40)])
    proc, url = start_target([*TINY_MODEL, "--itl-ms", "1"])
    try:
        run_dir, _, _ = run_probe(tmp_path, url, f'[request]\ndataset = "{path}"\n', 2, hold=2.0)
        m = parse_exposition(requests.get(url + "/metrics", timeout=5).text)
    finally:
        stop_target(proc)
    rows = RunDir(run_dir).read_requests()
    assert len(rows) >= 10 and rows["ok"].all()
    assert set(rows["tokens_in"]) == {3, 10, 40} and set(rows["tokens_out"]) == {2}
    served = m["vllm:prompt_tokens_total"]
    # Requests still in flight at the stop (<= 2 users) were counted by the target, not recorded.
    assert 0 <= served - rows["tokens_in"].sum() <= 2 * 40
