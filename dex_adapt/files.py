"""File modes of what the toolkit writes: outputs are ordinary files, readable as the umask allows."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ordinary_mode", "restore_ordinary_modes"]


def ordinary_mode() -> int:
    """The mode `open(path, "w")` gives a new file under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def restore_ordinary_modes(directory: str | Path) -> None:
    """Give the `*.safetensors` files in `directory` the mode of any other file written there.

    safetensors >= 0.8 writes through a temporary file created 0600 and renames it into place
    (safetensors issue #782), so saved weights would be unreadable to other users and containers.
    """
    mode = ordinary_mode()
    for path in Path(directory).glob("*.safetensors"):
        os.chmod(path, mode)
