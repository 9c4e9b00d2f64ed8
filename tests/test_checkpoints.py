"""The shipped `checkpoints/`: bases load offline and match their cards, adapters match their bases.

These guard the hand-off between retraining a base and redoing its adapters: an adapter checkpoint
left over from an older base is refused by its fingerprint, and this is where that shows.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dex_adapt.adapters.exits import base_model_path, load_exit_adapters
from dex_adapt.ar import hf_greedy
from dex_adapt.decoder import DexConfig, DexDecoder
from dex_adapt.pretrain.evaluate import FIB_PROMPT, complete

CKPT = Path(__file__).resolve().parents[1] / "checkpoints"
BASES = ["dexcoder-16l", "dexcoder-16l-ee"]
ADAPTERS = {"dexcoder-16l-dex": "dexcoder-16l", "dexcoder-16l-ee-dex": "dexcoder-16l-ee"}


@pytest.mark.parametrize("name", BASES)
def test_base_loads_offline_and_fits_in_40_mb(name):
    d = CKPT / name
    assert sum(f.stat().st_size for f in d.iterdir() if f.is_file()) < 40 * 2**20
    model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.num_hidden_layers >= 16
    assert model.dtype == torch.bfloat16
    assert tok.eos_token_id == model.config.eos_token_id == model.generation_config.eos_token_id
    assert tok.decode(tok("def f(x):\n    return x")["input_ids"]) == "def f(x):\n    return x"


@pytest.mark.parametrize("name", BASES)
def test_card_states_the_recorded_numbers(name):
    d = CKPT / name
    summary = json.loads((d / "training_summary.json").read_text())
    ev = json.loads((d / "depth_agreement.json").read_text())
    card = (d / "README.md").read_text()
    assert f"**{summary['tokens_seen']:,} tokens seen**" in card
    assert f"perplexity {summary['heldout_ppl_fp32']:.2f}" in card
    assert f"**held-out perplexity {ev['heldout_ppl']:.2f}**" in card
    assert (d / "depth_agreement.md").read_text().strip() in card
    assert f"python train/eval_base.py --model-dir checkpoints/{name} " in card


def test_default_base_completes_fibonacci_as_valid_python():
    model = AutoModelForCausalLM.from_pretrained(CKPT / "dexcoder-16l", dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(CKPT / "dexcoder-16l")
    text, parses = complete(model, tok, FIB_PROMPT, 96)
    ast.parse(FIB_PROMPT + text)  # raises with the offending line if the model regressed
    assert parses and text.strip()


@pytest.mark.parametrize("adapters,base", sorted(ADAPTERS.items()))
def test_shipped_adapters_load_onto_their_base_and_decode_losslessly(adapters, base):
    ckpt = str(CKPT / adapters)
    assert Path(base_model_path(ckpt)).resolve() == (CKPT / base).resolve()
    model = AutoModelForCausalLM.from_pretrained(CKPT / base, dtype=torch.float32).eval()
    exits = load_exit_adapters(ckpt, model)  # raises if the base was retrained after the adapters
    assert sorted(exits) == list(range(1, model.config.num_hidden_layers))
    prompt = AutoTokenizer.from_pretrained(CKPT / base)("def add(a, b):")["input_ids"]
    want = hf_greedy(model, prompt, 16, {model.config.eos_token_id})
    got, stats = DexDecoder(model, DexConfig(explorers=4), adapters=exits).generate(prompt, max_new_tokens=16)
    assert got == want and stats.ticks_per_token < 4.0
