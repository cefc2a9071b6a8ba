"""A tiny llama-architecture GGUF model written locally: random weights, a small vocabulary.

Run with the ``gguf`` package importable (the llama.cpp source tree's own ``gguf-py``, the same
package PyPI ships as ``gguf``):  ``python tiny_gguf.py OUT.gguf [--layers N]``.

What the tests rely on:
- every token decodes to printable ASCII (byte tokens only for 0x20-0x7E plus newline), so each
  generated token is one streamed chunk with text (no half UTF-8 sequence held back);
- the special tokens' rows of ``output.weight`` are zero while the others are large, so their
  logit (0) is far below the top-k of the rest: sampling practically never picks one, and with
  ``ignore_eos`` every answer is exactly ``max_tokens`` long;
- tiny dimensions, so a decode step costs about the same for 1 and for 4 sequences: the server
  scales with concurrency up to its ``--parallel`` slots and no further (the known knee).
"""

from __future__ import annotations

import argparse

import numpy as np

WORDS = ("the", "model", "server", "token", "stream", "latency", "queue", "batch", "answer", "load",
         "knee", "swarm", "engine", "request", "user", "step", "hello", "world")  # the demo prompt words and more
N_EMBD, N_HEAD, N_FF, N_CTX = 64, 4, 128, 4096
OUTPUT_SCALE = 4.0  # std of the normal tokens' output rows: their top logits are far above 0
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style (llama) vocabulary: unk, bos, eos, byte tokens, letters and words."""
    from gguf import TokenType

    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [TokenType.UNKNOWN, TokenType.CONTROL,
                                                                         TokenType.CONTROL]
    for b in [0x0A, *range(0x20, 0x7F)]:
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(TokenType.BYTE)
    pieces = [c for c in "abcdefghijklmnopqrstuvwxyz"] + ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += ["\u2581" + w for w in WORDS]
    for i, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(i) if len(p) <= 2 else float(len(p)))  # whole words win the merge
        types.append(TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def write(path: str, layers: int, seed: int = 0) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("kneeswarm-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(layers)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML)

    def t(name: str, *shape: int, scale: float = 0.05) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, N_EMBD, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    out = (rng.standard_normal((n_vocab, N_EMBD)) * OUTPUT_SCALE).astype(np.float32)
    out[:3] = 0.0  # unk, bos, eos: logit 0, never in the top-k of the rest
    w.add_tensor("output.weight", out)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{name}.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    write(a.out, a.layers)


if __name__ == "__main__":
    main()
