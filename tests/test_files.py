"""Output file modes: saved weights get the umask's mode, like every other file we write."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from dex_adapt.files import ordinary_mode, restore_ordinary_modes


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_safetensors_get_the_mode_an_ordinary_file_gets(tmp_path, umask):
    old = os.umask(umask)
    try:
        save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
        (tmp_path / "config.json").write_text("{}")
        restore_ordinary_modes(tmp_path)
        assert ordinary_mode() == 0o666 & ~umask
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"model.safetensors": 0o666 & ~umask, "config.json": 0o666 & ~umask}
