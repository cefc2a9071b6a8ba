"""A tiny llama-architecture GGUF model written locally: random weights, a small vocabulary.

Run with the ``gguf`` package importable (the llama.cpp source tree's own ``gguf-py``, the same
package PyPI ships as ``gguf``):  ``python tiny_gguf.py OUT.gguf [--layers N]``; with
``--lora RANK`` it writes a LoRA adapter of that model instead (``write_lora``).

What the tests rely on:
- the vocabulary has all 256 byte tokens (SentencePiece's byte fallback: any prompt tokenizes),
  but only tokens that decode to printable ASCII can be generated: the rows of ``output.weight``
  of the special tokens and of the bytes outside 0x20-0x7E are zero while the others are large,
  so their logit (0) is far below the top-k of the rest.  Sampling practically never picks one:
  each generated token is one streamed chunk with text (no half UTF-8 sequence held back), and
  with ``ignore_eos`` every answer is exactly ``max_tokens`` long;
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
# The chat template: the messages' text alone (a ChatML template's markers are a dozen byte tokens
# each in this vocabulary, and prompt processing would outweigh the answer)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style (llama) vocabulary: unk, bos, eos, byte tokens, letters and words."""
    from gguf import TokenType

    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [TokenType.UNKNOWN, TokenType.CONTROL,
                                                                         TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(TokenType.BYTE)
    pieces = ["\u2581"] + [c for c in "abcdefghijklmnopqrstuvwxyz"] + ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += ["\u2581" + w for w in WORDS]
    for i, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(i) if len(p) <= 2 else float(len(p)))  # whole words win the merge
        types.append(TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def generable(token: str) -> bool:
    """A token whose text is printable ASCII (a word, a letter, a printable byte)."""
    if token.startswith("<0x") and token.endswith(">"):
        return 0x20 <= int(token[3:-1], 16) <= 0x7E
    return not token.startswith("<") and token != "\u2581"


def write(path: str, layers: int, seed: int = 0, n_embd: int = N_EMBD, n_ff: int = N_FF) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("kneeswarm-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(n_embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(n_embd // N_HEAD)
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
    w.add_chat_template(CHAT_TEMPLATE)

    def t(name: str, *shape: int, scale: float = 0.05) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    out = (rng.standard_normal((n_vocab, n_embd)) * OUTPUT_SCALE).astype(np.float32)
    out[[i for i, tok in enumerate(tokens) if not generable(tok)]] = 0.0  # logit 0: never in the top-k
    w.add_tensor("output.weight", out)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{name}.weight", n_embd, n_embd)
        t(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


#: the base tensors of a layer an adapter may change: (name, rows = outputs, columns = inputs) in
#: numpy's order of the base tensor (ggml's ne[1], ne[0])
LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(path: str, layers: int, rank: int, seed: int, alpha: float | None = None, n_embd: int = N_EMBD,
               n_ff: int = N_FF, targets: tuple[str, ...] = LORA_TARGETS, scale: float = 0.05) -> None:
    """A LoRA adapter of the model ``write`` makes: random A and B of rank RANK on TARGETS of every
    layer, as llama.cpp's convert_lora_to_gguf.py writes a PEFT adapter and src/llama-adapter.cpp
    reads one: ``general.type = "adapter"``, the base model's ``general.architecture`` (llama: the
    loader refuses another), ``adapter.type = "lora"``, ``adapter.lora.alpha`` (the delta is scaled
    by alpha / rank; alpha = rank: by 1), and for each changed base tensor W (ggml ne = [in, out])
    ``W.lora_a`` (ne [in, rank]: numpy (rank, in)) and ``W.lora_b`` (ne [rank, out]: numpy (out,
    rank)).  B is random, not PEFT's zeros: an adapter that changes nothing would still cost its
    matmuls, but its answers would be the base model's."""
    import gguf

    rng = np.random.default_rng(seed)
    shapes = {"attn_q": (n_embd, n_embd), "attn_k": (n_embd, n_embd), "attn_v": (n_embd, n_embd),
              "attn_output": (n_embd, n_embd), "ffn_gate": (n_ff, n_embd), "ffn_up": (n_ff, n_embd),
              "ffn_down": (n_embd, n_ff)}
    w = gguf.GGUFWriter(path, "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_name(f"kneeswarm-tiny-lora-r{rank}-s{seed}")
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank if alpha is None else alpha))
    for i in range(layers):
        for name in targets:
            n_out, n_in = shapes[name]
            w.add_tensor(f"blk.{i}.{name}.weight.lora_a", (rng.standard_normal((rank, n_in)) * scale).astype(np.float32))
            w.add_tensor(f"blk.{i}.{name}.weight.lora_b", (rng.standard_normal((n_out, rank)) * scale).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=N_EMBD)
    ap.add_argument("--ff", type=int, default=N_FF)
    ap.add_argument("--lora", type=int, metavar="RANK", help="write a LoRA adapter of this rank for the model")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.lora:
        write_lora(a.out, a.layers, a.lora, a.seed, n_embd=a.embd, n_ff=a.ff)
    else:
        write(a.out, a.layers, seed=a.seed, n_embd=a.embd, n_ff=a.ff)


if __name__ == "__main__":
    main()
