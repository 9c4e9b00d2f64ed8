"""The exploration set: which depths have an exit, and the stages they cut the layers into.

DESIGN.md §2: ``X = {d_0 < d_1 < ... < d_{N-1} = L}``; stage ``i`` runs layers ``[d_{i-1}, d_i)``
with ``d_{-1} = 0``. Exit ``i < N-1`` proposes candidates; exit ``N-1`` is the model's own head
(the reference). This module is pure: no torch, no HF.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExplorationSet", "ExplorationError"]


class ExplorationError(ValueError):
    """An exploration set that cannot be used with the model (the message is user-facing)."""


@dataclass(frozen=True)
class ExplorationSet:
    """Exit depths ``d_0 < ... < d_{N-1} = num_layers``."""

    exits: tuple[int, ...]
    num_layers: int

    def __post_init__(self) -> None:
        L = self.num_layers
        if L < 1:
            raise ExplorationError(f"the model has {L} decoder layers; need at least 1")
        if not self.exits:
            raise ExplorationError("the exploration set is empty; give at least the final depth")
        for d in self.exits:
            if not 1 <= d <= L:
                raise ExplorationError(f"exit depth {d} is out of range: depths run from 1 to {L}")
        if any(b <= a for a, b in zip(self.exits, self.exits[1:])):
            raise ExplorationError(f"exit depths must be strictly increasing, got {list(self.exits)}")
        if self.exits[-1] != L:
            raise ExplorationError(
                f"the last exit must be the final depth {L} (the reference), got {self.exits[-1]}"
            )

    @classmethod
    def uniform(cls, explorers: int, num_layers: int) -> ExplorationSet:
        """Split ``num_layers`` into ``explorers`` stages as evenly as possible (larger stages first)."""
        if not 1 <= explorers <= num_layers:
            raise ExplorationError(
                f"--explorers must be between 1 and the number of layers ({num_layers}), got {explorers}"
            )
        base, extra = divmod(num_layers, explorers)
        exits, depth = [], 0
        for i in range(explorers):
            depth += base + (1 if i < extra else 0)
            exits.append(depth)
        return cls(tuple(exits), num_layers)

    @classmethod
    def parse(cls, text: str, num_layers: int) -> ExplorationSet:
        """Parse ``"4,8,12,16"``; a missing final depth is an error, not silently appended."""
        try:
            exits = tuple(int(t) for t in text.split(",") if t.strip())
        except ValueError:
            raise ExplorationError(f"--exits must be comma-separated integers, got {text!r}") from None
        return cls(exits, num_layers)

    @property
    def num_stages(self) -> int:
        return len(self.exits)

    @property
    def stages(self) -> list[tuple[int, int]]:
        """Half-open layer ranges ``[start, end)`` of each stage."""
        starts = (0, *self.exits[:-1])
        return list(zip(starts, self.exits))

    @property
    def resolution(self) -> int:
        """The largest stage size (DESIGN.md §2)."""
        return max(end - start for start, end in self.stages)

    def __str__(self) -> str:
        return ",".join(map(str, self.exits))
