"""Evaluation of a shipped base model: held-out perplexity, per-layer agreement, sample completions.

Everything here reads only the saved directory (as a user of the checkpoint would), never the
training state, so the numbers in the model card are those of the bf16 weights that ship.
"""

from __future__ import annotations

import ast
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer

from ..model_surgery import load_causal_lm
from ..depth_agreement import AgreementTally, agreement_table, greedy_continue, layer_agreement_counts, perplexity
from ..prompts import heldout_snippets, humaneval_prompts, truncate_completion

__all__ = ["EvalResult", "load_base", "evaluate", "FIB_PROMPT"]

FIB_PROMPT = "def fibonacci(n):"  # no newline: the model picks its own indentation token


@dataclass
class EvalResult:
    """What `evaluate` measured (JSON-serialisable via `asdict`)."""

    model_dir: str
    dtype: str
    num_layers: int
    heldout_snippets: int
    heldout_tokens: int
    heldout_ppl: float
    agreement: dict = field(default_factory=dict)  # source -> [rate per layer d=1..L]
    agreement_positions: dict = field(default_factory=dict)  # source -> positions counted
    completions: list = field(default_factory=list)  # [{task_id, prompt, completion, parses}]
    settings: dict = field(default_factory=dict)
    seconds: float = 0.0

    def table(self) -> str:
        return agreement_table(self.agreement, self.agreement_positions)

    def to_json(self) -> dict:
        return asdict(self)


def load_base(model_dir: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from a saved directory, offline."""
    model = load_causal_lm(str(model_dir), dtype=getattr(torch, dtype))  # checks the architecture
    return model, AutoTokenizer.from_pretrained(str(model_dir))


def _encode(tok, text: str, max_len: int, keep: str = "head") -> torch.Tensor:
    """[1, <=max_len] ids; `keep="tail"` keeps the end (a prompt's last tokens matter most)."""
    ids = tok(text, verbose=False)["input_ids"]
    ids = ids[:max_len] if keep == "head" else ids[-max_len:]
    return torch.tensor([ids], dtype=torch.long)


def complete(model, tok, prompt: str, max_new_tokens: int) -> tuple[str, bool]:
    """Greedy completion (truncated where the function ends) and whether prompt+completion parses."""
    max_new_tokens = min(max_new_tokens, model.config.max_position_embeddings // 2)
    ids = _encode(tok, prompt, model.config.max_position_embeddings - max_new_tokens, keep="tail")
    out = greedy_continue(model, ids, max_new_tokens, tok.eos_token_id)
    text = truncate_completion(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    try:
        ast.parse(prompt + text)
        parses = True
    except SyntaxError:
        parses = False
    return text, parses


def evaluate(model_dir: str | Path, *, n_snippets: int = 32, snippet_chars: int = 2048, n_humaneval: int = 32,
             new_tokens: int = 48, n_completions: int = 3, seed: int = 0, dtype: str = "float32",
             log=print) -> EvalResult:
    t0 = time.perf_counter()
    model, tok = load_base(model_dir, dtype)
    ctx = model.config.max_position_embeddings
    new_tokens = min(new_tokens, ctx // 2)
    L = model.config.num_hidden_layers

    seqs = [_encode(tok, s, ctx) for s in heldout_snippets(n_snippets, snippet_chars, seed)]
    ppl, n_tok = perplexity(model, seqs)
    log(f"held-out perplexity {ppl:.3f} over {n_tok} tokens ({n_snippets} snippets)")

    code = AgreementTally()
    for ids in seqs:
        code.add(*layer_agreement_counts(model, ids))

    # HumanEval: agreement on the positions that produced the model's own greedy continuation,
    # i.e. the exact tokens a decoder would be deciding.
    he = AgreementTally()
    for task in humaneval_prompts(n_humaneval):
        ids = _encode(tok, task["prompt"], ctx - new_tokens, keep="tail")
        full = greedy_continue(model, ids, new_tokens, tok.eos_token_id)
        T0 = ids.shape[1]
        if full.shape[1] > T0:
            # position t predicts token t+1: the continuation is predicted from positions T0-1 ..
            he.add(*layer_agreement_counts(model, full, slice(T0 - 1, full.shape[1] - 1)))
    log(f"agreement measured on {code.positions} held-out and {he.positions} HumanEval positions")

    completions = []
    for task in [{"task_id": "fibonacci", "prompt": FIB_PROMPT}, *humaneval_prompts(n_completions)]:
        text, ok = complete(model, tok, task["prompt"], 96)
        completions.append({**task, "completion": text, "parses": ok})
    log(f"fibonacci completion parses: {completions[0]['parses']}")

    return EvalResult(
        model_dir=str(model_dir), dtype=dtype, num_layers=L, heldout_snippets=n_snippets,
        heldout_tokens=n_tok, heldout_ppl=ppl,
        agreement={"held-out code": code.rates(), "HumanEval greedy": he.rates()},
        agreement_positions={"held-out code": code.positions, "HumanEval greedy": he.positions},
        completions=completions,
        settings={"n_snippets": n_snippets, "snippet_chars": snippet_chars, "n_humaneval": n_humaneval,
                  "new_tokens": new_tokens, "seed": seed},
        seconds=round(time.perf_counter() - t0, 1),
    )
