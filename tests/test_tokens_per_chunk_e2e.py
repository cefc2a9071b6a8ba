"""Token truth against a server that streams several tokens per chunk (a chunk is not a token): real `kneeswarm
run`s against the real demo target started with ``--tokens-per-chunk N`` (N tokens merged into each
chunk, as a server that detokenizes incrementally sends them; its usage right).

Independent truths: the target's schedule (token k leaves D + k*G after arrival, a chunk when its
last token does), N itself, the requested length, a tokenizer built here whose vocabulary is the
demo target's words (one token each, so its count of the streamed text is the tokens made), and
numpy on the request rows the run stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kneeswarm.contracts.rundir import RunDir
from kneeswarm.target.llm import VOCAB

from conftest import read_summary, side_by_side, start_cli

pytestmark = pytest.mark.slow
tokenizers = pytest.importorskip("tokenizers", reason="the tokenizer extra (pip install 'kneeswarm[tokenizer]')")

D_MS, G_MS, N, MAX_TOKENS = 30.0, 10.0, 4, 8
TINY_MODEL = ["--work", "1", "--hidden", "64", "--tokens", "1", "--request-threads", "2"]
RUN_TIMEOUT = 180
NO_TEXT_EVERY = 5  # the pinned run's target streams every 5th answer's tokens without text


@pytest.fixture(scope="module")
def words_tokenizer(tmp_path_factory) -> str:
    """A tokenizer.json that reads each of the demo target's words as one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *VOCAB])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("words") / "tokenizer.json"
    tok.save(str(path))
    assert len(tok.encode("alpha beta gamma ", add_special_tokens=False).ids) == 3
    return str(path)


def plan(tmp_path: Path, name: str, url: str, steps: str, request: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\ntarget = "{url}"\nprotocol = "openai"\n'
                    f"[load]\nsteps = {steps}\nramp = 0.5\nhold = 4.0\nsettle = 0.5\nworkers = 1\n"
                    f"[analysis]\nmin_requests = 10\n[request]\nmax_tokens = {MAX_TOKENS}\n{request}")
    return path


def steady_ok(rd: RunDir, step: dict):
    rows = rd.read_requests()
    return rows[(rows["t_start"] >= step["t_lo"]) & (rows["t_start"] < step["t_hi"]) & rows["ok"]]


@pytest.mark.long
def test_several_tokens_per_chunk_valid_steps_and_a_usage_that_a_count_contradicts(
        tmp_path, start_demo_target, words_tokenizer):
    """Three runs side by side: (right) N tokens per chunk, usage right, length pinned and a tokenizer:
    every step valid, tokens/s from usage, tokens per chunk = N, ITL per token = gap / N; (tokenizer)
    and (pinned) the same server with usage 2 over: flagged by the count that can contradict it; the
    pinned run's target also streams every 5th answer without text: counted per step, no TTFT."""
    right = start_demo_target(*TINY_MODEL, "--ttft-ms", str(D_MS), "--itl-ms", str(G_MS), "--tokens-per-chunk", str(N))
    off = [start_demo_target(*TINY_MODEL, "--ttft-ms", str(D_MS), "--itl-ms", str(G_MS), "--tokens-per-chunk",
                             str(N), "--usage-offset", "2", *extra)
           for extra in ((), ("--no-text-every", str(NO_TEXT_EVERY)))]
    plans = {
        "right": plan(tmp_path, "right", right.url, "[1, 4]", f'ignore_eos = true\ntokenizer = "{words_tokenizer}"\n'),
        "tokenizer": plan(tmp_path, "tokenizer", off[0].url, "[2]", f'tokenizer = "{words_tokenizer}"\n'),
        "pinned": plan(tmp_path, "pinned", off[1].url, "[2]", "ignore_eos = true\n"),
    }
    with side_by_side() as runs:
        for name, p in plans.items():
            runs[name] = start_cli("run", str(p), "--out", str(tmp_path / name), "-q")
        done = {name: proc.communicate(timeout=RUN_TIMEOUT) for name, proc in runs.items()}
    results = {}
    for name, proc in runs.items():
        assert proc.returncode == 0, (name, done[name][1][-3000:])
        (run_dir,) = [p for p in (tmp_path / name).iterdir() if p.is_dir()]
        results[name] = read_summary(run_dir), RunDir(run_dir)

    summary, rd = results["right"]
    for step in summary["steps"]:
        ok = steady_ok(rd, step)
        gaps = np.concatenate([np.asarray(g, dtype=float) for g in ok["itl_ms"]])
        print(f"{step['users']} users: {len(ok)} ok, TTFT P50 {step['ttft_p50_ms']:.2f} (D+(N-1)G = "
              f"{D_MS + (N - 1) * G_MS}), ITL/chunk P50 {step['itl_p50_ms']:.2f} (NG = {N * G_MS}), ITL/token P50 "
              f"{step['itl_token_p50_ms']:.2f} (G = {G_MS}), {step['tokens_per_chunk']:.2f} tokens/chunk")
        assert step["valid"], step["reasons"]
        assert set(ok["usage_out"]) == {MAX_TOKENS} and set(ok["chunks_out"]) == {MAX_TOKENS // N}
        assert set(ok["tokens_tokenizer"]) == set(ok["tokens_pinned"]) == {MAX_TOKENS}
        assert step["tokens_per_chunk"] == N and step["chunks_out_median"] == MAX_TOKENS // N
        assert step["tokens_s"] == pytest.approx(len(ok) / (step["t_hi"] - step["t_lo"]) * MAX_TOKENS)
        assert step["tokens_compared"] == len(ok) and step["tokens_mismatch_share"] == 0.0
        for q in (50, 95, 99):  # ITL per token = gap / N (within 5 %), the gaps numpy's on the rows
            assert step[f"itl_token_p{q}_ms"] == pytest.approx(np.percentile(gaps, q) / N, rel=0.05)
            assert step[f"itl_p{q}_ms"] == pytest.approx(np.percentile(gaps, q), rel=1e-5)
        assert abs(step["itl_p50_ms"] - N * G_MS) <= 3.0 and abs(step["ttft_p50_ms"] - (D_MS + (N - 1) * G_MS)) <= 5.0
        tpot = (ok["latency_ms"] - ok["ttft_ms"]) / (MAX_TOKENS - 1)  # TPOT from the true count, not the chunks
        assert step["tpot_p50_ms"] == pytest.approx(np.percentile(tpot, 50), rel=1e-5)
        assert step["no_text_requests"] == 0
    assert summary["itl_columns"]["itl_token"].startswith("per token")
    md = (rd.report_dir / "summary.md").read_text()
    assert "ITL/chunk P50" in md and "ITL/token P50" in md and f"tokens per chunk {N:.2f}" in md
    assert "usage agrees with pinned lengths and the plan's tokenizer" in md

    for name, said in (("tokenizer", f"the plan's tokenizer counted a median of {MAX_TOKENS}"),
                       ("pinned", f"the requests pinned a median of {MAX_TOKENS}")):
        summary, rd = results[name]
        (step,) = summary["steps"]
        ok = steady_ok(rd, step)
        assert set(ok["usage_out"]) == {MAX_TOKENS + 2} and len(ok) >= 10
        (reason,) = [r for r in step["reasons"] if "token counts disagree" in r]
        assert f"usage says a median of {MAX_TOKENS + 2} output tokens" in reason and said in reason, reason
        assert "chunks" not in reason and not step["valid"] and step["tokens_mismatch_share"] == 1.0

    summary, rd = results["pinned"]
    (step,) = summary["steps"]
    ok = steady_ok(rd, step)
    blank = ok[ok["ttft_ms"].isna()]
    assert (blank["chunks_out"] == 0).all() and (blank["usage_out"] == MAX_TOKENS + 2).all()
    assert step["no_text_requests"] == len(blank) and step["streaming_requests"] == len(ok) - len(blank)
    assert abs(len(blank) / len(ok) - 1 / NO_TEXT_EVERY) <= 0.05, (len(blank), len(ok))
    md = (rd.report_dir / "summary.md").read_text()
    assert "**No text:**" in md and f"{len(blank):,} at 2 users" in md
