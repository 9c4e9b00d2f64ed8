"""Per-rank loading: read only the tensors a stage owns, straight from the safetensors shards.

A rank that runs layers ``[start, end)`` needs those layers, the embeddings on the first stage,
and the final norm + LM head on every stage with an exit (in DEX every stage has one). The model
skeleton is built on the meta device, the owned tensors are read with ``safe_open`` (through
``model.safetensors.index.json`` when the checkpoint is sharded) and assigned in place; everything
else stays on the meta device and costs no memory.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import torch
from safetensors import safe_open

from ..model_surgery import check_supported

__all__ = ["owned_tensor_names", "load_stage_model", "materialized_parameters"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def owned_tensor_names(names, layers: tuple[int, int], first_stage: bool, has_exit: bool = True) -> list[str]:
    """Checkpoint tensor names a stage owns (pure: unit-testable without any file)."""
    start, end = layers
    owned = []
    for name in names:
        if name.startswith("model.layers."):
            index = int(name.split(".")[2])
            if start <= index < end:
                owned.append(name)
        elif name.startswith("model.embed_tokens."):
            if first_stage:
                owned.append(name)
        elif name.startswith("model.norm.") or name.startswith("lm_head."):
            if has_exit:
                owned.append(name)
    return owned


def _shard_map(path: str) -> dict[str, str]:
    """tensor name -> shard file."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(path, shard) for name, shard in weight_map.items()}
    single = os.path.join(path, SINGLE)
    if not os.path.isfile(single):
        raise FileNotFoundError(f"no {SINGLE} or {INDEX} in {path}")
    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


def load_stage_model(path: str, layers: tuple[int, int], first_stage: bool, dtype=torch.float32,
                     device: str | torch.device = "cpu"):
    """A ``*ForCausalLM`` whose owned tensors are real and the rest on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    check_supported(config)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    shard_of = _shard_map(path)
    wanted = owned_tensor_names(shard_of, layers, first_stage)
    tied = getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in shard_of
    if tied and "model.embed_tokens.weight" not in wanted:
        wanted.append("model.embed_tokens.weight")  # the head's weights live under the embedding name
    by_shard = defaultdict(list)
    for name in wanted:
        by_shard[shard_of[name]].append(name)
    state = {}
    for shard, names in by_shard.items():
        with safe_open(shard, framework="pt", device=str(device)) as f:
            for name in names:
                state[name] = f.get_tensor(name).to(dtype)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
        if not first_stage:
            del state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=False, assign=True)
    if tied and first_stage:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers (rotary inv_freq) are computed, not stored: rebuild them on the real device.
    body = model.model
    with torch.device(device):
        body.rotary_emb = type(body.rotary_emb)(config=config)
    return model.eval()


def materialized_parameters(model) -> int:
    """Number of parameter elements that are not on the meta device (shared tensors counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.device.type != "meta" and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
