"""[request] tokenizer: token counts (prompt lengths of the `lengths` generator, tokens_in of rows)
from a Hugging Face tokenizer.json, built here with the tokenizers library itself (BPE trained on
a few sentences, no network); the expected counts come from that tokenizer object."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import read_summary, run_cli
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.protocols.workload import WorkloadError, token_counter

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizer extra (pip install 'kneeswarm[tokenizer]')")

SENTENCES = [
    "the model server answers every request of the swarm",
    "a knee is where the queue grows and latency takes off",
    "tokens stream from the engine one step at a time",
    "load generators measure time to first token and inter token latency",
    "batching requests raises throughput until the server saturates",
] * 20


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> tuple[str, object]:
    """(path of a tokenizer.json, the Tokenizer object that wrote it): a small BPE whose vocabulary
    is too small for most words, so they split into several tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path), tok


def n_tokens(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def prompts(protocol) -> list[tuple[str, int | None]]:
    out = []
    for _ in range(64):
        r = protocol.next_request()
        body = json.loads(r.body)
        out.append((" ".join(m["content"] for m in body["messages"]), r.tokens_in))
    return out


def test_synthetic_prompts_have_the_drawn_length_in_the_tokenizers_tokens(bpe):
    path, tok = bpe
    fixed = for_plan(plan_from_dict({"protocol": "openai", "request": {
        "tokenizer": path, "lengths": {"input": {"dist": "fixed", "mean": 20}}}}), seed=3)
    got = prompts(fixed)
    assert {n_tokens(tok, p) for p, _ in got} == {20} and {n for _, n in got} == {20}
    normal = for_plan(plan_from_dict({"protocol": "openai", "request": {
        "tokenizer": path, "lengths": {"input": {"dist": "normal", "mean": 40, "stdev": 8}}}}), seed=4)
    got = prompts(normal)
    truth = np.array([n_tokens(tok, p) for p, _ in got])
    assert truth.tolist() == [n for _, n in got] and len(set(truth.tolist())) > 5
    # Without the tokenizer the same plan's prompts are 20 words, which this tokenizer splits further.
    words = for_plan(plan_from_dict({"protocol": "openai", "request": {
        "lengths": {"input": {"dist": "fixed", "mean": 20}}}}), seed=3)
    assert min(n_tokens(tok, p) for p, _ in prompts(words)) > 20


def test_dataset_and_prompt_tokens_are_counted_with_the_tokenizer(bpe, tmp_path):
    path, tok = bpe
    data = tmp_path / "d.jsonl"
    chats = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "saturation of engines"}],
             [{"role": "user", "content": "inter token latency measured"}]]
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    p = for_plan(plan_from_dict({"protocol": "openai", "request": {"tokenizer": path, "dataset": str(data)}}))
    seen = {json.loads(r.body)["messages"][-1]["content"]: r.tokens_in for r in (p.next_request(), p.next_request())}
    for c in chats:
        words = sum(len(m["content"].split()) for m in c)
        truth = sum(n_tokens(tok, m["content"]) for m in c)
        assert seen[c[-1]["content"]] == truth != words
    fixed = for_plan(plan_from_dict({"protocol": "openai", "request": {"tokenizer": path, "prompt_tokens": 9}}))
    synthetic = [fixed.next_request() for _ in range(8)]
    assert {n_tokens(tok, json.loads(r.body)["messages"][0]["content"]) for r in synthetic} == {9}
    assert {r.tokens_in for r in synthetic} == {9}


def test_a_bad_tokenizer_is_one_line(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    for path, message in ((str(bad), "not a Hugging Face tokenizer.json"), (str(tmp_path / "no.json"), "no such file")):
        with pytest.raises(WorkloadError) as e:
            token_counter(path)
        assert message in str(e.value) and path in str(e.value) and "\n" not in str(e.value)
    plan = tmp_path / "plan.toml"
    plan.write_text(f'target = "http://127.0.0.1:9"\nprotocol = "openai"\n[request]\ntokenizer = "{bad}"\n')
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "not a Hugging Face tokenizer.json" in res.stderr and not (tmp_path / "runs").exists()


def test_the_summary_says_how_tokens_were_counted():
    from kneeswarm.analysis.summary.build import workload_facts
    from kneeswarm.analysis.reports.markdown import workload_lines

    words = workload_facts({"protocol": "openai", "request": {"lengths": {"input": {"mean": 3}}}})
    assert words == {"inputs": "lengths", "token_counts": "words (approximation)"}
    assert workload_lines({"workload": words}) == ["**Inputs:** lengths; token counts: words (approximation)"]
    assert workload_facts({"protocol": "kserve", "request": {}}) == {}


@pytest.mark.slow
def test_rows_and_received_prompts_agree_with_the_tokenizer(bpe, tmp_path, start_demo_target):
    """A real run (conductor, one worker; no usage from the server, so tokens_in is the client's):
    every prompt the target received has 12 tokens by the test's tokenizer, every row says 12,
    and the run's summary and report say which counting was used."""
    path, tok = bpe
    log = tmp_path / "received.jsonl"
    target = start_demo_target("--work", "1", "--hidden", "64", "--tokens", "1", "--itl-ms", "1",
                               "--request-log", str(log))
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "tok"\ntarget = "{target.url}"\nprotocol = "openai"\n[load]\nsteps = [2]\nworkers = 1\n'
                    f'ramp = 0.5\nhold = 2.0\nsettle = 0.5\n[request]\ntokenizer = "{path}"\nmax_tokens = 2\n'
                    'include_usage = false\n[request.lengths.input]\ndist = "fixed"\nmean = 12\n')
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    from kneeswarm.contracts.rundir import RunDir

    rows = RunDir(run_dir).read_requests()
    sent = [json.loads(json.loads(line)["body"]) for line in log.read_text().splitlines()]
    truth = {n_tokens(tok, b["messages"][0]["content"]) for b in sent if "messages" in b}
    assert len(rows) >= 10 and rows["ok"].all() and set(rows["tokens_in"]) == {12} and truth == {12}
    summary = read_summary(Path(run_dir))
    assert summary["workload"] == {"inputs": "lengths", "token_counts": f"tokenizer {path}"}
    assert f"token counts: tokenizer {path}" in (Path(run_dir) / "report" / "summary.md").read_text()
    assert f"token counts: tokenizer {path}" in (Path(run_dir) / "report" / "index.html").read_text()
