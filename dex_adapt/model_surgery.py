"""All knowledge of Hugging Face decoder layouts lives here.

A :class:`StagedModel` runs a supported HF causal LM piece by piece, exactly as the model's own
``forward`` does: embeddings, any range of decoder layers (with the model's rotary embeddings and
per-layer attention type), and an exit (final norm + LM head, with logit scaling/soft-capping where
the config has them). The HF decoder layers are used unmodified; the tree of speculative branches
is expressed through a custom cache object and a 4-D attention mask (see ``tree_cache.py``).

Supported architectures are listed in :data:`SUPPORTED_ARCHITECTURES`; anything else is refused
with a clear error rather than decoded silently wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "UnsupportedModelError",
    "StagedModel",
    "check_supported",
    "load_causal_lm",
    "load_config",
]

#: model_type -> class name. All share the layout ``model.{embed_tokens,layers,norm,rotary_emb}`` +
#: ``lm_head``, and decoder layers called as ``layer(h, attention_mask, position_ids, cache,
#: use_cache, position_embeddings)``.
SUPPORTED_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedModelError(ValueError):
    """The model is not one whose layout this module knows (the message is user-facing)."""


def _supported_list() -> str:
    return ", ".join(sorted(SUPPORTED_ARCHITECTURES.values()))


def check_supported(config) -> None:
    """Raise :class:`UnsupportedModelError` unless ``config`` is a supported decoder-only LM."""
    model_type = getattr(config, "model_type", None)
    archs = getattr(config, "architectures", None) or []
    if model_type not in SUPPORTED_ARCHITECTURES:
        name = archs[0] if archs else model_type
        raise UnsupportedModelError(f"unsupported architecture {name!r}; supported: {_supported_list()}")
    for arch in archs:
        if arch != SUPPORTED_ARCHITECTURES[model_type]:
            raise UnsupportedModelError(f"unsupported architecture {arch!r}; supported: {_supported_list()}")


def load_config(path: str):
    """The HF config of a local model directory, refusing unsupported architectures up front."""
    from transformers import AutoConfig

    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory not found: {path}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"no config.json in model directory {path}")
    try:
        with open(os.path.join(path, "config.json")) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise UnsupportedModelError(f"{path}/config.json is not valid JSON: {e}") from None
    if raw.get("model_type") not in SUPPORTED_ARCHITECTURES:
        name = (raw.get("architectures") or [raw.get("model_type")])[0]
        raise UnsupportedModelError(f"unsupported architecture {name!r}; supported: {_supported_list()}")
    config = AutoConfig.from_pretrained(path)
    check_supported(config)
    return config


def load_causal_lm(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load a supported model from a local directory, checking the architecture before the weights."""
    from transformers import AutoModelForCausalLM

    load_config(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


@dataclass(frozen=True)
class LayerSpec:
    attention_type: str  # FULL or SLIDING
    sliding_window: int | None


class StagedModel(nn.Module):
    """A supported HF causal LM cut into embeddings, decoder-layer ranges and exits.

    Args:
        model: a loaded ``*ForCausalLM`` of a supported architecture.
        adapters: optional depth -> module applied to ``h_d`` before an exit at depth ``d < L``
            (the inducing-adapter seam, DESIGN.md §6). Depths without one use the logit lens.
    """

    def __init__(self, model: nn.Module, adapters: Mapping[int, nn.Module] | None = None) -> None:
        super().__init__()
        check_supported(model.config)
        self.model = model
        self.config = model.config
        body = model.model
        self.embed_tokens = body.embed_tokens
        self.layers = body.layers
        self.norm = body.norm
        self.rotary_emb = body.rotary_emb
        self.lm_head = model.get_output_embeddings()
        self.num_layers = self.config.num_hidden_layers
        self.adapters = nn.ModuleDict({str(d): m for d, m in (adapters or {}).items()})
        for d in (adapters or {}):
            if not 1 <= d < self.num_layers:
                raise ValueError(f"adapter depth {d} out of range 1..{self.num_layers - 1}")
        self.layer_specs = [self._layer_spec(i) for i in range(self.num_layers)]

    # ------------------------------------------------------------- model facts
    def _layer_spec(self, i: int) -> LayerSpec:
        cfg = self.config
        window = getattr(cfg, "sliding_window", None)
        if cfg.model_type == "mistral":  # MistralModel: every layer slides when sliding_window is set
            return LayerSpec(SLIDING, window) if window else LayerSpec(FULL, None)
        layer_types = getattr(cfg, "layer_types", None)
        if layer_types is not None and layer_types[i] == SLIDING and window:
            return LayerSpec(SLIDING, window)
        return LayerSpec(FULL, None)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    @property
    def eos_token_ids(self) -> set[int]:
        """Every EOS id of the model: config and generation config, int or list."""
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (self.config, gen):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            if eos is None:
                continue
            ids.update([eos] if isinstance(eos, int) else list(eos))
        return ids

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device  # the embeddings live only on the first pipeline stage

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    # ------------------------------------------------------------- pieces
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] ids -> [B, T, H]; the embedding module carries any model-specific scaling."""
        return self.embed_tokens(token_ids)

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor):
        """Rotary (cos, sin) for ``position_ids`` [B, T], as the model's own forward computes them."""
        return self.rotary_emb(hidden, position_ids)

    def run_layers(self, hidden, start, end, masks, position_ids, position_embeddings, cache):
        """Decoder layers ``[start, end)``. ``masks`` maps attention type -> 4-D mask [B, 1, T, S]."""
        for i in range(start, end):
            out = self.layers[i](
                hidden,
                attention_mask=masks[self.layer_specs[i].attention_type],
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
                position_embeddings=position_embeddings,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def exit_logits(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        """Logits at depth ``depth`` from ``h_depth`` [..., H]: adapter (if any), final norm, head."""
        adapter = self.adapters[str(depth)] if str(depth) in self.adapters else None
        if adapter is not None and depth < self.num_layers:
            hidden = adapter(hidden)
        logits = self.lm_head(self.norm(hidden))
        scale = getattr(self.config, "logit_scale", None)
        if scale is not None:
            logits = logits * scale
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
