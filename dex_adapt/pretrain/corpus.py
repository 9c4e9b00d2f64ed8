"""The pretraining corpus: the running interpreter's own Python standard library.

The stdlib is the one body of Python source that every machine with Python has, so the embedded
base model can be rebuilt offline anywhere. Its test packages are held out for evaluation; the
rest is training data. File order is sorted (deterministic across machines with the same Python),
and the list is fingerprinted so a model card can say exactly which files it was trained on.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StdlibSplit", "stdlib_root", "split_stdlib", "is_test_path", "read_source", "fingerprint"]

# Directory names whose contents are tests; any file below one of them is held out.
TEST_DIR_NAMES = frozenset({"test", "tests", "idle_test"})
# Never part of the corpus: third-party code and generated caches.
SKIP_DIR_NAMES = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> Path:
    """The running interpreter's stdlib directory (never a hard-coded path)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_test_path(rel: str) -> bool:
    """True when the stdlib-relative path `rel` lies in a test package (held out)."""
    parts = Path(rel).parts
    return any(p in TEST_DIR_NAMES for p in parts[:-1])


@dataclass(frozen=True)
class StdlibSplit:
    """Sorted stdlib-relative `.py` paths of one interpreter, split into train and held-out."""

    root: Path
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def train_fingerprint(self) -> str:
        return fingerprint(self.train)

    def heldout_fingerprint(self) -> str:
        return fingerprint(self.heldout)


def split_stdlib(root: Path | None = None) -> StdlibSplit:
    """Walk `root` (default: the stdlib) and split its `.py` files into train / held-out."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib directory not found: {root}")
    train: list[str] = []
    heldout: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIR_NAMES)
        for name in filenames:
            if not name.endswith(".py"):
                continue
            rel = Path(dirpath, name).relative_to(root).as_posix()
            (heldout if is_test_path(rel) else train).append(rel)
    return StdlibSplit(root=root, train=tuple(sorted(train)), heldout=tuple(sorted(heldout)))


def fingerprint(paths) -> str:
    """sha256 over the newline-joined relative paths (the file *list*, order included)."""
    return hashlib.sha256("\n".join(paths).encode()).hexdigest()


def read_source(root: Path, rel: str) -> str:
    """A file's text; undecodable bytes are replaced so odd encodings never stop a run."""
    return (Path(root) / rel).read_text(encoding="utf-8", errors="replace")


def shuffled(paths, seed: int) -> list[str]:
    """`paths` in a seeded pseudo-random order (sorted first, so the result is deterministic)."""
    out = sorted(paths)
    random.Random(seed).shuffle(out)
    return out
