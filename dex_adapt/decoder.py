"""The Python API: ``DexDecoder(model, ...).generate(prompt_ids) -> (output_ids, DecodeStats)``.

The decode loop is the whole algorithm at the top level::

    prefill(prompt[:-1])                    # committed KV, all layers
    lattice.start(anchor = last prompt token)
    while not done:
        plan = lattice.plan()               # <= W branches per stage, anchor first
        proposals, reference = executor.run_tick(plan)
        result = lattice.apply(proposals, reference)   # expand; commit + collapse
        executor.apply(result)              # free discarded KV, commit the old anchor's

The committed token is always the final-depth output of a full pass over the exact committed
prefix, so the output equals plain decoding (DESIGN.md §3).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from .executor import SingleProcessExecutor
from .exploration import ExplorationSet
from .lattice import Lattice
from .model_surgery import StagedModel
from .sampling import Sampler, SamplingConfig

__all__ = ["DexConfig", "DecodeStats", "DexDecoder", "PromptError", "check_prompt", "decode_loop"]


class PromptError(ValueError):
    """A prompt the model cannot decode (empty, or longer than its context)."""


@dataclass(frozen=True)
class DexConfig:
    """How to explore. Exactly one of ``exits``/``explorers`` (default: 4 uniform explorers)."""

    exits: tuple[int, ...] | None = None
    """Explicit exit depths, the last one = number of layers."""
    explorers: int | None = None
    """Uniform split into this many stages."""
    width: int | None = None
    """Max branches per stage per tick (None: unbounded)."""
    decs: bool = True
    """Depth-coupled sampling of exit candidates."""
    policy: str = "fifo"
    """Admission order after the anchor when more than ``width`` wait: fifo | confidence. Neither
    wins everywhere (results/README.md): confidence on the 2-epoch standard base, fifo on the
    barely trained early-exit one; fifo stays the default until a model closer to a real LLM decides."""
    max_branches: int = 256
    """Expansion budget: live branches at once."""

    def exploration(self, num_layers: int) -> ExplorationSet:
        if self.exits is not None and self.explorers is not None:
            raise ValueError("give either exits or explorers, not both")
        if self.exits is not None:
            return ExplorationSet(tuple(self.exits), num_layers)
        return ExplorationSet.uniform(self.explorers or min(4, num_layers), num_layers)


@dataclass
class DecodeStats:
    committed: int
    ticks: int
    ticks_per_token: float
    speedup_vs_ar: float
    accepted_by_exit: list[int]
    fallbacks: int
    stage_forwards: int
    stage_forwards_per_token: float
    max_live_branches: int
    wall_s: float
    exits: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class DexDecoder:
    """Lossless depth-exploration decoding of a supported HF causal LM on one device."""

    def __init__(self, model, config: DexConfig | None = None, sampling: SamplingConfig | None = None,
                 adapters=None) -> None:
        self.config = config or DexConfig()
        self.sampling = sampling or SamplingConfig()
        self.staged = model if isinstance(model, StagedModel) else StagedModel(model, adapters)
        self.exploration = self.config.exploration(self.staged.num_layers)
        self.lattice()  # validates width, policy and budget now rather than inside generate()

    def check_prompt(self, prompt_ids: list[int]) -> None:
        check_prompt(prompt_ids, self.staged.max_positions, self.staged.lm_head.weight.shape[0])

    def max_new_tokens_for(self, prompt_ids: list[int], max_new_tokens: int) -> int:
        """Generation never runs past the model's context."""
        return max(0, min(max_new_tokens, self.staged.max_positions - len(prompt_ids)))

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens: int = 64, executor=None) -> tuple[list[int], DecodeStats]:
        """Decode ``max_new_tokens`` (or up to an EOS). ``executor``: how the plan runs (default:
        a fresh single-process executor; the pipelined one runs this same loop across ranks)."""
        prompt_ids = [int(t) for t in (prompt_ids.flatten().tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
        self.check_prompt(prompt_ids)
        max_new = self.max_new_tokens_for(prompt_ids, max_new_tokens)
        t0 = time.perf_counter()
        if executor is None:
            executor = SingleProcessExecutor(self.staged, self.exploration, Sampler(self.sampling))
        output, lattice = decode_loop(executor, self.lattice(), prompt_ids, max_new, self.staged.eos_token_ids)
        return output, self.stats(lattice, time.perf_counter() - t0)

    def lattice(self) -> Lattice:
        c = self.config
        return Lattice(self.exploration.num_stages, c.width, c.decs, c.policy, c.max_branches)

    def stats(self, lattice: Lattice, wall_s: float) -> DecodeStats:
        s, n = lattice.stats, self.exploration.num_stages
        tpt = s.ticks / s.committed if s.committed else 0.0
        return DecodeStats(
            committed=s.committed, ticks=s.ticks, ticks_per_token=tpt,
            speedup_vs_ar=n / tpt if tpt else 0.0, accepted_by_exit=list(s.accepted_by_exit),
            fallbacks=s.fallbacks, stage_forwards=s.stage_forwards,
            stage_forwards_per_token=s.stage_forwards / s.committed if s.committed else 0.0,
            max_live_branches=s.max_live, wall_s=wall_s, exits=list(self.exploration.exits),
        )


def check_prompt(prompt_ids: list[int], max_positions: int, vocab_size: int) -> None:
    """Raise :class:`PromptError` for a prompt the model cannot decode."""
    if not prompt_ids:
        raise PromptError("the prompt is empty")
    if len(prompt_ids) >= max_positions:
        raise PromptError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {max_positions}")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise PromptError(f"token id {bad[0]} is outside the vocabulary (size {vocab_size})")


def decode_loop(executor, lattice: Lattice, prompt_ids: list[int], max_new_tokens: int,
                eos_token_ids: set[int]) -> tuple[list[int], Lattice]:
    """Run expand–commit–collapse until ``max_new_tokens`` or an EOS is committed."""
    output: list[int] = []
    if max_new_tokens <= 0:
        return output, lattice
    executor.prefill(prompt_ids[:-1])
    last = len(prompt_ids) - 1
    # Positions run to last + max_new_tokens; a branch there would only feed a token never committed.
    lattice.start(position=last, token=prompt_ids[-1], limit_position=last + max_new_tokens)
    while True:
        plan = lattice.plan()
        proposals, reference = executor.run_tick(plan)
        result = lattice.apply(proposals, reference)
        executor.apply(result)
        if result.committed_token is not None:
            output.append(result.committed_token)
            if result.committed_token in eos_token_ids or len(output) >= max_new_tokens:
                return output, lattice
