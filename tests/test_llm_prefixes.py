"""Shared prefixes (system prompts): ``[request.prefix]`` against the demo target's engine-model prefix cache
(``--prefix-cache-blocks``, kneeswarm/target/llmengine.py), and the ``prefix_cache_cold`` finding.

Independent truths: the target's own counters (``vllm:prefix_cache_hits_total`` /
``vllm:prefix_cache_queries_total`` after the run), the workload's arithmetic (8 prefixes of 64
tokens behind 16-token messages: 64 of a prefixed prompt's 80 tokens are cacheable; counted in
tokens, as the servers count, a share s hits s x 64 / (s x 80 + (1 - s) x 16): 78.3 % at 0.9, the
share times the cacheable fraction of the prompt tokens sent), and the request rows (which prefix
each one carried).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.target.llmengine import PrefixCache

from conftest import read_summary, runs_against_targets

PREFIX_TOKENS, MESSAGE_TOKENS, PREFIXES = 64, 16, 8


def hit_pct(share: float) -> float:
    """Prefix tokens over prompt tokens at ``share`` (the target's 16-token blocks divide 64)."""
    return 100.0 * share * PREFIX_TOKENS / (share * (PREFIX_TOKENS + MESSAGE_TOKENS) + (1 - share) * MESSAGE_TOKENS)

ENGINE = ["--kv-tokens", "100000", "--max-batch", "64", "--decode-ms", "5", "--prefill-ms-per-token", "0.02"]
PLANS = {  # name: (prefix-cache blocks, share)
    "shared": (1000, 0.9),
    "unshared": (1000, 0.0),
    "small": (2, 0.9),  # 2 blocks: a 4-block prefix evicts its own first blocks, nothing is ever found
}
ENGINE_FINDINGS = {"kv_cache_full", "preemption", "queue_growing", "prefill_bound", "decode_bound"}


# -- the target's cache, alone ------------------------------------------------------------------
def test_prefix_cache_finds_leading_blocks_behind_the_same_prefix_only():
    c = PrefixCache(blocks=100, block_tokens=4)
    a = [f"a{i}" for i in range(10)]
    assert c.lookup(a) == 0  # cold
    assert c.lookup(a) == 8  # 2 full blocks (the 3rd is partial: never cached)
    assert c.lookup(a[:8] + ["x", "y"]) == 8
    assert c.lookup(a[:8]) == 4  # a whole-block prompt: its last token is computed, so its last block too
    assert c.lookup(["z"] + a[1:]) == 0  # the same words behind another first block: not found
    assert (c.queries, c.hits) == (10 + 10 + 10 + 8 + 10, 8 + 8 + 4)


def test_prefix_cache_evicts_the_least_recently_used_block():
    c = PrefixCache(blocks=2, block_tokens=1)
    c.lookup(["a", "x"])  # caches a, then a.x
    c.lookup(["b", "x"])  # b, b.x: a and a.x are out
    assert c.lookup(["a", "y"]) == 0
    assert c.lookup(["a", "y"]) == 1


# -- real runs ----------------------------------------------------------------------------------
def plan_text(name: str, url: str, share: float) -> str:
    return (f'name = "{name}"\ntarget = "{url}"\nprotocol = "openai"\nmetrics_url = "{url}/metrics"\n'
            "[load]\nsteps = [2, 4]\nramp = 0.5\nhold = 4.0\nsettle = 0.5\nworkers = 1\n"
            f"[request]\nprompt_tokens = {MESSAGE_TOKENS}\nmax_tokens = 4\nignore_eos = true\nstream = true\n"
            f"[request.prefix]\ntokens = {PREFIX_TOKENS}\ncount = {PREFIXES}\nshare = {share}\n"
            "[analysis]\nmin_requests = 10\n")


@pytest.fixture(scope="module")
def prefix_runs(tmp_path_factory):
    """The three plans side by side, each against its own engine-model target: {name: (summary,
    RunDir, the target's /metrics after the run)}."""
    tmp = tmp_path_factory.mktemp("prefix")
    flags = {name: ["--mode", "knee", *ENGINE, "--prefix-cache-blocks", str(blocks)] for name, (blocks, _) in PLANS.items()}
    with runs_against_targets(tmp, flags, lambda name, url: plan_text(name, url, PLANS[name][1])) as runs:
        return {name: (read_summary(run_dir), RunDir(run_dir), t.metrics()) for name, (run_dir, t) in runs.items()}


def target_hit_pct(metrics: dict) -> float:
    return 100.0 * metrics["vllm:prefix_cache_hits_total"] / metrics["vllm:prefix_cache_queries_total"]


def step_hits(summary: dict) -> list[float]:
    return [s["server"]["target"]["target"]["prefix_hit_pct"] for s in summary["steps"]]


@pytest.mark.long
@pytest.mark.slow
def test_per_step_hit_rate_agrees_with_the_targets_hit_counter(prefix_runs):
    for name in ("shared", "unshared", "small"):
        summary, _, metrics = prefix_runs[name]
        truth = target_hit_pct(metrics)
        hits = step_hits(summary)
        print(name, round(truth, 2), hits, summary["llm_workload"]["prefix"])
        assert len(hits) == 2 and all(abs(h - truth) <= 2.0 for h in hits), (name, truth, hits)


@pytest.mark.long
@pytest.mark.slow
def test_hit_rate_is_the_share_times_the_cacheable_fraction(prefix_runs):
    summary, rd, metrics = prefix_runs["shared"]
    rows = rd.read_request_rows().frame
    prefixed = rows["prefix"].dropna()
    assert set(prefixed.astype(int)) == set(range(PREFIXES))  # rows record which prefix
    share = len(prefixed) / len(rows)
    assert abs(share - 0.9) < 0.05
    truth = target_hit_pct(metrics)
    assert abs(truth - hit_pct(0.9)) < 4.0, truth
    # the report's expectation is the same arithmetic on the share as sent (the rows); the target meets it
    # but for each prefix's first use
    expected = summary["llm_workload"]["prefix"]["expected_hit_pct"]
    assert expected == pytest.approx(hit_pct(share), abs=0.2)
    assert expected - 3.0 < truth <= expected + 0.5
    assert target_hit_pct(prefix_runs["unshared"][2]) < 1.0  # every message starts with its own nonce
    assert prefix_runs["unshared"][1].read_request_rows().frame["prefix"].isna().all()


@pytest.mark.long
@pytest.mark.slow
def test_prefix_cache_cold_fires_on_a_cache_too_small_and_not_otherwise(prefix_runs):
    found = {name: {f["id"]: f for f in s["findings"]} for name, (s, _, _) in prefix_runs.items()}
    print({n: sorted(f) for n, f in found.items()})
    assert "prefix_cache_cold" in found["small"]
    assert "prefix_cache_cold" not in found["shared"]
    assert "prefix_cache_cold" not in found["unshared"]  # nothing shared: nothing to expect
    for name in PLANS:
        assert not set(found[name]) & ENGINE_FINDINGS, (name, sorted(found[name]))
        assert prefix_runs[name][0]["findings_unchecked"] == []
    ev = found["small"]["prefix_cache_cold"]["evidence"]
    assert ev["hit_pct_mean"] == pytest.approx(target_hit_pct(prefix_runs["small"][2]), abs=2.0)
    assert ev["expected_hit_pct"] == prefix_runs["small"][0]["llm_workload"]["prefix"]["expected_hit_pct"] > 60


value = st.integers(-2, 300) | st.floats(allow_nan=True, allow_infinity=True) | st.booleans() | st.text(max_size=3)


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({}, optional={"tokens": value, "count": value, "share": value, "other": value}),
       st.integers(0, 5))
def test_the_prefix_table_survives_any_input(table, seed):
    try:
        p = for_plan(plan_from_dict({"protocol": "openai", "request": {"prefix": table, "prompt_tokens": 4}}), seed=seed)
    except PlanError as e:
        assert "\n" not in str(e) and "request.prefix" in str(e)
        return
    tokens, count = table.get("tokens", 1), table.get("count", 1)
    for _ in range(20):
        r = p.next_request()
        messages = json.loads(r.body)["messages"]
        if r.prefix is None:
            assert len(messages) == 1 and r.tokens_in == 4
        else:
            assert 0 <= r.prefix < count and messages[0]["role"] == "system"
            assert r.tokens_in == tokens + 4 == sum(len(m["content"].split()) for m in messages)
