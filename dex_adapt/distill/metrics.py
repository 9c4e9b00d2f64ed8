"""Per-exit distillation metrics: forward KL to the final distribution and top-1 agreement.

Top-1 agreement of exit `d` is the fraction of positions where `argmax` of the exit equals the
`argmax` of the model's own head: exactly the event that lets DEX commit a token proposed at that
exit (greedy). KL is the training objective, `KL(final || exit)` at temperature tau (times tau^2).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

__all__ = ["forward_kl", "exit_stats", "ExitMeter", "format_table", "evaluate_exits"]


def forward_kl(teacher_logits: torch.Tensor, exit_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-position `KL(softmax(t/tau) || softmax(s/tau)) * tau^2`: `[B, T, V] -> [B, T]` (float32)."""
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    s = F.log_softmax(exit_logits.float() / temperature, dim=-1)
    return (t.exp() * (t - s)).sum(-1) * temperature**2


def exit_stats(teacher_logits: torch.Tensor, exit_logits: torch.Tensor, temperature: float = 1.0):
    """(kl `[B, T]` with grad, agreement `[B, T]` bool)."""
    kl = forward_kl(teacher_logits, exit_logits, temperature)
    agree = exit_logits.detach().argmax(-1) == teacher_logits.argmax(-1)
    return kl, agree


class ExitMeter:
    """Running sums per exit depth, reducible across processes (sum of sums, then divide)."""

    def __init__(self) -> None:
        self.sums: dict[int, torch.Tensor] = {}  # depth -> [kl_sum, agree_sum, count]

    def update(self, depth: int, kl: torch.Tensor, agree: torch.Tensor) -> None:
        row = torch.stack([kl.detach().float().sum(), agree.float().sum(), torch.tensor(float(agree.numel()))])
        self.sums[depth] = self.sums.get(depth, torch.zeros(3)) + row.cpu()

    def add_rows(self, depths: list[int], rows: torch.Tensor) -> None:
        """Add `(kl_sum, agree_sum, tokens)` rows, one per depth (as `DistillObjective` returns)."""
        for d, row in zip(depths, rows.detach().float().cpu()):
            self.sums[d] = self.sums.get(d, torch.zeros(3)) + row

    def reduced(self, accelerator=None, depths: Iterable[int] | None = None) -> dict[int, dict[str, float]]:
        """depth -> {kl, agree, tokens}; collective when `accelerator` has several processes."""
        depths = sorted(depths if depths is not None else self.sums)
        table = torch.stack([self.sums.get(d, torch.zeros(3)) for d in depths]) if depths else torch.zeros(0, 3)
        if accelerator is not None and accelerator.num_processes > 1:
            table = accelerator.reduce(table.to(accelerator.device), reduction="sum").cpu()
        return {d: {"kl": (r[0] / r[2]).item() if r[2] else float("nan"),
                    "agree": (r[1] / r[2]).item() if r[2] else float("nan"),
                    "tokens": int(r[2].item())} for d, r in zip(depths, table)}

    def reset(self) -> None:
        self.sums.clear()


def format_table(lens: dict[int, dict], adapter: dict[int, dict]) -> str:
    """Markdown table: per exit depth, logit lens vs adapter (top-1 agreement and KL)."""
    lines = ["| depth | agree (lens) | agree (adapter) | KL (lens) | KL (adapter) |",
             "|---:|---:|---:|---:|---:|"]
    for d in sorted(adapter):
        lens_row = lens.get(d, {"agree": float("nan"), "kl": float("nan")})
        lines.append(f"| {d} | {lens_row['agree']:.3f} | {adapter[d]['agree']:.3f} | "
                     f"{lens_row['kl']:.3f} | {adapter[d]['kl']:.3f} |")
    mean = lambda rows, k: sum(r[k] for r in rows.values()) / max(1, len(rows))  # noqa: E731
    lines.append(f"| mean | {mean(lens, 'agree'):.3f} | {mean(adapter, 'agree'):.3f} | "
                 f"{mean(lens, 'kl'):.3f} | {mean(adapter, 'kl'):.3f} |")
    return "\n".join(lines)


@torch.no_grad()
def evaluate_exits(model, adapters: dict[int, torch.nn.Module], batches: Iterable[torch.Tensor],
                   temperature: float = 1.0, accelerator=None) -> tuple[dict, dict]:
    """(lens, adapter) per-depth metrics over `batches` of input ids, one base forward per batch."""
    from dex_adapt.adapters.model import final_norm, unembedding

    norm, head = final_norm(model), unembedding(model)
    lens_meter, adapter_meter = ExitMeter(), ExitMeter()
    depths = sorted(adapters)
    for input_ids in batches:
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        for d in depths:
            h = out.hidden_states[d]
            lens_meter.update(d, *exit_stats(out.logits, head(norm(h)), temperature))
            adapter_meter.update(d, *exit_stats(out.logits, head(norm(adapters[d](h))), temperature))
    return lens_meter.reduced(accelerator, depths), adapter_meter.reduced(accelerator, depths)
