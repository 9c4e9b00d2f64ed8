"""LayerSkip-style greedy self-speculation, actually run: the check behind ``baselines.layerskip_cost``.

Draft ``g`` tokens autoregressively from the exit at ``depth`` (layers ``[0, depth)``, then the
adapter if one is given, the final norm and the head), each draft conditioned on the drafts
before it; verify all of them with one full forward of the model over ``[last, d_1 .. d_g]``;
keep the longest matching prefix plus the model's own next token. The draft pass keeps its own
KV cache of layers ``< depth`` and the verify pass the model's full cache; both are cropped back to
the committed prefix after each round.

The tick-model cost is a function of the rounds ``(drafted, accepted)``, which this decoder
returns; :func:`~dex_adapt.baselines.layerskip_rounds` predicts the same rounds from the AR-recorded
true-prefix predictions alone (drafts after a wrong one are never accepted), and the benchmark
checks the two agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = ["SelfSpecResult", "self_speculative_decode"]


@dataclass
class SelfSpecResult:
    tokens: list[int]
    rounds: list[tuple[int, int]]  # (drafted, committed tokens) per round
    wall_s: float


def _crop(cache, keep: int) -> None:
    """Keep the first ``keep`` positions of every initialised layer."""
    for layer in cache.layers:
        length = layer.get_seq_length()
        if length > keep:
            layer.crop(keep - length)


class _Drafter:
    """The model truncated to ``depth`` layers, with its own cache and an optional adapter at the exit."""

    def __init__(self, model, depth: int, adapter=None) -> None:
        from transformers import DynamicCache

        from .model_surgery import StagedModel

        self.model, self.depth = model, depth
        self.staged = StagedModel(model, {depth: adapter} if adapter is not None else None)
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # positions held in the cache
        self._h = None

    def _keep(self, _module, _inputs, output):
        self._h = output[0] if isinstance(output, tuple) else output

    def next_token(self, ids: list[int]) -> int:
        """Feed the positions not yet cached (``ids[self.length:]``); top-1 at the last one."""
        feed = torch.tensor([ids[self.length:]], device=self.model.device)
        body, config = self.model.model, self.model.config
        hook = body.layers[self.depth - 1].register_forward_hook(self._keep)
        full = config.num_hidden_layers
        config.num_hidden_layers = self.depth  # what HF's own assistant_early_exit does
        try:
            body(input_ids=feed, cache=self.cache, use_cache=True)
        finally:
            config.num_hidden_layers = full
            hook.remove()
        self.length = len(ids)
        return int(torch.argmax(self.staged.exit_logits(self._h[0, -1], self.depth)))

    def rollback(self, keep: int) -> None:
        keep = min(keep, self.length)
        _crop(self.cache, keep)
        self.length = keep


@torch.no_grad()
def self_speculative_decode(model, prompt_ids: list[int], depth: int, g: int, max_new_tokens: int,
                            adapter=None, eos_token_ids: set[int] | None = None) -> SelfSpecResult:
    """Greedy self-speculative decoding with drafts from depth ``depth``; lossless up to near-ties."""
    from transformers import DynamicCache

    if not 1 <= depth < model.config.num_hidden_layers:
        raise ValueError(f"draft depth must be in 1..{model.config.num_hidden_layers - 1}, got {depth}")
    if g < 1:
        raise ValueError(f"draft length g must be >= 1, got {g}")
    eos = eos_token_ids or set()
    t0 = time.perf_counter()
    device = model.device
    budget = max(0, min(max_new_tokens, int(getattr(model.config, "max_position_embeddings", 1 << 30))
                        - len(prompt_ids)))
    seq = list(prompt_ids)
    out: list[int] = []
    rounds: list[tuple[int, int]] = []
    full = DynamicCache(config=model.config)
    if len(seq) > 1:
        model(input_ids=torch.tensor([seq[:-1]], device=device), cache=full, use_cache=True)
    drafter = _Drafter(model, depth, adapter)
    while len(out) < budget:
        drafted = min(g, budget - len(out) - 1)
        drafts: list[int] = []
        for _ in range(drafted):
            drafts.append(drafter.next_token(seq + drafts))
        logits = model(input_ids=torch.tensor([[seq[-1], *drafts]], device=device), cache=full,
                       use_cache=True).logits[0]
        verified = logits.argmax(-1).tolist()  # [drafted + 1]: the model's token after each input
        accepted = 0
        while accepted < drafted and drafts[accepted] == verified[accepted]:
            accepted += 1
        committed = 0
        for token in drafts[:accepted] + [verified[accepted]]:
            out.append(token)
            seq.append(token)
            committed += 1
            if token in eos or len(out) >= budget:
                break
        rounds.append((drafted, committed))
        if out[-1] in eos:
            break
        _crop(full, len(seq) - 1)
        drafter.rollback(len(seq) - 1)
    return SelfSpecResult(out, rounds, time.perf_counter() - t0)
