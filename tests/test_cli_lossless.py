"""Lossless through the command line: random model directories, random ``dex-decode`` flags, ``--verify``.

``test_decoder_lossless.py`` checks the Python API on the tiny models of ``tiny_models.py``; this
suite goes through the product surface (a ``save_pretrained`` directory, argument parsing, the JSON
file) on configs that suite does not draw: HF's default ``initializer_range`` of 0.02 (near-flat
logits), ``head_dim`` unrelated to ``hidden / heads``, attention/MLP biases, one-layer models,
several EOS ids, other RoPE bases and repeated prompts. Each case must exit 0 with every prompt's
``verified`` true (HF ``generate`` for greedy, the plain AR sampler otherwise), and the JSON output
ids must equal HF ``generate``'s for greedy cases. Rerun one case with ``-k case07``.
"""

from __future__ import annotations

import contextlib
import io
import json
import random

import pytest
import torch

from dex_adapt.ar import hf_greedy
from dex_adapt.cli.decode import main

N_CASES = 40
SEED = 20261129


def random_config(rng: random.Random):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    arch = rng.choice(["llama", "qwen2", "qwen3", "mistral"])
    layers = rng.randint(1, 8)
    heads = rng.choice([1, 2, 4, 8])
    vocab = rng.choice([50, 100, 257, 1000])
    eos = rng.choice([None, rng.randrange(vocab), [rng.randrange(vocab), rng.randrange(vocab)]])
    common = dict(
        vocab_size=vocab, hidden_size=rng.choice([32, 48, 64, 96]), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0]),
        head_dim=rng.choice([8, 16, 32]), max_position_embeddings=rng.choice([32, 64, 256]),
        initializer_range=rng.choice([0.02, 0.2, 0.5]), tie_word_embeddings=rng.random() < 0.3,
        rms_norm_eps=rng.choice([1e-6, 1e-5]), rope_theta=rng.choice([100.0, 10_000.0, 1e6]),
        eos_token_id=eos, bos_token_id=None, pad_token_id=None,
    )
    common["intermediate_size"] = common["hidden_size"] * rng.choice([1, 2, 3])
    if arch == "llama":
        return LlamaConfig(attention_bias=rng.random() < 0.5, mlp_bias=rng.random() < 0.3, **common)
    if arch == "mistral":
        return MistralConfig(sliding_window=rng.choice([None, rng.randint(2, 16)]), **common)
    slides = rng.random() < 0.4
    cls = Qwen2Config if arch == "qwen2" else Qwen3Config
    return cls(use_sliding_window=slides, sliding_window=rng.randint(2, 16) if slides else None,
               max_window_layers=rng.randint(0, layers), **common)


def random_flags(rng: random.Random, config) -> tuple[list[str], list[list[int]], int, bool]:
    L, vocab, ctx = config.num_hidden_layers, config.vocab_size, config.max_position_embeddings
    if rng.random() < 0.5:
        flags = ["--explorers", str(rng.randint(1, L))]
    else:
        inner = sorted(rng.sample(range(1, L), rng.randint(0, L - 1)))
        flags = ["--exits", ",".join(map(str, inner + [L]))]
    if rng.random() < 0.5:
        flags += ["--width", str(rng.randint(1, 6))]
    if rng.random() < 0.4:
        flags.append("--no-decs")
    policy = rng.choice(["fifo", "confidence"])
    max_new = rng.randint(1, 40)
    flags += ["--policy", policy, "--max-new-tokens", str(max_new)]
    if rng.random() < 0.3:
        flags += ["--max-branches", str(rng.randint(1, 10))]
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, min(40, ctx - 1)))]
               for _ in range(rng.choice([1, 1, 2, 3]))]
    for p in prompts:
        flags += ["--prompt-ids", ",".join(map(str, p))]
    greedy = rng.random() < 0.5
    if not greedy:
        flags += ["--temperature", str(rng.choice([0.5, 1.0, 1.3])), "--seed", str(rng.randrange(1000))]
        if rng.random() < 0.5:
            flags += ["--top-k", str(rng.randint(1, 50))]
        if rng.random() < 0.5:
            flags += ["--top-p", str(round(rng.uniform(0.2, 1.0), 3))]
    return flags, prompts, max_new, greedy


@pytest.mark.parametrize("index", range(N_CASES), ids=[f"case{i:02d}" for i in range(N_CASES)])
def test_cli_output_equals_plain_decoding(index, tmp_path):
    from transformers import AutoModelForCausalLM

    rng = random.Random(SEED * 1000 + index)
    config = random_config(rng)
    torch.manual_seed(index)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path / "model")
    flags, prompts, max_new, greedy = random_flags(rng, config)
    out = tmp_path / "out.json"
    argv = ["--model", str(tmp_path / "model"), *flags, "--verify", "--json", str(out)]
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        rc = main(argv)
    assert rc == 0, f"dex-decode {' '.join(argv)}\n{stderr.getvalue()[-1500:]}"
    records = json.loads(out.read_text())["prompts"]
    assert len(records) == len(prompts) and all(r["verified"] is True for r in records)
    if greedy:
        eos = config.eos_token_id
        eos_ids = set() if eos is None else set(eos if isinstance(eos, list) else [eos])
        for prompt, record in zip(prompts, records):
            room = min(max_new, config.max_position_embeddings - len(prompt))  # decoding stops at the context
            assert record["output_ids"] == hf_greedy(model, prompt, room, eos_ids), " ".join(argv)
