"""Offline evaluation prompts and the logit-lens depth-agreement measurement."""

from __future__ import annotations

import ast

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dex_adapt.depth_agreement import AgreementTally, agreement_table, layer_agreement_counts
from dex_adapt.prompts import heldout_snippets, humaneval_prompts, truncate_completion


def test_humaneval_has_164_prompts():
    prompts = humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0]["task_id"] == "HumanEval/0" and prompts[-1]["task_id"] == "HumanEval/163"
    assert all(set(p) == {"task_id", "prompt"} and "def " in p["prompt"] for p in prompts)
    assert humaneval_prompts(limit=3) == prompts[:3]


def test_heldout_snippets_deterministic():
    a = heldout_snippets(4, n_chars=300, seed=0)
    assert a == heldout_snippets(4, n_chars=300, seed=0)
    assert a != heldout_snippets(4, n_chars=300, seed=1)
    assert all(len(s) == 300 for s in a)


def test_truncate_completion_stops_at_dedent():
    body = "    return 1\n\ndef other():\n    pass\n"
    cut = truncate_completion(body)
    assert cut == "    return 1\n"
    ast.parse("def f():\n" + cut)


def _tiny_model(layers: int = 3) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    return Qwen3ForCausalLM(cfg).eval()


def test_last_layer_agrees_with_itself():
    model = _tiny_model()
    ids = torch.randint(0, 50, (1, 20))
    counts, n = layer_agreement_counts(model, ids)
    assert len(counts) == 3 and n == 20
    assert counts[-1] == n  # hidden_states[L] is already normed: lens(L) == final logits
    counts2, n2 = layer_agreement_counts(model, ids, slice(10, 19))
    assert n2 == 9 and counts2[-1] == 9


def test_lens_applies_final_norm_to_intermediate_layers():
    model = _tiny_model(layers=2)
    ids = torch.randint(0, 50, (1, 12))
    out = model(input_ids=ids, output_hidden_states=True)
    h1 = out.hidden_states[1][0]
    expect = int((model.lm_head(model.model.norm(h1)).argmax(-1) == out.logits[0].argmax(-1)).sum())
    assert layer_agreement_counts(model, ids)[0][0] == expect


def test_agreement_table_markdown():
    t = AgreementTally()
    t.add([1, 4], 4)
    t.add([3, 4], 4)
    assert t.rates() == [0.5, 1.0]
    table = agreement_table({"code": t.rates()}, {"code": t.positions})
    assert table.splitlines()[2] == "| 1 | 0.500 |"
