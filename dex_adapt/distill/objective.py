"""The self-distillation objective as one module, so DeepSpeed/accelerate wrap a single forward.

One no-grad forward of the frozen base gives the teacher (the model's own final logits) and every
exit's hidden state `h_d`; each sampled exit then runs `lm_head(norm(A_d(h_d)))` with gradients
flowing only into `A_d` (norm and head are frozen; they stay in the graph so the gradient reaches
the adapter). Loss = mean over the exits of the per-position forward KL(final || exit), averaged
over positions (DESIGN.md §6).
"""

from __future__ import annotations

import torch
from torch import nn

from dex_adapt.adapters.model import exit_adapters, final_norm, unembedding

from .metrics import exit_stats

__all__ = ["DistillObjective"]


class DistillObjective(nn.Module):
    """`forward(input_ids [B, T], depths) -> {loss, stats [n, 3], lens_stats [n, 3] | None}`.

    `stats` rows are `(kl_sum, agree_sum, tokens)` per depth in `depths` order (sums, so they
    reduce across processes by addition).
    """

    def __init__(self, peft_model: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        self.peft_model = peft_model
        self.temperature = temperature
        # Not registered as submodules: they already are, inside peft_model (one owner per parameter).
        self.__dict__["_adapters"] = exit_adapters(peft_model)
        self.__dict__["_norm"] = final_norm(peft_model)
        self.__dict__["_head"] = unembedding(peft_model)

    @property
    def depths(self) -> list[int]:
        return sorted(self._adapters)

    def forward(self, input_ids: torch.Tensor, depths: list[int], with_lens: bool = False) -> dict:
        with torch.no_grad():
            out = self.peft_model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        teacher = out.logits.detach()
        loss = torch.zeros((), device=teacher.device)
        stats, lens_stats = [], []
        for d in depths:
            h = out.hidden_states[d].detach()
            kl, agree = exit_stats(teacher, self._head(self._norm(self._adapters[d](h))), self.temperature)
            loss = loss + kl.mean()
            stats.append(_row(kl, agree))
            if with_lens:
                with torch.no_grad():
                    lens_stats.append(_row(*exit_stats(teacher, self._head(self._norm(h)), self.temperature)))
        return {
            "loss": loss / max(1, len(depths)),
            "stats": torch.stack(stats),
            "lens_stats": torch.stack(lens_stats) if with_lens else None,
        }


def _row(kl: torch.Tensor, agree: torch.Tensor) -> torch.Tensor:
    return torch.stack([kl.detach().float().sum(), agree.float().sum(),
                        torch.tensor(float(agree.numel()), device=kl.device)])
