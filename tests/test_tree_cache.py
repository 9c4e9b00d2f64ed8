"""TreeCache: which slots each query may attend to, slot reuse, commit, growth (tree_cache.py)."""

from __future__ import annotations

import pytest
import torch

from dex_adapt.tree_cache import TreeCache

NEG = torch.finfo(torch.float32).min


def visible(mask: torch.Tensor) -> list[set[int]]:
    """Per query row, the set of key slots it may attend to; asserts the mask is exactly 0 / dtype-min."""
    assert mask.dim() == 4 and mask.shape[:2] == (1, 1)
    m = mask[0, 0]
    assert bool(((m == 0) | (m == NEG)).all())
    return [set(torch.nonzero(row == 0).flatten().tolist()) for row in m]


def tree(prefix: int = 4):
    """A committed prompt prefix at positions 0..prefix-1 (slots 0..prefix-1), then a small tree:

        anchor A (pos P) -> child B (pos P+1) -> grandchild D (pos P+2)
                         -> child C (pos P+1)
    """
    cache = TreeCache(num_layers=2, initial_slots=64)
    cache.commit_prefix(list(range(prefix)))
    P = prefix
    slots = cache.allocate([10, 11, 12, 13], [P, P + 1, P + 1, P + 2])  # A, B, C, D
    return cache, slots.tolist()


def test_commit_prefix_takes_slots_in_order_and_commits_them():
    cache = TreeCache(num_layers=2)
    slots = cache.commit_prefix([0, 1, 2])
    assert slots.tolist() == [0, 1, 2]
    assert cache.committed_slots == 3 and cache.live_slots == 0 and cache.high_water == 3
    assert cache.slot_position[:3].tolist() == [0, 1, 2]
    assert cache.get_seq_length() == 3


def test_causal_prefix_mask_is_lower_triangular_over_positions():
    cache = TreeCache(num_layers=1)
    slots = cache.commit_prefix(list(range(5)))
    pos = torch.arange(5)
    mask = cache.tree_mask(slots, [[] for _ in range(5)], pos, None, torch.float32, causal_prefix=True)
    assert mask.shape == (1, 1, 5, 5) and mask.dtype == torch.float32
    assert visible(mask) == [set(range(q + 1)) for q in range(5)]


def test_causal_prefix_with_window():
    cache = TreeCache(num_layers=1)
    slots = cache.commit_prefix(list(range(6)))
    mask = cache.tree_mask(slots, [[] for _ in range(6)], torch.arange(6), 3, torch.float32, causal_prefix=True)
    # q_pos - k_pos < 3 and k_pos <= q_pos
    assert visible(mask) == [{k for k in range(q + 1) if q - k < 3} for q in range(6)]


def test_branch_sees_committed_prefix_its_ancestors_and_itself():
    cache, (a, b, c, d) = tree(prefix=4)
    P = 4
    slots = torch.tensor([a, b, c, d])
    ancestors = [[], [a], [a], [b, a]]
    mask = cache.tree_mask(slots, ancestors, torch.tensor([P, P + 1, P + 1, P + 2]), None, torch.float32)
    committed = set(range(4))
    assert mask.shape == (1, 1, 4, 8)
    assert visible(mask) == [committed | {a}, committed | {a, b}, committed | {a, c}, committed | {a, b, d}]


def test_siblings_and_cousins_are_invisible():
    cache, (a, b, c, d) = tree()
    mask = cache.tree_mask(torch.tensor([c]), [[a]], torch.tensor([5]), None, torch.float32)
    assert b not in visible(mask)[0] and d not in visible(mask)[0]


def test_sliding_window_rule():
    """HF's rule: key k is visible from query q iff q_pos - k_pos < window (and otherwise visible)."""
    cache, (a, b, c, d) = tree(prefix=6)  # A at 6, B/C at 7, D at 8
    for window in (1, 2, 3, 5, 100):
        mask = cache.tree_mask(torch.tensor([d]), [[b, a]], torch.tensor([8]), window, torch.float32)
        allowed = {s for s in set(range(6)) | {a, b, d} if 8 - int(cache.slot_position[s]) < window}
        assert visible(mask) == [allowed], window
    # window 1: only itself
    mask = cache.tree_mask(torch.tensor([d]), [[b, a]], torch.tensor([8]), 1, torch.float32)
    assert visible(mask) == [{d}]


def test_mask_dtype_min_follows_dtype():
    cache, (a, *_rest) = tree()
    mask = cache.tree_mask(torch.tensor([a]), [[]], torch.tensor([4]), None, torch.bfloat16)
    assert mask.dtype == torch.bfloat16
    assert set(mask.flatten().tolist()) == {0.0, torch.finfo(torch.bfloat16).min}


def test_allocate_reuses_a_branch_slot():
    cache = TreeCache(num_layers=1)
    first = cache.allocate([7, 8], [0, 1]).tolist()
    again = cache.allocate([8, 7, 9], [1, 0, 2]).tolist()
    assert again == [first[1], first[0], 2]
    assert cache.live_slots == 3 and cache.high_water == 3


def test_released_slots_are_reused_and_invisible():
    cache, (a, b, c, d) = tree()
    hw = cache.high_water
    cache.release([12, 13])  # branch ids of C and D (not slot numbers)
    assert cache.live_slots == 2
    assert int(cache.slot_position[c]) == -1 and int(cache.slot_position[d]) == -1
    new = cache.allocate([20, 21], [5, 6]).tolist()
    assert set(new) == {c, d} and cache.high_water == hw  # reused, the pool did not grow
    assert cache.slot_position[new].tolist() == [5, 6]
    # Released-then-reused slots are not committed: only their new owners' descendants see them.
    mask = cache.tree_mask(torch.tensor([b]), [[a]], torch.tensor([5]), None, torch.float32)
    assert not set(new) & visible(mask)[0]
    cache.release([999])  # unknown ids are ignored
    assert cache.live_slots == 4


def test_commit_makes_a_slot_visible_to_all_later_queries():
    cache, (a, b, c, d) = tree()
    cache.commit(10)  # anchor A joins the prefix
    assert 10 not in cache.slot_of and bool(cache.committed[a]) and cache.committed_slots == 5
    # C (a former sibling subtree) now sees A without naming it as an ancestor.
    mask = cache.tree_mask(torch.tensor([c]), [[]], torch.tensor([5]), None, torch.float32)
    assert visible(mask) == [set(range(4)) | {a, c}]
    with pytest.raises(KeyError):
        cache.commit(10)


def kv(value: float, kv_heads: int = 2, n: int = 1, head_dim: int = 4) -> torch.Tensor:
    return torch.full((1, kv_heads, n, head_dim), value)


def test_update_writes_slots_and_returns_the_pool_up_to_high_water():
    cache = TreeCache(num_layers=2, initial_slots=8)
    slots = cache.allocate([0, 1], [0, 1])
    cache.set_write_slots(slots)
    k, v = cache.update(torch.cat([kv(1.0), kv(2.0)], dim=2), torch.cat([kv(-1.0), kv(-2.0)], dim=2), layer_idx=1)
    assert k.shape == (1, 2, 2, 4) and v.shape == (1, 2, 2, 4)
    assert k[0, :, 0].eq(1).all() and k[0, :, 1].eq(2).all() and v[0, :, 1].eq(-2).all()
    assert cache.keys[0] is None  # untouched layers hold nothing
    assert cache.keys[1].shape[2] == 8


def test_growth_preserves_stored_kv():
    cache = TreeCache(num_layers=3, initial_slots=2)
    written = {}
    for i in range(11):  # grows 2 -> 4 -> 8 -> 16
        slot = cache.allocate([i], [i])
        cache.set_write_slots(slot)
        for layer in (0, 2) if i % 3 else (0,):  # layer 2 misses some growths, then catches up lazily
            cache.update(kv(float(i + 10 * layer)), kv(-float(i + 10 * layer)), layer)
        written[i] = int(slot)
        cache.commit(i)
    assert cache.capacity == 16 and cache.high_water == 11
    assert cache.slot_position[:11].tolist() == list(range(11))
    assert cache.committed[:11].all() and not cache.committed[11:].any()
    k0 = cache.keys[0]
    assert k0.shape[2] == 16
    for i, slot in written.items():
        assert k0[0, :, slot].eq(i).all() and cache.values[0][0, :, slot].eq(-i).all()
        if i % 3:
            assert cache.keys[2][0, :, slot].eq(i + 20).all()
    assert cache.keys[1] is None
    # A layer written before a growth is padded when next used, keeping its entries.
    cache.allocate([100], [11])
    cache.set_write_slots(torch.tensor([11]))
    k, _ = cache.update(kv(99.0), kv(-99.0), 2)
    assert k.shape[2] == 12 and k[0, :, 11].eq(99).all() and k[0, :, 10].eq(30).all()


def test_mask_after_growth_spans_high_water():
    cache = TreeCache(num_layers=1, initial_slots=2)
    cache.commit_prefix(list(range(5)))
    slots = cache.allocate([0], [5])
    mask = cache.tree_mask(slots, [[]], torch.tensor([5]), None, torch.float32)
    assert mask.shape == (1, 1, 1, 6) and visible(mask) == [set(range(6))]
