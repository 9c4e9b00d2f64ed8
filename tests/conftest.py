"""Shared test fixtures. Tiny-model factories live in ``tiny_models.py``."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls gain nothing from threads, and the test machine is shared: use one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _single_torch_thread_everywhere():
    """Every test: with 2 shared cores, intra-op threads make tiny forwards ~10x slower (measured)."""
    torch.set_num_threads(1)
    yield
