"""Reference-token selection and exit candidates (DESIGN.md §3, §5).

The reference token for position ``p`` is drawn from the final-depth distribution with a generator
seeded from ``(seed, p)``, so DEX and plain AR decoding draw the same token for the same logits no
matter how many speculative forwards happened in between. Exit candidates never reach the output:
they are the argmax of the exit distribution with the branch's earlier proposals masked (DECS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingConfig", "Sampler", "propose"]


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    """0 means greedy (argmax); > 0 samples from the final-depth distribution."""
    top_k: int | None = None
    """Keep only the k most likely tokens before sampling (None: all)."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability reaches p (None: all)."""
    seed: int = 0
    """Seed of the per-position generators."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top-k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Draws the token at ``position`` from final-depth logits [V]."""

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config

    def filtered_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k then top-p (HF's order), as probabilities [V] in float32."""
        cfg = self.config
        logits = logits.float() / cfg.temperature
        if cfg.top_k is not None and cfg.top_k < logits.numel():
            kth = torch.topk(logits, cfg.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if cfg.top_p is not None and cfg.top_p < 1:
            sorted_logits, order = torch.sort(logits, descending=True)
            cum = torch.softmax(sorted_logits, -1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, -1) >= cfg.top_p  # keep the token that crosses p
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        return torch.softmax(logits, -1)

    def __call__(self, logits: torch.Tensor, position: int) -> int:
        if self.config.greedy:
            return int(torch.argmax(logits))
        probs = self.filtered_probs(logits)
        gen = torch.Generator(device="cpu")
        gen.manual_seed((self.config.seed * 1_000_003 + position) % (2**63))
        u = torch.rand((), generator=gen, dtype=torch.float64).item()
        # Inverse CDF with one uniform per position: stable under tiny logit noise except at a
        # boundary, and identical across decoders that see the same distribution.
        cdf = probs.double().cpu().cumsum(0)
        value = torch.tensor([u * float(cdf[-1])], dtype=torch.float64)
        # right=True: the first index whose cdf exceeds the value, which always has p > 0.
        index = int(torch.searchsorted(cdf, value, right=True).item())
        if index >= probs.numel():
            index = int(torch.nonzero(probs).max())
        return index


def propose(logits: torch.Tensor, exclude: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Exit candidates for a batch: logits [B, V], per-row excluded tokens -> (tokens [B], probs [B]).

    The confidence is the candidate's probability under the unmasked exit distribution.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    masked = probs.clone()
    for b, ex in enumerate(exclude):
        if ex:
            masked[b, [t for t in ex if t >= 0]] = -1.0
    tokens = masked.argmax(dim=-1)
    return tokens, probs.gather(1, tokens[:, None]).squeeze(1)
