"""Mooncake trace replay (real traffic): ``[request] trace`` -- prompts synthesised so that requests sharing
a hash id share those tokens, arrivals from the trace's timestamps; the loader under hypothesis; bad
traces through the real console script; a real run against the demo target's prefix cache.

Independent truth for the run: the hit rate the trace implies, worked out here from its hash ids
alone (a block is found when the same run of ids led up to it before; whole 16-token blocks only,
the prompt's last token always computed, as the target's cache and vLLM's do), against the target's
own counters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import read_summary, run_cli
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.protocols.workload import WorkloadError, load_trace

BLOCK = 16  # the trace's block size here = the target's prefix-cache block
TRACE = [  # (timestamp ms, input_length, output_length, hash_ids)
    (0, 50, 2, [1, 2, 3]),
    (100, 50, 2, [1, 2, 4]),  # shares blocks 1, 2 with the first
    (150, 40, 2, [1, 5]),
    (400, 32, 2, [6, 7]),  # a whole-block prompt: its last block is computed again next time
    (420, 20, 2, []),  # no hash ids: its own tokens
    (800, 64, 2, [1, 2, 3, 8]),
]


def trace_lines(rows=TRACE) -> str:
    return "".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids}) + "\n"
                   for t, n, o, ids in rows)


def implied_hits(n_requests: int) -> tuple[int, int]:
    """(tokens found, tokens looked up) over the first ``n_requests`` requests, the trace sent round and round."""
    seen: set[tuple[int, ...]] = set()
    hits = queries = 0
    for i in range(n_requests):
        _, n, _, ids = TRACE[i % len(TRACE)]
        full = [j for j in range(len(ids)) if (j + 1) * BLOCK <= n]  # whole blocks only are cached
        found = 0
        for j in full:
            if tuple(ids[:j + 1]) not in seen:
                break
            found += 1
        hits += min(found * BLOCK, (n - 1) // BLOCK * BLOCK)
        queries += n
        seen |= {tuple(ids[:j + 1]) for j in full}
    return hits, queries


def traced(tmp_path: Path, **request) -> object:
    path = tmp_path / "trace.jsonl"
    path.write_text(trace_lines())
    return for_plan(plan_from_dict({"protocol": "openai", "request": {
        "trace": str(path), "trace_block_tokens": BLOCK, **request}}), seed=0)


def test_requests_sharing_hash_ids_share_those_tokens(tmp_path):
    p = traced(tmp_path)
    prompts = []
    for t, n, o, ids in TRACE:
        r = p.next_request()
        body = json.loads(r.body)
        words = body["messages"][0]["content"].split()
        assert len(words) == n == r.tokens_in and body["max_tokens"] == o
        prompts.append(words)
    assert prompts[0][:32] == prompts[1][:32] and prompts[0][32:48] != prompts[1][32:48]
    assert prompts[0][:16] == prompts[2][:16] and prompts[0][16:32] != prompts[2][16:32]
    assert prompts[5][:48] == prompts[0][:48]
    assert prompts[3][:16] != prompts[0][:16]
    replay = p.replay  # arrivals: the trace's timestamps, in seconds
    assert replay.timed and replay.recorded_rate == pytest.approx((len(TRACE) - 1) / 0.8)


@pytest.mark.parametrize("line, message", [
    ({"timestamp": 5, "input_length": 10, "output_length": 1}, "missing 'hash_ids'"),
    ({"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}, "times go back"),
    ({"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [1, "2"]}, "hash_ids must be a list of integers"),
    ({"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}, "hash_ids must be a list of integers"),
    ({"timestamp": 9, "input_length": 0, "output_length": 1, "hash_ids": []}, "input_length and output_length"),
    ({"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, 3]}, "more blocks than input_length"),
])
def test_a_bad_trace_stops_kneeswarm_run_with_one_line_naming_the_line_and_exit_2(tmp_path, line, message):
    """The real console script, before any load: one line on stderr, exit 2, no run directory."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [7]}) + "\n"
                     + json.dumps(line) + "\n")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'target = "http://127.0.0.1:9"\nprotocol = "openai"\n[request]\ntrace = "{trace}"\n'
                    "trace_block_tokens = 8\n")
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and f"{trace}:2" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "runs").exists()


values = st.none() | st.booleans() | st.integers(-3, 3000) | st.floats(allow_nan=True) | st.text(max_size=3)
trace_line = st.one_of(
    st.text(max_size=20),
    st.fixed_dictionaries({}, optional={"timestamp": values, "input_length": values, "output_length": values,
                                        "hash_ids": st.none() | st.lists(values, max_size=4)}).map(json.dumps),
    st.fixed_dictionaries({"timestamp": st.integers(0, 10_000), "input_length": st.integers(1, 5000),
                           "output_length": st.integers(1, 50),
                           "hash_ids": st.lists(st.integers(-2**40, 2**40), max_size=12)}).map(json.dumps),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(trace_line, max_size=6), st.integers(1, 600))
def test_the_trace_loader_survives_any_input(tmp_path_factory, lines, block):
    path = tmp_path_factory.mktemp("t") / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    try:
        records = load_trace(str(path), block)
    except WorkloadError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    assert records and [r.t for r in records] == sorted(r.t for r in records)
    for r in records:
        assert r.input_length >= 1 and r.output_length >= 1 and len(r.hash_ids) * block < r.input_length + block
        assert all(isinstance(h, int) for h in r.hash_ids)


def trace_run(tmp_path: Path, start_demo_target, blocks: int) -> tuple[dict, int, dict]:
    """One user replaying TRACE against an engine-model target with ``blocks`` prefix-cache blocks:
    (summary, requests the target received, its /metrics)."""
    log = tmp_path / "received.jsonl"
    target = start_demo_target("--mode", "knee", "--kv-tokens", "100000", "--decode-ms", "5",
                               "--prefix-cache-blocks", str(blocks), "--request-log", str(log))
    trace = tmp_path / "trace.jsonl"
    trace.write_text(trace_lines())
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "trace"\ntarget = "{target.url}"\nprotocol = "openai"\nmetrics_url = "{target.url}/metrics"\n'
                    "[load]\nsteps = [1]\nramp = 0.2\nhold = 3.0\nsettle = 0.3\nworkers = 1\n"
                    f'[request]\ntrace = "{trace}"\ntrace_block_tokens = {BLOCK}\nignore_eos = true\n'
                    "[analysis]\nmin_requests = 5\n")
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    sent = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return read_summary(run_dir), sum(d["path"] == "/v1/chat/completions" for d in sent), target.metrics()


@pytest.mark.slow
def test_a_trace_run_hits_the_prefix_cache_as_its_hash_ids_imply(tmp_path, start_demo_target):
    summary, n, m = trace_run(tmp_path, start_demo_target, 1000)
    hits, queries = implied_hits(n)
    print(n, hits, queries, m["vllm:prefix_cache_hits_total"], m["vllm:prefix_cache_queries_total"])
    assert n >= 2 * len(TRACE)  # the trace went round at least twice (one user, closed loop: in order)
    assert (m["vllm:prefix_cache_hits_total"], m["vllm:prefix_cache_queries_total"]) == (hits, queries)
    (step,) = summary["steps"]
    assert step["server"]["target"]["target"]["prefix_hit_pct"] == pytest.approx(100 * hits / queries, abs=5.0)
    # the report's expectation: one pass of the trace, in file order (37.5 %); the cache meets it
    one_hits, one_queries = implied_hits(len(TRACE))
    assert summary["llm_workload"]["trace"]["expected_hit_pct"] == pytest.approx(100 * one_hits / one_queries, abs=0.01)
    assert "prefix_cache_cold" not in {f["id"] for f in summary["findings"]}


@pytest.mark.slow
def test_a_trace_run_on_a_one_block_cache_is_prefix_cache_cold(tmp_path, start_demo_target):
    summary, n, m = trace_run(tmp_path, start_demo_target, 1)
    truth = 100 * m["vllm:prefix_cache_hits_total"] / m["vllm:prefix_cache_queries_total"]
    found = {f["id"]: f for f in summary["findings"]}
    assert "prefix_cache_cold" in found, sorted(found)
    ev = found["prefix_cache_cold"]["evidence"]
    assert ev["hit_pct_mean"] == pytest.approx(truth, abs=2.0) and truth < ev["expected_hit_pct"] / 2
