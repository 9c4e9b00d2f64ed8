"""Inducing adapters as a PEFT method: round trips, wrong base, zero init == logit lens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import dex_adapt  # noqa: F401  (registers the method with PEFT)

sys.path.insert(0, str(Path(__file__).parent))
from _tiny_base import tiny_model  # noqa: E402


def saved_base(tmp_path, seed=0, **kw):
    model = tiny_model(seed, **kw)
    path = tmp_path / f"base{seed}"
    model.save_pretrained(path)
    return str(path)


def randomize_adapters(model, seed=1):
    """Trained-looking (non-zero) adapter weights so round trips compare something."""
    from dex_adapt.adapters import exit_adapters

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for adapter in exit_adapters(model).values():
            for p in adapter.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


IDS = torch.tensor([[3, 17, 42, 8, 91, 5, 60, 2, 33, 12]])


def test_peft_round_trip_identical_exit_logits(tmp_path):
    from peft import PeftConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from dex_adapt.adapters import (InducingConfig, exit_adapters, exit_logits, load_exit_adapters,
                                    save_exit_adapters, base_model_path)

    base = saved_base(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(base)
    plain_logits = model(IDS).logits
    peft_model = get_peft_model(model, InducingConfig(bottleneck_size=8))
    assert peft_model.peft_config["default"].exit_depths == [1, 2, 3]
    # the base model's own forward is untouched by the wrapping
    assert torch.equal(peft_model(input_ids=IDS).logits, plain_logits)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all(".inducing_adapter.default." in n for n in trainable)
    randomize_adapters(peft_model)
    before = exit_logits(peft_model, exit_adapters(peft_model), IDS)

    ckpt = tmp_path / "ckpt"
    save_exit_adapters(peft_model, str(ckpt), base=base)
    raw = json.loads((ckpt / "adapter_config.json").read_text())
    assert raw["peft_type"] == "DEX_INDUCING" and raw["exit_depths"] == [1, 2, 3]
    assert raw["base_fingerprint"].startswith("sha256:") and raw["base_model_name_or_path"] == "../base0"
    assert base_model_path(str(ckpt)) == base
    assert (ckpt / "adapter_model.safetensors").stat().st_mode == (ckpt / "adapter_config.json").stat().st_mode

    config = PeftConfig.from_pretrained(str(ckpt))
    assert type(config) is InducingConfig and config.bottleneck_size == 8
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(ckpt))
    after = exit_logits(reloaded, exit_adapters(reloaded), IDS)
    seam = exit_logits(AutoModelForCausalLM.from_pretrained(base), load_exit_adapters(str(ckpt), model), IDS)
    assert before.keys() == after.keys() == seam.keys() == {1, 2, 3, 4}
    for d in before:
        assert torch.equal(before[d], after[d]), d
        assert torch.equal(before[d], seam[d]), d
    assert not torch.equal(before[1], exit_logits(model, None, IDS)[1])  # adapters do something


def test_affine_kind_and_chosen_depths_round_trip(tmp_path):
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from dex_adapt.adapters import InducingConfig, exit_adapters, exit_logits, load_exit_adapters

    base = saved_base(tmp_path, layers=6)
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, InducingConfig(kind="affine", exit_depths=[2, 4]))
    randomize_adapters(peft_model)
    assert sorted(exit_adapters(peft_model)) == [2, 4]
    peft_model.save_pretrained(tmp_path / "ckpt")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(tmp_path / "ckpt"))
    seam = load_exit_adapters(str(tmp_path / "ckpt"), model)
    for d in (2, 4):
        h = torch.randn(2, 5, 32)
        assert torch.equal(exit_adapters(peft_model)[d](h), exit_adapters(reloaded)[d](h))
        assert torch.equal(exit_adapters(peft_model)[d](h), seam[d](h))
    assert sorted(exit_logits(reloaded, seam, IDS, depths=[2, 4])) == [2, 4]


def test_wrong_base_is_refused_with_one_line(tmp_path):
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from dex_adapt.adapters import BaseModelMismatchError, InducingConfig, load_exit_adapters

    base = saved_base(tmp_path, seed=0)
    other = saved_base(tmp_path, seed=1)  # same architecture, different weights
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), InducingConfig()).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError) as err:
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(other), str(tmp_path / "ckpt"))
    assert isinstance(err.value, BaseModelMismatchError) and "\n" not in str(err.value)
    assert "fingerprint" in str(err.value)
    with pytest.raises(BaseModelMismatchError):
        load_exit_adapters(str(tmp_path / "ckpt"), AutoModelForCausalLM.from_pretrained(other))
    deeper = tiny_model(layers=6)
    with pytest.raises(BaseModelMismatchError, match="6"):
        load_exit_adapters(str(tmp_path / "ckpt"), deeper)
    # the same base in another dtype is the same base
    load_exit_adapters(str(tmp_path / "ckpt"), AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16))


def test_zero_init_adapter_is_the_logit_lens(tmp_path):
    from peft import get_peft_model

    from dex_adapt.adapters import InducingConfig, exit_adapters, exit_logits

    for kind in ("bottleneck", "affine"):
        model = tiny_model()
        lens = exit_logits(model, None, IDS)
        peft_model = get_peft_model(model, InducingConfig(kind=kind))
        induced = exit_logits(peft_model, exit_adapters(peft_model), IDS)
        for d in lens:
            assert torch.equal(lens[d], induced[d]), (kind, d)
    # bit-exact in bf16 too: residual computed in the adapter's float32, cast back
    model = tiny_model().to(torch.bfloat16)
    peft_model = get_peft_model(model, InducingConfig())
    h = torch.randn(3, 32, dtype=torch.bfloat16)
    assert all(torch.equal(a(h), h) for a in exit_adapters(peft_model).values())


def test_hidden_state_is_pre_norm_residual():
    """h_d = output_hidden_states[d] for d < L; exit L is the model's head."""
    from dex_adapt.adapters import exit_logits

    model = tiny_model()
    out = model(IDS, output_hidden_states=True)
    logits = exit_logits(model, None, IDS)
    assert torch.equal(logits[4], out.logits)
    assert torch.equal(logits[2], model.lm_head(model.model.norm(out.hidden_states[2])))


def test_bad_checkpoints_give_clear_errors(tmp_path):
    from dex_adapt.adapters import base_model_path, load_exit_adapters

    with pytest.raises(FileNotFoundError, match="not found"):
        base_model_path(str(tmp_path / "nope"))
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(ValueError, match="expected 'DEX_INDUCING'"):
        load_exit_adapters(str(tmp_path / "lora"), tiny_model())
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "adapter_config.json").write_text(
        json.dumps({"peft_type": "DEX_INDUCING", "base_model_name_or_path": "Qwen/Qwen3-32B"}))
    assert base_model_path(str(tmp_path / "hub")) == "Qwen/Qwen3-32B"


def test_registration_is_lazy_and_survives_any_import_order():
    import subprocess
    import sys

    code = (
        "import sys, dex_adapt; assert 'peft' not in sys.modules, 'import dex_adapt pulled in peft'\n"
        "from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING as M\n"
        "assert M['DEX_INDUCING'].__name__ == 'InducingConfig'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loads_under_another_adapter_name(tmp_path):
    """The state-dict key hook strips/inserts the adapter name inside the nested adapter module."""
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from dex_adapt.adapters import InducingConfig, exit_adapters, exit_logits

    base = saved_base(tmp_path)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), InducingConfig(bottleneck_size=4))
    randomize_adapters(peft_model)
    peft_model.save_pretrained(tmp_path / "ckpt")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(tmp_path / "ckpt"),
                                         adapter_name="induce")
    assert all("inducing_adapter.induce." in n for n, _ in reloaded.named_parameters() if "inducing" in n)
    before = exit_logits(peft_model, exit_adapters(peft_model), IDS)
    after = exit_logits(reloaded, exit_adapters(reloaded, "induce"), IDS)
    assert all(torch.equal(before[d], after[d]) for d in before)
