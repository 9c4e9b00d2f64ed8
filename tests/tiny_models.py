"""Tiny random Hugging Face causal LMs for tests, built from configs (no download, float32, CPU).

``initializer_range`` defaults to 0.2 rather than HF's 0.02. Measured on these configs (greedy,
float32, CPU): at 0.02 logits are nearly flat (|logit| < 1.5) and the residual stream is dominated
by the embedding, so exit 0 already agrees with the final depth on most tokens and outputs repeat
a few tokens — the decoder's fallback and collapse paths are barely exercised. At 0.2 logits are
~10x larger, outputs are diverse and exits disagree often. Float32 noise grows too (a KV-cached step
vs a full forward differ by up to ~4e-5 at 0.2, ~6e-7 at 0.02), so the margin-to-noise ratio is not
better than at 0.02; ``test_decoder_lossless.py`` asserts that every greedy decision it checks
still clears its model's noise by more than 10x.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

__all__ = ["ARCHS", "TinySpec", "build_config", "build_model", "random_spec", "top2_margin", "save_tokenizer"]

ARCHS = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class TinySpec:
    """The knobs of a tiny model; equal specs build identical weights."""

    arch: str
    seed: int = 0
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 128
    max_positions: int = 128
    sliding_window: int | None = None
    """Mistral: every layer slides. Qwen2/Qwen3: layers >= ``max_window_layers`` slide."""
    max_window_layers: int | None = None
    eos: int | None = None
    tie_embeddings: bool = False
    initializer_range: float = 0.2

    def with_(self, **kw) -> TinySpec:
        return replace(self, **kw)


def build_config(spec: TinySpec):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=2 * spec.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden // spec.heads, max_position_embeddings=spec.max_positions,
        initializer_range=spec.initializer_range, tie_word_embeddings=spec.tie_embeddings,
        eos_token_id=spec.eos, bos_token_id=None, pad_token_id=None,
    )
    if spec.arch == "llama":
        return LlamaConfig(**common)
    if spec.arch == "mistral":
        return MistralConfig(sliding_window=spec.sliding_window, **common)
    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[spec.arch]
    sliding = spec.sliding_window is not None
    return cls(use_sliding_window=sliding, sliding_window=spec.sliding_window,
               max_window_layers=spec.max_window_layers if spec.max_window_layers is not None else spec.layers,
               **common)


def build_model(spec: TinySpec):
    """A float32, eval-mode ``*ForCausalLM`` with weights drawn from ``spec.seed``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(build_config(spec), dtype=torch.float32,
                                             attn_implementation="sdpa")
    return model.eval()


def random_spec(rng: random.Random, arch: str, seed: int) -> TinySpec:
    """A random tiny config of ``arch``: 2–6 layers, hidden 32–128, GQA or MHA, maybe sliding."""
    layers = rng.randint(2, 6)
    heads = rng.choice([2, 4])
    hidden = max(heads * rng.choice([8, 16, 32]), 32)  # 32, 64 or 128; head_dim even (RoPE)
    kv_heads = rng.choice([h for h in (1, 2, heads) if heads % h == 0])
    window = mwl = None
    if arch == "mistral" and rng.random() < 0.6:
        window = rng.randint(2, 12)
    if arch in ("qwen2", "qwen3") and rng.random() < 0.5:
        window = rng.randint(2, 12)
        mwl = rng.randint(0, layers - 1)
    return TinySpec(arch=arch, seed=seed, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                    vocab=rng.choice([64, 96, 128]), max_positions=rng.choice([48, 64, 128]),
                    sliding_window=window, max_window_layers=mwl, tie_embeddings=rng.random() < 0.3)


def top2_margin(logits: torch.Tensor) -> float:
    """Gap between the two largest logits of a [V] row."""
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def save_tokenizer(path, vocab_size: int) -> None:
    """A tiny word-level ``PreTrainedTokenizerFast`` with ids < ``vocab_size``, saved into ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["def add ( a , b ) : return a + b", "the quick brown fox jumps over the lazy dog",
              "hello world print ( x )", "for i in range ( 10 ) : pass"]
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<eos>"])
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() <= vocab_size
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(str(path))

