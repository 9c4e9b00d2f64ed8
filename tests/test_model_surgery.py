"""StagedModel runs a supported HF causal LM piece by piece exactly as the model's own forward does.

Stage by stage (embed -> run_layers over several ranges, a TreeCache used as a plain causal cache
-> exit_logits) must reproduce the HF model's logits for all four architectures, sliding windows
included; exits below L are the logit lens (or an adapter where one is plugged in); anything that
is not a supported architecture is refused.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from dex_adapt.model_surgery import (FULL, SLIDING, SUPPORTED_ARCHITECTURES, StagedModel, UnsupportedModelError,
                                     check_supported, load_causal_lm)
from dex_adapt.tree_cache import TreeCache

from tiny_models import ARCHS, TinySpec, build_model

# Sliding windows shorter than the sequences below, so the window rule is exercised.
SPECS = {
    "llama": TinySpec("llama", seed=1, layers=4, hidden=64, heads=4, kv_heads=2),
    "qwen2": TinySpec("qwen2", seed=2, layers=5, hidden=48, heads=4, kv_heads=1, sliding_window=4,
                      max_window_layers=2),
    "qwen3": TinySpec("qwen3", seed=3, layers=4, hidden=64, heads=4, kv_heads=4, sliding_window=3,
                      max_window_layers=1, tie_embeddings=True),
    "mistral": TinySpec("mistral", seed=4, layers=3, hidden=32, heads=2, kv_heads=1, sliding_window=5),
}
SEQ = [5, 17, 99, 3, 42, 42, 7, 64, 1, 120, 33, 8, 90, 2, 15, 61, 77, 30]
pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOL = dict(rtol=1e-5, atol=1e-4)  # float32; logits are O(10) at initializer_range 0.2


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    spec = SPECS[request.param]
    return spec, build_model(spec)


class PlainCausalRun:
    """A TreeCache with no speculation: every token commits right after its forward."""

    def __init__(self, staged: StagedModel, ranges: list[tuple[int, int]]):
        self.staged, self.ranges = staged, ranges
        self.cache = TreeCache(staged.num_layers, initial_slots=4)  # small: growth happens mid-run
        self.windows = {s.attention_type: s.sliding_window for s in staged.layer_specs}

    def forward(self, token_ids: list[int], first_position: int, prefill: bool) -> torch.Tensor:
        positions = list(range(first_position, first_position + len(token_ids)))
        if prefill:
            slots = self.cache.commit_prefix(positions)
        else:
            ids = [1000 + p for p in positions]
            slots = self.cache.allocate(ids, positions)
        pos = torch.tensor(positions)
        hidden = self.staged.embed(torch.tensor([token_ids]))
        masks = {kind: self.cache.tree_mask(slots, [[] for _ in positions], pos, window, hidden.dtype,
                                            causal_prefix=prefill)
                 for kind, window in self.windows.items()}
        rope = self.staged.position_embeddings(hidden, pos[None])
        self.cache.set_write_slots(slots)
        for start, end in self.ranges:
            hidden = self.staged.run_layers(hidden, start, end, masks, pos[None], rope, self.cache)
        if not prefill:
            for bid in ids:
                self.cache.commit(bid)
        return self.staged.exit_logits(hidden[0], self.staged.num_layers)


def stage_ranges(L: int) -> list[list[tuple[int, int]]]:
    """Several ways to cut [0, L): whole, one layer at a time, uneven."""
    cuts = [[(0, L)], [(i, i + 1) for i in range(L)]]
    if L >= 3:
        cuts.append([(0, 2), (2, L)])
    return cuts


@torch.no_grad()
def test_stage_by_stage_prefill_equals_hf_forward(arch_model):
    spec, model = arch_model
    reference = model(torch.tensor([SEQ])).logits[0]
    staged = StagedModel(model)
    for ranges in stage_ranges(spec.layers):
        logits = PlainCausalRun(staged, ranges).forward(SEQ, 0, prefill=True)
        torch.testing.assert_close(logits, reference, **TOL, msg=f"{spec.arch} ranges={ranges}")
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))


@torch.no_grad()
def test_stage_by_stage_incremental_equals_hf_forward(arch_model):
    """Prefill a prefix, then one token per forward through the cache (the decode path)."""
    spec, model = arch_model
    reference = model(torch.tensor([SEQ])).logits[0]
    staged = StagedModel(model)
    for ranges in stage_ranges(spec.layers):
        run = PlainCausalRun(staged, ranges)
        prefix = 3
        rows = [run.forward(SEQ[:prefix], 0, prefill=True)]
        for p in range(prefix, len(SEQ)):
            rows.append(run.forward([SEQ[p]], p, prefill=False))
        logits = torch.cat(rows)
        torch.testing.assert_close(logits, reference, **TOL, msg=f"{spec.arch} ranges={ranges}")
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))
        assert run.cache.committed_slots == len(SEQ) and run.cache.capacity >= len(SEQ)


@torch.no_grad()
def test_sliding_window_is_really_exercised():
    """With the window replaced by full attention the logits change: the tests above are not vacuous."""
    for arch in ("qwen2", "qwen3", "mistral"):
        spec = SPECS[arch]
        model = build_model(spec)
        reference = model(torch.tensor([SEQ])).logits[0]
        staged = StagedModel(model)
        assert any(s.attention_type == SLIDING for s in staged.layer_specs)
        run = PlainCausalRun(staged, [(0, spec.layers)])
        run.windows = {kind: None for kind in run.windows}
        logits = run.forward(SEQ, 0, prefill=True)
        assert not torch.allclose(logits[spec.sliding_window + 1:], reference[spec.sliding_window + 1:], atol=1e-3)


def test_layer_specs_follow_the_config():
    staged = {arch: StagedModel(build_model(spec)) for arch, spec in SPECS.items()}
    assert [s.attention_type for s in staged["llama"].layer_specs] == [FULL] * 4
    assert [(s.attention_type, s.sliding_window) for s in staged["mistral"].layer_specs] == [(SLIDING, 5)] * 3
    # Qwen2/Qwen3: layers from max_window_layers on slide.
    assert [s.attention_type for s in staged["qwen2"].layer_specs] == [FULL, FULL, SLIDING, SLIDING, SLIDING]
    assert [s.attention_type for s in staged["qwen3"].layer_specs] == [FULL, SLIDING, SLIDING, SLIDING]
    assert staged["qwen2"].layer_specs[-1].sliding_window == 4
    no_window = StagedModel(build_model(SPECS["qwen2"].with_(sliding_window=None)))
    assert {s.attention_type for s in no_window.layer_specs} == {FULL}
    mistral_full = StagedModel(build_model(SPECS["mistral"].with_(sliding_window=None)))
    assert {s.attention_type for s in mistral_full.layer_specs} == {FULL}


@torch.no_grad()
def test_exit_logits_below_L_are_the_logit_lens(arch_model):
    spec, model = arch_model
    out = model(torch.tensor([SEQ]), output_hidden_states=True)
    staged = StagedModel(model)
    run = PlainCausalRun(staged, [(0, spec.layers)])
    # Stage by stage, keeping h_d after every layer.
    positions = list(range(len(SEQ)))
    slots = run.cache.commit_prefix(positions)
    pos = torch.tensor(positions)
    hidden = staged.embed(torch.tensor([SEQ]))
    masks = {k: run.cache.tree_mask(slots, [[]] * len(SEQ), pos, w, hidden.dtype, causal_prefix=True)
             for k, w in run.windows.items()}
    rope = staged.position_embeddings(hidden, pos[None])
    run.cache.set_write_slots(slots)
    for d in range(1, spec.layers):
        hidden = staged.run_layers(hidden, d - 1, d, masks, pos[None], rope, run.cache)
        torch.testing.assert_close(hidden, out.hidden_states[d], **TOL)
        lens = model.lm_head(model.model.norm(out.hidden_states[d]))[0]
        torch.testing.assert_close(staged.exit_logits(hidden[0], d), lens, **TOL)
        assert torch.equal(staged.exit_logits(out.hidden_states[d][0], d), lens)
    assert staged.exit_logits(hidden[0], 1).dtype == torch.float32


class AddBias(nn.Module):
    def __init__(self, hidden: int, seed: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(hidden, generator=torch.Generator().manual_seed(seed)))

    def forward(self, h):
        return h + self.bias


@torch.no_grad()
def test_adapter_applies_only_at_its_exit():
    spec = SPECS["qwen3"]
    model = build_model(spec)
    adapter = AddBias(spec.hidden, 0)
    plain, adapted = StagedModel(model), StagedModel(model, adapters={2: adapter})
    h = torch.randn(5, spec.hidden, generator=torch.Generator().manual_seed(1))
    expected = model.lm_head(model.model.norm(adapter(h)))
    assert torch.equal(adapted.exit_logits(h, 2), expected)
    assert not torch.allclose(plain.exit_logits(h, 2), expected, atol=1e-3)
    for d in (1, 3, spec.layers):
        assert torch.equal(adapted.exit_logits(h, d), plain.exit_logits(h, d))
    # The adapter never touches the residual stream the next stage reads.
    run_a, run_p = PlainCausalRun(adapted, [(0, 2), (2, 4)]), PlainCausalRun(plain, [(0, 2), (2, 4)])
    assert torch.equal(run_a.forward(SEQ, 0, prefill=True), run_p.forward(SEQ, 0, prefill=True))


def test_adapter_depth_out_of_range_is_refused():
    model = build_model(SPECS["llama"])
    for depth in (0, 4, 5):
        with pytest.raises(ValueError, match="adapter depth"):
            StagedModel(model, adapters={depth: nn.Identity()})


def test_model_facts():
    spec = SPECS["mistral"].with_(eos=7, max_positions=96)
    model = build_model(spec)
    staged = StagedModel(model)
    assert staged.num_layers == 3 and staged.max_positions == 96
    assert staged.eos_token_ids == {7}
    model.generation_config.eos_token_id = [7, 9]
    assert staged.eos_token_ids == {7, 9}
    model.config.eos_token_id = None
    model.generation_config.eos_token_id = None
    assert staged.eos_token_ids == set()
    assert staged.device == torch.device("cpu") and staged.dtype == torch.float32


# ---------------------------------------------------------------- refusals
def unsupported_configs():
    from transformers import GemmaConfig, GPT2Config, LlamaConfig

    gemma = GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    gpt2 = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    wrong_head = LlamaConfig(architectures=["LlamaForSequenceClassification"])
    return {"gemma": gemma, "gpt2": gpt2, "llama-classifier": wrong_head}


@pytest.mark.parametrize("name", ["gemma", "gpt2", "llama-classifier"])
def test_check_supported_refuses_other_architectures(name):
    config = unsupported_configs()[name]
    with pytest.raises(UnsupportedModelError) as e:
        check_supported(config)
    for supported in SUPPORTED_ARCHITECTURES.values():
        assert supported in str(e.value)
    assert "\n" not in str(e.value)


def test_check_supported_accepts_the_four():
    from tiny_models import build_config

    for spec in SPECS.values():
        check_supported(build_config(spec))
    assert sorted(SUPPORTED_ARCHITECTURES) == sorted(ARCHS)


def test_staged_model_refuses_unsupported_model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    gpt2 = AutoModelForCausalLM.from_config(unsupported_configs()["gpt2"])
    with pytest.raises(UnsupportedModelError, match="(?i)gpt2.*supported: .*Qwen3ForCausalLM"):
        StagedModel(gpt2)


def test_load_causal_lm_refuses_a_saved_gpt2(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(unsupported_configs()["gpt2"]).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError) as e:
        load_causal_lm(str(tmp_path / "gpt2"))
    assert "GPT2LMHeadModel" in str(e.value)
    assert all(s in str(e.value) for s in SUPPORTED_ARCHITECTURES.values())


def test_load_causal_lm_round_trip(tmp_path):
    spec = SPECS["qwen2"]
    model = build_model(spec)
    model.save_pretrained(tmp_path / "m")
    loaded = load_causal_lm(str(tmp_path / "m"))
    assert not loaded.training
    ids = torch.tensor([SEQ])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_load_causal_lm_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_causal_lm(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_causal_lm(str(tmp_path / "empty"))


def test_load_causal_lm_bad_config_json(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(UnsupportedModelError, match="not valid JSON"):
        load_causal_lm(str(tmp_path / "bad"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UnsupportedModelError, match="bert"):
        load_causal_lm(str(tmp_path / "other"))
