"""Check a DEX output against plain decoding and explain the first difference (DESIGN.md §7).

Greedy output is compared with HF ``generate(do_sample=False)``; sampled output with the
project's own AR sampler (same ``(seed, position)`` generators). On a mismatch the logit margin
between the two tokens at the first differing position tells a real bug (large margin) from a
batched-kernel near-tie (margin near zero).
"""

from __future__ import annotations

from .ar import ar_decode, hf_greedy
from .sampling import Sampler, SamplingConfig

__all__ = ["verify_output", "first_difference"]


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def verify_output(model, prompt_ids: list[int], output: list[int], max_new_tokens: int,
                  sampling: SamplingConfig, eos_token_ids: set[int]) -> str | None:
    """None when ``output`` equals plain decoding, else a one-line description of the difference."""
    sampler = Sampler(sampling)
    if sampling.greedy:
        reference = hf_greedy(model, prompt_ids, max_new_tokens, eos_token_ids)
    else:
        reference, _ = ar_decode(model, prompt_ids, max_new_tokens, sampler, eos_token_ids)
    k = first_difference(output, reference)
    if k is None:
        return None
    _, logits = ar_decode(model, prompt_ids, k + 1, sampler, eos_token_ids)
    detail = ""
    if k < len(logits) and k < len(output) and k < len(reference):
        row = logits[k]
        detail = f", logit margin {float(row[reference[k]] - row[output[k]]):.3g}"
    dex_tok = output[k] if k < len(output) else "<end>"
    ref_tok = reference[k] if k < len(reference) else "<end>"
    return (f"first difference at new token {k} (position {len(prompt_ids) + k}): "
            f"dex={dex_tok} plain={ref_tok}{detail}")
