"""Plain autoregressive decoding: the references DEX is checked against.

``hf_greedy`` is Hugging Face's own ``generate(do_sample=False)``; ``ar_decode`` is a plain KV-cached
loop over the model's own forward that draws each token with the project's :class:`Sampler`, so
sampled DEX output can be compared token for token (DESIGN.md §5).
"""

from __future__ import annotations

import torch

from .sampling import Sampler

__all__ = ["hf_greedy", "ar_decode"]


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_token_ids: set[int]) -> list[int]:
    """New tokens from ``model.generate(do_sample=False)``, stopping at any EOS id."""
    from transformers import GenerationConfig

    eos = sorted(eos_token_ids) or None
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos[0] if eos else 0,
    )
    input_ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
    return out[0, len(prompt_ids):].tolist()


@torch.no_grad()
def ar_decode(model, prompt_ids: list[int], max_new_tokens: int, sampler: Sampler,
              eos_token_ids: set[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Token-by-token decoding with the model's own forward and cache.

    Returns the new tokens and the final-depth logits [V] that produced each (for margins).
    """
    device = model.device
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    tokens: list[int] = []
    logits_seen: list[torch.Tensor] = []
    position = len(prompt_ids)
    while len(tokens) < max_new_tokens:
        logits = out.logits[0, -1].float()
        token = sampler(logits, position)
        tokens.append(token)
        logits_seen.append(logits)
        if token in eos_token_ids or len(tokens) == max_new_tokens:
            break
        out = model(input_ids=torch.tensor([[token]], device=device), cache=out.cache, use_cache=True)
        position += 1
    return tokens, logits_seen
