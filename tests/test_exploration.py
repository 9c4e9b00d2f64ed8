"""The exploration set: uniform splits, parsing, and every validation error (exploration.py)."""

from __future__ import annotations

import pytest

from dex_adapt.exploration import ExplorationError, ExplorationSet


@pytest.mark.parametrize("explorers,layers,exits", [
    (4, 16, (4, 8, 12, 16)),
    (8, 64, tuple(range(8, 65, 8))),
    (4, 10, (3, 6, 8, 10)),  # larger stages first
    (3, 4, (2, 3, 4)),
    (1, 7, (7,)),
    (5, 5, (1, 2, 3, 4, 5)),
    (1, 1, (1,)),
])
def test_uniform_examples(explorers, layers, exits):
    x = ExplorationSet.uniform(explorers, layers)
    assert x.exits == exits and x.num_layers == layers and x.num_stages == explorers


def test_uniform_is_valid_and_balanced_for_every_split():
    for layers in range(1, 41):
        for n in range(1, layers + 1):
            x = ExplorationSet.uniform(n, layers)
            sizes = [end - start for start, end in x.stages]
            assert len(sizes) == n and sum(sizes) == layers
            assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
            assert x.resolution == max(sizes) == -(-layers // n)


def test_stages_resolution_and_str():
    x = ExplorationSet((2, 3, 8), 8)
    assert x.stages == [(0, 2), (2, 3), (3, 8)]
    assert x.resolution == 5 and x.num_stages == 3
    assert str(x) == "2,3,8"
    assert ExplorationSet.parse(str(x), 8) == x


@pytest.mark.parametrize("text,exits", [
    ("4,8,12,16", (4, 8, 12, 16)),
    (" 4, 8 ,12 , 16 ", (4, 8, 12, 16)),
    ("16", (16,)),
    ("4,8,12,16,", (4, 8, 12, 16)),
    ("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", tuple(range(1, 17))),
])
def test_parse(text, exits):
    assert ExplorationSet.parse(text, 16).exits == exits


@pytest.mark.parametrize("text,match", [
    ("4,8,x,16", "comma-separated integers"),
    ("4.0,16", "comma-separated integers"),
    ("4;16", "comma-separated integers"),
    ("", "empty"),
    (" , ", "empty"),
    ("0,16", "out of range"),
    ("-4,16", "out of range"),
    ("4,17", "out of range"),
    ("8,4,16", "strictly increasing"),
    ("4,4,16", "strictly increasing"),
    ("4,8,12", "last exit must be the final depth 16"),
])
def test_parse_errors(text, match):
    with pytest.raises(ExplorationError, match=match) as e:
        ExplorationSet.parse(text, 16)
    assert "\n" not in str(e.value)


def test_constructor_errors():
    with pytest.raises(ExplorationError, match="at least 1"):
        ExplorationSet((1,), 0)
    with pytest.raises(ExplorationError, match="empty"):
        ExplorationSet((), 4)
    with pytest.raises(ExplorationError, match="out of range: depths run from 1 to 4"):
        ExplorationSet((2, 5), 4)
    with pytest.raises(ExplorationError, match="strictly increasing"):
        ExplorationSet((3, 2, 4), 4)
    with pytest.raises(ExplorationError, match="final depth 4"):
        ExplorationSet((1, 2), 4)


@pytest.mark.parametrize("explorers", [0, -1, 5, 100])
def test_uniform_errors(explorers):
    with pytest.raises(ExplorationError, match=r"--explorers must be between 1 and the number of layers \(4\)"):
        ExplorationSet.uniform(explorers, 4)


def test_exploration_error_is_a_value_error():
    # The CLI turns ValueErrors into one-line exit-2 errors.
    assert issubclass(ExplorationError, ValueError)


def test_frozen_and_hashable():
    x = ExplorationSet((2, 4), 4)
    assert x == ExplorationSet.uniform(2, 4) and hash(x) == hash(ExplorationSet((2, 4), 4))
    with pytest.raises(AttributeError):
        x.exits = (4,)
