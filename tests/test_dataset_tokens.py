"""A dataset's prompts are counted once per process, not per request: with a tokenizer, every
row's tokens_in is still the tokenizer's own count of the prompt sent, and the tokenizer encodes
each record's text only the first time any user sends it."""

from __future__ import annotations

import json

import pytest

from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles.protocols import for_plan
from kneeswarm.locustfiles.protocols.workload import token_counter

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizer extra (pip install 'kneeswarm[tokenizer]')")

PROMPTS = ["the knee is where latency takes off", "tokens stream one step at a time",
           "batching raises throughput until saturation", "a queue grows", "x"]


class CountingTokenizer:
    """The real tokenizer, with its encode calls counted."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def encode(self, text, **kw):
        self.calls += 1
        return self.tok.encode(text, **kw)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_each_dataset_prompt_is_counted_once_and_right(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(PROMPTS * 10, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    counter = token_counter(str(tok_path))
    counter._tok = spy = CountingTokenizer(counter._tok)
    plan = plan_from_dict({"protocol": "openai", "request": {"endpoint": "completions", "tokenizer": str(tok_path),
                                                            "dataset": str(data)}})
    users = [for_plan(plan, seed=s) for s in range(3)]
    seen = 0
    for _ in range(40):
        for u in users:
            r = u.next_request()
            prompt = json.loads(r.body)["prompt"]
            assert r.tokens_in == len(tok.encode(prompt, add_special_tokens=False).ids) > 0
            seen += 1
    assert seen == 120 and spy.calls == len(PROMPTS)
