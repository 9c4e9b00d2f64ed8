"""What every command-line entry point shares: one-line errors, exit codes, atomic outputs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..files import ordinary_mode

__all__ = ["CliError", "OneLineParser", "positive_int", "default_model_path", "write_json_atomic",
           "run_with_clean_errors"]

#: Exit status for bad input (argparse uses the same).
USAGE_ERROR = 2


class CliError(Exception):
    """Bad input: reported as one line on stderr with exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: ...``) and exit status 2."""

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")

    @classmethod
    def from_doc(cls, prog: str, doc: str) -> "OneLineParser":
        """A parser whose description is the docstring's first paragraph and whose epilog (shown
        as written) is the rest: the entry point's docstring is its ``--help``."""
        summary, rest = doc.split("\n\n", 1)
        return cls(prog=prog, description=summary, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=rest)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def default_model_path() -> Path:
    """The shipped default model, next to the package in a source checkout."""
    return Path(__file__).resolve().parents[2] / "checkpoints" / "dexcoder-16l"


def write_json_atomic(path: str, obj) -> None:
    """Write JSON through a temporary file and a rename, so a failure never leaves half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, ordinary_mode())  # mkstemp makes 0600; the result should be an ordinary file
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run_with_clean_errors(prog: str, fn) -> int:
    """Run ``fn``; bad input (CliError, missing or unreadable files, invalid values) becomes one
    line + exit 2."""
    try:
        return fn()
    except (CliError, OSError, ValueError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def quiet_libraries() -> None:
    """Keep stderr for our own messages: no weight-loading bars, no DeepSpeed accelerator probe.

    accelerate imports DeepSpeed, which logs a warning when it probes for a GPU on a CPU machine;
    naming the accelerator up front skips the probe.
    """
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
