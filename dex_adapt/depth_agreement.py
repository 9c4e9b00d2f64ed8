"""How redundant is depth? Logit-lens top-1 agreement of every layer with the final layer.

For a causal LM with L layers, the prediction "after d layers" is `lm_head(norm(h_d))`, where h_d
is the residual stream after d decoder layers and `norm` is the model's final norm. HF's
`output_hidden_states=True` returns L+1 states: index 0 is the embedding output, index d (d < L)
the raw residual after d layers, and index L the *already final-normed* last state, so the norm
is applied to d < L only. Agreement(d) is the fraction of positions where argmax of the layer-d
logits equals argmax of the final logits; agreement(L) = 1 by construction. High agreement at
shallow d is the redundancy that depth-exploration decoding exploits.
"""

from __future__ import annotations

import math

import torch

from .model_surgery import check_supported

__all__ = ["lens_parts", "layer_agreement_counts", "AgreementTally", "perplexity", "greedy_continue",
           "agreement_table"]


def lens_parts(model):
    """(final norm, lm_head) of a supported causal LM (see `model_surgery`); raises otherwise."""
    check_supported(model.config)
    return model.model.norm, model.get_output_embeddings()


@torch.no_grad()
def layer_agreement_counts(model, input_ids: torch.Tensor, positions: slice | None = None) -> tuple[list[int], int]:
    """Per-layer count of positions whose lens top-1 equals the final top-1, and the position count.

    `input_ids` is [1, T]; `positions` selects which positions count (default: all).
    """
    norm, head = lens_parts(model)
    out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states  # L+1 tensors [1, T, H]
    L = len(hs) - 1
    sel = positions or slice(None)
    final_top1 = out.logits[0, sel].argmax(-1)  # [P]
    counts = []
    for d in range(1, L + 1):
        h = hs[d][0, sel]
        h = h if d == L else norm(h)  # hs[L] is already normed
        counts.append(int((head(h).argmax(-1) == final_top1).sum()))
    return counts, int(final_top1.numel())


class AgreementTally:
    """Accumulates per-layer agreement counts over many sequences."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.positions = 0

    def add(self, counts: list[int], n: int) -> None:
        self.counts = counts if not self.counts else [a + b for a, b in zip(self.counts, counts)]
        self.positions += n

    def rates(self) -> list[float]:
        return [c / self.positions for c in self.counts] if self.positions else []


@torch.no_grad()
def perplexity(model, sequences: list[torch.Tensor]) -> tuple[float, int]:
    """Token-weighted perplexity over [1, T] sequences, and the number of predicted tokens."""
    total, n = 0.0, 0
    for ids in sequences:
        k = ids.shape[1] - 1
        if k <= 0:
            continue
        total += model(input_ids=ids, labels=ids, use_cache=False).loss.item() * k
        n += k
    return math.exp(total / n), n


@torch.no_grad()
def greedy_continue(model, ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None) -> torch.Tensor:
    """Greedy continuation of [1, T] `ids`; returns [1, T + new] (stops at EOS)."""
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=eos_token_id, pad_token_id=eos_token_id)


def agreement_table(columns: dict[str, list[float]], positions: dict[str, int]) -> str:
    """Markdown table: one row per layer d, one column per source."""
    names = list(columns)
    L = max(len(v) for v in columns.values())
    head = "| layer d | " + " | ".join(f"{n} (n={positions[n]})" for n in names) + " |"
    sep = "|---:|" + "---:|" * len(names)
    rows = [f"| {d} | " + " | ".join(f"{columns[n][d - 1]:.3f}" for n in names) + " |" for d in range(1, L + 1)]
    return "\n".join([head, sep, *rows])
