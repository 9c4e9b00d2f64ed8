"""Tree KV cache: one KV slot per branch, shared by the committed prefix and all speculative paths.

Every branch owns one slot (the same index in every layer). A forward over a batch of branches
writes their keys/values into their slots and attends over the whole slot pool through a 4-D mask
that lets each branch see exactly the committed prefix, its own uncommitted ancestors and itself —
the same keys plain decoding of that path would see (RoPE is applied before caching, so slot order
does not matter). Collapse frees discarded slots for reuse and marks the old anchor's slot as
committed; the pool grows only with the committed prefix plus the live branches.

The HF attention modules only call ``cache.update(key, value, layer_idx, ...)``, so this object
plugs into unmodified decoder layers.
"""

from __future__ import annotations

import torch

__all__ = ["TreeCache"]


class TreeCache:
    """Slot-pooled KV for ``num_layers`` layers (only the layers a stage owns are ever touched)."""

    def __init__(self, num_layers: int, device: torch.device | str = "cpu", initial_slots: int = 64) -> None:
        self.num_layers = num_layers
        self.device = torch.device(device)
        self.capacity = initial_slots
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.slot_position = torch.full((initial_slots,), -1, dtype=torch.long, device=self.device)
        self.committed = torch.zeros(initial_slots, dtype=torch.bool, device=self.device)
        self.high_water = 0  # slots [0, high_water) have ever been used; attention spans these
        self.free: list[int] = []
        self.slot_of: dict[int, int] = {}  # branch id -> slot
        self._write_slots: torch.Tensor | None = None

    # ------------------------------------------------------------- slots
    def _grow(self, needed: int) -> None:
        new = self.capacity
        while new < needed:
            new *= 2
        if new == self.capacity:
            return
        pad = new - self.capacity
        self.slot_position = torch.cat([self.slot_position, self.slot_position.new_full((pad,), -1)])
        self.committed = torch.cat([self.committed, self.committed.new_zeros(pad)])
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                if t is not None:
                    store[i] = torch.cat([t, t.new_zeros(*t.shape[:2], pad, t.shape[3])], dim=2)
        self.capacity = new

    def allocate(self, branch_ids: list[int], positions: list[int]) -> torch.Tensor:
        """Slots for branches (reusing a branch's slot if it has one). Returns slot indices [B]."""
        slots = []
        for bid, pos in zip(branch_ids, positions):
            slot = self.slot_of.get(bid)
            if slot is None:
                if self.free:
                    slot = self.free.pop()
                else:
                    slot = self.high_water
                    self.high_water += 1
                    self._grow(self.high_water)
                self.slot_of[bid] = slot
                self.slot_position[slot] = pos
            slots.append(slot)
        return torch.tensor(slots, dtype=torch.long, device=self.device)

    def release(self, branch_ids) -> None:
        """Free the slots of discarded branches (ids without a slot are ignored: they never ran)."""
        for bid in branch_ids:
            slot = self.slot_of.pop(bid, None)
            if slot is not None:
                self.slot_position[slot] = -1
                self.free.append(slot)

    def commit(self, branch_id: int) -> None:
        """The branch's token joins the committed prefix: every later branch may attend to it."""
        slot = self.slot_of.pop(branch_id)
        self.committed[slot] = True

    def commit_prefix(self, positions: list[int]) -> torch.Tensor:
        """Slots for a prompt prefix processed in one causal forward; returned for writing."""
        ids = [-(i + 1) for i in range(len(positions))]  # private ids, committed right after
        slots = self.allocate(ids, positions)
        for bid in ids:
            self.commit(bid)
        return slots

    @property
    def live_slots(self) -> int:
        return len(self.slot_of)

    @property
    def committed_slots(self) -> int:
        return int(self.committed.sum())

    # ------------------------------------------------------------- masks
    def tree_mask(self, slots: torch.Tensor, ancestor_slots: list[list[int]], positions: torch.Tensor,
                  window: int | None, dtype: torch.dtype, causal_prefix: bool = False) -> torch.Tensor:
        """Additive mask [1, 1, B, S]: 0 where query b may attend slot s, dtype-min elsewhere.

        Query ``b`` sees committed slots, its ancestors' slots and its own slot; with
        ``causal_prefix`` (prompt prefill) it sees the committed slots at positions <= its own.
        ``window`` restricts to keys with ``q_pos - k_pos < window`` (HF's sliding-window rule).
        """
        S = self.high_water
        key_pos = self.slot_position[:S]
        visible = self.committed[:S].unsqueeze(0).expand(len(slots), S).clone()
        if causal_prefix:
            visible &= key_pos.unsqueeze(0) <= positions.unsqueeze(1)
        rows = torch.arange(len(slots), device=self.device)
        visible[rows, slots] = True
        for b, anc in enumerate(ancestor_slots):
            if anc:
                visible[b, anc] = True
        if window is not None:
            visible &= (positions.unsqueeze(1) - key_pos.unsqueeze(0)) < window
        mask = torch.zeros(visible.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return mask[None, None]

    # ------------------------------------------------------------- HF cache protocol
    def set_write_slots(self, slots: torch.Tensor) -> None:
        """Slots the next layer calls write into, one per query token (the batch is the T axis)."""
        self._write_slots = slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write [1, kv_heads, T, head_dim] into this tick's slots; return the pool up to high water."""
        if self.keys[layer_idx] is None:
            shape = (1, key_states.shape[1], self.capacity, key_states.shape[3])
            self.keys[layer_idx] = key_states.new_zeros(shape)
            self.values[layer_idx] = value_states.new_zeros(shape[:3] + (value_states.shape[3],))
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if k.shape[2] < self.capacity:  # grown since this layer last ran
            pad = self.capacity - k.shape[2]
            k = self.keys[layer_idx] = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], dim=2)
            v = self.values[layer_idx] = torch.cat([v, v.new_zeros(*v.shape[:2], pad, v.shape[3])], dim=2)
        k[:, :, self._write_slots] = key_states
        v[:, :, self._write_slots] = value_states
        S = self.high_water
        return k[:, :, :S], v[:, :, :S]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.committed_slots
