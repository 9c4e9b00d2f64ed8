"""The base model: a from-scratch `Qwen3ForCausalLM`, and its LayerSkip-style early-exit loss.

The early-exit loss runs the decoder layers itself (instead of `model(...)`) because layer
dropout has to *skip* layers, which HF's forward cannot do; it reuses the model's own modules
(embedding, rotary, layers, final norm, tied head), so the trained weights are a plain Qwen3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from .config import PretrainConfig

__all__ = ["build_model_config", "build_model", "generation_config", "lm_loss", "early_exit_loss"]


def build_model_config(cfg: PretrainConfig, vocab_size: int, eos_token_id: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.context_length,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        use_cache=True,
    )


def build_model(cfg: PretrainConfig, vocab_size: int, eos_token_id: int) -> Qwen3ForCausalLM:
    torch.manual_seed(cfg.seed)
    return Qwen3ForCausalLM(build_model_config(cfg, vocab_size, eos_token_id))


def generation_config(eos_token_id: int) -> GenerationConfig:
    return GenerationConfig(bos_token_id=eos_token_id, eos_token_id=eos_token_id,
                            pad_token_id=eos_token_id, do_sample=False)


def lm_loss(model: Qwen3ForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `ids` [B, T]."""
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def _next_token_ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    # logits [B, T, V] predict ids shifted by one.
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def layer_drop_probs(num_layers: int, p_max: float) -> list[float]:
    """LayerSkip's rising schedule: 0 at the first layer, `p_max` at the last."""
    if num_layers == 1:
        return [0.0]
    return [p_max * d / (num_layers - 1) for d in range(num_layers)]


def early_exit_loss(model: Qwen3ForCausalLM, ids: torch.Tensor, *, layers_per_step: int,
                    ee_scale: float, p_max: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerSkip-style loss: final-layer CE + depth-weighted early-exit CE, with layer dropout.

    Returns (total loss to backprop, final-layer CE for logging). Early exits at layer d (1-based)
    get weight proportional to d, normalised so the early-exit weights sum to `ee_scale`; only
    `layers_per_step` sampled intermediate layers are scored per step to bound cost.
    """
    inner = model.model
    L = len(inner.layers)
    h = inner.embed_tokens(ids)  # [B, T, H]
    pos = torch.arange(ids.shape[1], device=ids.device)[None, :]
    rope = inner.rotary_emb(h, pos)
    probs = layer_drop_probs(L, p_max)
    drop = (torch.rand(L, generator=generator) < torch.tensor(probs)).tolist()
    exits = set(torch.randperm(L - 1, generator=generator)[:layers_per_step].add(1).tolist())
    weights = {d: float(d) for d in exits}
    norm = sum(weights.values()) or 1.0

    total = ids.new_zeros((), dtype=torch.float32)
    for d, layer in enumerate(inner.layers, start=1):
        if not (drop[d - 1] and d < L):  # the last layer is never dropped
            # attention_mask=None makes SDPA causal; no padding in pretraining batches.
            h = layer(h, attention_mask=None, position_embeddings=rope, position_ids=pos)
        if d in exits:
            total = total + (ee_scale * weights[d] / norm) * _next_token_ce(model.lm_head(inner.norm(h)), ids)
    final = _next_token_ce(model.lm_head(inner.norm(h)), ids)
    return total + final, final.detach()
