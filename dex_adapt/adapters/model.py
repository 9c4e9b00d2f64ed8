"""The inducing-adapter tuner (PEFT `BaseTuner`), the base-model fingerprint, and registration.

Registration (peft 0.21): `peft.utils.register_peft_method` only accepts names that are members of
PEFT's own `PeftType` enum, so an out-of-tree method fills the four mapping tables in
`peft.mapping` itself (`PEFT_TYPE_TO_CONFIG_MAPPING`, `..._TUNER_MAPPING`, `..._PREFIX_MAPPING`,
`..._MIXED_MODEL_MAPPING` left alone). `PeftType` is a `str` enum and the tables are plain dicts,
so the key `"DEX_INDUCING"` is found by every lookup PEFT does (`get_peft_model`,
`PeftConfig.from_pretrained`, `PeftModel.from_pretrained`, `get/set_peft_model_state_dict`).
Saving and loading go through the tuner's state-dict hooks (`_get_adapter_state_dict`,
`_remove_adapter_name_from_key`, `_remap_adapter_state_dict_for_load`); we override only the key
translation, because our adapter is a nested module (`...inducing_adapter.<name>.down.weight`)
where PEFT's default assumes the adapter name is the second-to-last key element.
"""

from __future__ import annotations

import hashlib
import json
import re
from contextlib import nullcontext

import torch
from torch import nn
from peft.tuners.tuners_utils import BaseTuner

from .config import PEFT_TYPE, InducingConfig
from .layer import InducingAdapter, InducingLayer

__all__ = [
    "InducingModel",
    "register",
    "exit_adapters",
    "base_fingerprint",
    "decoder_layers",
    "final_norm",
    "unembedding",
    "BaseModelMismatchError",
]

PREFIX = "inducing_"


class BaseModelMismatchError(ValueError):
    """The adapter checkpoint was trained on a different base model (the message is one line)."""


# ----------------------------------------------------------------------------- base model layout
# The layout itself (`model.model.{layers,norm}` + output embeddings) is model_surgery's knowledge;
# we only ask it whether the architecture is supported.
def _causal_lm(model: nn.Module) -> nn.Module:
    """The HF `*ForCausalLM` inside a PeftModel / BaseTuner / plain model."""
    while isinstance(getattr(model, "module", None), nn.Module):  # DDP / DeepSpeed engine
        model = model.module
    if hasattr(model, "get_base_model"):  # PeftModel
        model = model.get_base_model()
    if isinstance(model, BaseTuner):
        model = model.model
    from dex_adapt.model_surgery import check_supported

    check_supported(model.config)
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return _causal_lm(model).model.layers


def final_norm(model: nn.Module) -> nn.Module:
    return _causal_lm(model).model.norm


def unembedding(model: nn.Module) -> nn.Module:
    return _causal_lm(model).get_output_embeddings()


# ----------------------------------------------------------------------------- fingerprint
# Config fields that decide whether two bases share a residual stream; run-time knobs (dtype,
# attention implementation, use_cache, transformers_version) are left out.
_FINGERPRINT_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
    "tie_word_embeddings", "rope_theta", "rope_parameters",
)
_FINGERPRINT_ROWS = 256


def _gathered(param: torch.Tensor):
    """Full view of a parameter that DeepSpeed ZeRO-3 may have partitioned (collective there)."""
    if hasattr(param, "ds_id"):
        import deepspeed

        return deepspeed.zero.GatheredParameters([param], modifier_rank=None)
    return nullcontext()


def base_fingerprint(model: nn.Module) -> str:
    """`sha256:` of the architecture fields of the config and a row sample of the unembedding.

    Rows are rounded to bfloat16 before hashing so that the same checkpoint loaded in float32 or
    bfloat16 has the same fingerprint (HF's cast is round-to-nearest-even either way). 256 evenly
    spaced rows identify a trained model as well as all of them, and keep this cheap at 152k x 5120.
    """
    lm = _causal_lm(model)
    config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    fields = {k: getattr(config, k, None) for k in _FINGERPRINT_FIELDS}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    weight = unembedding(lm).weight
    with _gathered(weight):
        step = max(1, weight.shape[0] // _FINGERPRINT_ROWS)
        rows = weight.detach()[::step].to("cpu", torch.bfloat16).contiguous()
        digest.update(rows.view(torch.int16).numpy().tobytes())
    return "sha256:" + digest.hexdigest()[:32]


def check_fingerprint(config: InducingConfig, model: nn.Module) -> None:
    """Refuse an adapter whose recorded base is not `model`, with a one-line message."""
    if config.base_fingerprint is None:
        return
    actual = base_fingerprint(model)
    if actual != config.base_fingerprint:
        name = config.base_model_name_or_path or "<unnamed>"
        raise BaseModelMismatchError(
            f"inducing adapters were trained on base {name!r} (fingerprint {config.base_fingerprint}), "
            f"but the given model has fingerprint {actual}; load them onto the base they were trained on"
        )


# ----------------------------------------------------------------------------- the tuner
class InducingModel(BaseTuner):
    """Inducing adapters at the chosen exit depths of a frozen causal LM.

    Adapter for exit depth `d` lives on decoder layer `d-1` (whose output is `h_d`) as
    `model.layers.{d-1}.inducing_adapter.<adapter_name>`. The wrapped model's forward is unchanged;
    exit logits come from `exits.exit_logits`.
    """

    prefix: str = PREFIX
    tuner_layer_cls = InducingLayer
    target_module_mapping: dict = {}

    def _prepare_adapter_config(self, peft_config: InducingConfig, model_config: dict) -> InducingConfig:
        return peft_config  # the layer names need the model itself: see _prepare_model

    def _prepare_model(self, peft_config: InducingConfig, model: nn.Module) -> None:
        """Record L, H, exit depths and the fingerprint; check them when loading a saved adapter."""
        lm = _causal_lm(model)
        num_layers = lm.config.num_hidden_layers
        hidden = lm.config.hidden_size
        if peft_config.num_hidden_layers not in (None, num_layers) or peft_config.hidden_size not in (None, hidden):
            raise BaseModelMismatchError(
                f"inducing adapters were trained on a base with {peft_config.num_hidden_layers} layers and hidden "
                f"size {peft_config.hidden_size}, but the given model has {num_layers} and {hidden}"
            )
        check_fingerprint(peft_config, model)
        depths = peft_config.exit_depths or list(range(1, num_layers))
        bad = [d for d in depths if not 1 <= d < num_layers]
        if bad:
            raise ValueError(f"exit depths {bad} out of range 1..{num_layers - 1} for a {num_layers}-layer base")
        peft_config.exit_depths = sorted(depths)
        peft_config.num_hidden_layers = num_layers
        peft_config.hidden_size = hidden
        if peft_config.base_fingerprint is None:
            peft_config.base_fingerprint = base_fingerprint(model)
        names = {id(m): n for n, m in model.named_modules()}
        layers = decoder_layers(model)
        self._depth_of_module = {names[id(layers[d - 1])]: d for d in peft_config.exit_depths}
        peft_config.target_modules = sorted(self._depth_of_module, key=self._depth_of_module.get)

    def _create_and_replace(self, peft_config, adapter_name, target, target_name, parent, current_key,
                            parameter_name=None, **kwargs) -> None:
        hidden = peft_config.hidden_size
        if isinstance(target, InducingLayer):
            target.update_layer(adapter_name, peft_config, hidden)
            return
        depth = self._depth_of_module[current_key]
        new_module = InducingLayer(target, depth, adapter_name, peft_config, hidden)
        if adapter_name not in self.active_adapters:
            new_module.requires_grad_(False)
        self._replace_module(parent, target_name, new_module, target)

    @classmethod
    def _remove_adapter_name_from_key(cls, key: str, adapter_name: str) -> str:
        # `...inducing_adapter.<name>.down.weight` -> `...inducing_adapter.down.weight`
        return re.sub(rf"\.{PREFIX}adapter\.{re.escape(adapter_name)}\.", f".{PREFIX}adapter.", key)

    def _unload_and_optionally_merge(self, merge=True, progressbar=False, safe_merge=False, adapter_names=None):
        if merge:
            raise NotImplementedError("inducing adapters act only at exits; they cannot be merged into the base")
        for name, module in list(self.model.named_modules()):
            if isinstance(module, InducingLayer):
                parent_name, _, child = name.rpartition(".")
                self._replace_module(self.model.get_submodule(parent_name), child, module.get_base_layer(), module)
        if hasattr(self.model, "peft_config"):
            del self.model.peft_config
        return self.model


def exit_adapters(model: nn.Module, adapter_name: str | None = None) -> dict[int, InducingAdapter]:
    """depth -> the live `InducingAdapter` of a model carrying the tuner (PeftModel or injected)."""
    found: dict[int, InducingAdapter] = {}
    for module in model.modules():
        if isinstance(module, InducingLayer):
            name = adapter_name or module.active_adapters[0]
            if name in module.inducing_adapter:
                found[module.exit_depth] = module.inducing_adapter[name]
    return dict(sorted(found.items()))


# ----------------------------------------------------------------------------- registration
def register() -> None:
    """Put the method into PEFT's mapping tables (idempotent)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_PREFIX_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING

    if PEFT_TYPE_TO_CONFIG_MAPPING.get(PEFT_TYPE) is InducingConfig:
        return
    if PEFT_TYPE in PEFT_TYPE_TO_CONFIG_MAPPING or PREFIX in PEFT_TYPE_TO_PREFIX_MAPPING.values():
        raise KeyError(f"PEFT already has a method {PEFT_TYPE!r} or prefix {PREFIX!r} that is not dex_adapt's")
    PEFT_TYPE_TO_CONFIG_MAPPING[PEFT_TYPE] = InducingConfig
    PEFT_TYPE_TO_TUNER_MAPPING[PEFT_TYPE] = InducingModel
    PEFT_TYPE_TO_PREFIX_MAPPING[PEFT_TYPE] = PREFIX


register()
