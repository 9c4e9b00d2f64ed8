"""The README.md model card of a shipped base model, rendered from its records.

Inputs are `training_summary.json` and `loss.csv` (written by the trainer) and
`depth_agreement.json` (written by `train/eval_base.py`), so every number in the card is
traceable to a file and a command.
"""

from __future__ import annotations

import json
from pathlib import Path

from .trainer import read_loss_log

__all__ = ["render_card", "write_card", "eval_command", "batch_schedule"]


def _fmt_int(n) -> str:
    return f"{int(n):,}"


def batch_schedule(rows: list[dict], context_length: int) -> list[tuple[int, int, int]]:
    """`(first_step, last_step, batch_size)` spans of a `loss.csv`, read from its token counts.

    A run resumed with another `batch_size` changes the tokens per step; the config only holds the
    last one, so the card states the schedule the run really had.
    """
    spans: list[tuple[int, int, int]] = []
    prev_tokens = 0
    for r in rows:
        step, tokens = int(r["step"]), int(r["tokens"])
        batch = (tokens - prev_tokens) // context_length
        prev_tokens = tokens
        if spans and spans[-1][2] == batch:
            spans[-1] = (spans[-1][0], step, batch)
        else:
            spans.append((step, step, batch))
    return spans


def render_card(name: str, summary: dict, ev: dict | None, table: str | None, commands: dict,
                schedule: list[tuple[int, int, int]] | None = None) -> str:
    cfg, data = summary["config"], summary["data"]
    ee = cfg.get("early_exit", False)
    lines = [
        f"# {name}",
        "",
        "The embedded default base model of `dex_adapt`: a small Qwen3-architecture Python code LM",
        "trained from scratch, offline, on CPU, so that a fresh clone runs the whole pipeline with no",
        "download. It is a *test-bed* model for depth-exploration decoding, not a useful code assistant.",
        "",
        "## Model",
        "",
        f"- `Qwen3ForCausalLM`: {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, "
        f"{cfg['num_heads']} query / {cfg['num_kv_heads']} KV heads of {cfg['head_dim']}, "
        f"SwiGLU {cfg['intermediate_size']}, tied embeddings, context {cfg['context_length']}, "
        f"RoPE theta {cfg['rope_theta']:g}",
        f"- {_fmt_int(summary['num_parameters'])} parameters, weights in bf16 safetensors",
        f"- tokenizer: byte-level BPE, vocab {data['vocab_size']}, `<|endoftext|>` (id 0) separates files "
        "and is BOS/EOS/PAD",
    ]
    if ee:
        lines.append(
            f"- early-exit (LayerSkip-style) training: {cfg['ee_layers_per_step']} sampled intermediate exits "
            f"per step through the final norm + shared head, weight rising with depth, total scale "
            f"{cfg['ee_loss_scale']:g}; layer dropout rising linearly to {cfg['layer_dropout_max']:g} at the last "
            "layer (which is never dropped)")
    lines += [
        "",
        "## Data",
        "",
        "The Python standard library of the training interpreter (`sysconfig.get_paths()['stdlib']`,",
        "site-packages excluded). Files under test packages (`test/`, `*/test/`, `tests/`, `idle_test/`)",
        "are held out; all other `.py` files are training data, in sorted order shuffled with the seed.",
        "",
        f"- stdlib root at training time: `{data['stdlib_root']}`",
        f"- training files: {data['train_files']}, {_fmt_int(data['train_tokens'])} tokens; "
        f"sha256 of the sorted file list: `{data['train_fingerprint_sha256']}`",
        f"- held-out files: {data['heldout_files']}, {_fmt_int(data['heldout_tokens'])} tokens; "
        f"sha256: `{data['heldout_fingerprint_sha256']}`",
        "",
        "## Training",
        "",
        f"- AdamW (betas {cfg['beta1']}, {cfg['beta2']}, weight decay {cfg['weight_decay']} on matrices), "
        f"peak LR {cfg['lr']:g}, {cfg['warmup_steps']} warmup steps then cosine decay to "
        f"{cfg['min_lr_ratio']:g}x, grad clip {cfg['grad_clip']}",
        f"- batch {cfg['batch_size']} x {cfg['context_length']} = {cfg['batch_size'] * cfg['context_length']} "
        f"tokens/step; " + (f"run bounded by {cfg['max_steps']} steps or a {cfg['time_budget_s']:g} s "
                            "wall-clock budget, whichever ends first (the cosine follows the one further along)"
                            if cfg.get("time_budget_s") else f"{cfg['max_steps']} steps planned"),
    ]
    if schedule and len(schedule) > 1:
        lines.append("- resumed with other batch sizes: " + ", ".join(
            f"steps {a}-{b} at batch {bs}" for a, b, bs in schedule))
    lines += [
        f"- {summary['steps']} steps, **{_fmt_int(summary['tokens_seen'])} tokens seen** "
        f"({summary['epochs']:.2f} epochs) in {summary['train_seconds']:g} s of compute",
        f"- **training throughput {summary['train_tokens_per_s']:g} tokens/s** (fp32, {cfg['threads']} torch "
        f"thread{'s' if cfg['threads'] > 1 else ''} on a 2-core machine shared with other jobs, so this is "
        "a lower bound)",
        f"- final train loss {summary['final_train_loss']:.3f}; held-out loss (fp32 weights, "
        f"{_fmt_int(summary['heldout_tokens_scored'])} tokens) {summary['heldout_loss_fp32']:.3f} "
        f"(perplexity {summary['heldout_ppl_fp32']:.2f})",
        "",
        "Loss curve: [`loss.csv`](loss.csv), ![loss curve](loss.png)",
        "",
    ]
    if ev is not None:
        s = ev["settings"]
        lines += [
            "## Evaluation (bf16 weights as shipped)",
            "",
            f"- **held-out perplexity {ev['heldout_ppl']:.2f}** over {_fmt_int(ev['heldout_tokens'])} tokens "
            f"({s['n_snippets']} snippets of {s['snippet_chars']} chars from held-out stdlib test files, "
            f"seed {s['seed']}, each truncated to the context); the training summary's held-out figure above "
            "is a different sample (the start of the shuffled held-out stream) scored in fp32",
            "",
            "### Per-layer agreement (logit lens)",
            "",
            "Fraction of positions where `lm_head(final_norm(h_d))` after d layers has the same top-1 token",
            "as the full model. HumanEval column: the positions that produced the model's own greedy",
            f"{s['new_tokens']}-token continuations of the first {s['n_humaneval']} HumanEval prompts.",
            "",
            table or "",
            "",
            "### Greedy completions",
            "",
            "Truncated at the first dedent to column 0; `parses` = `ast.parse(prompt + completion)` succeeds.",
            "",
        ]
        for c in ev["completions"]:
            # An empty body parses whenever the prompt does: say so rather than count it as code.
            empty = "; no body: the model's next line is back at column 0" if not c["completion"].strip() else ""
            lines += [f"**{c['task_id']}** (parses: {c['parses']}{empty})", "", "```python",
                      (c["prompt"] + c["completion"]).rstrip(), "```", ""]
        fib = next((c for c in ev["completions"] if c["task_id"] == "fibonacci"), None)
        if fib is not None and not fib["parses"]:
            lines += [f"**Limitation:** after {_fmt_int(summary['tokens_seen'])} training tokens the greedy "
                      "completion of `def fibonacci(n):` is not yet valid Python; the model has learnt "
                      "Python's surface statistics, not programs. Rerunning the training command with a larger "
                      "`time_budget_s`/`max_steps` continues from its last checkpoint (the cosine is "
                      "re-stretched to the new budget).", ""]
    lines += ["## Reproduce", "", "```bash"]
    for what, cmd in commands.items():
        lines += [f"# {what}", cmd]
    lines += ["```", ""]
    return "\n".join(lines)


def eval_command(model_dir: str | Path, settings: dict) -> str:
    """The `train/eval_base.py` command line that reproduces an evaluation with `settings`."""
    return (f"python train/eval_base.py --model-dir {model_dir} --snippets {settings['n_snippets']} "
            f"--snippet-chars {settings['snippet_chars']} --humaneval {settings['n_humaneval']} "
            f"--new-tokens {settings['new_tokens']} --seed {settings['seed']} --write-card")


def write_card(model_dir: str | Path, train_config: str | None = None) -> Path:
    """Render `model_dir/README.md` from the JSON records found in `model_dir`."""
    model_dir = Path(model_dir)
    summary = json.loads((model_dir / "training_summary.json").read_text())
    ev_path = model_dir / "depth_agreement.json"
    ev = json.loads(ev_path.read_text()) if ev_path.is_file() else None
    train_config = train_config or f"configs/pretrain/{model_dir.name}.yaml"
    commands = {
        "training, throughput, tokens seen, loss curve, fp32 held-out loss (rerun after a kill to resume)":
            f"python train/pretrain_base.py --config {train_config}",
    }
    if ev is not None:
        commands["held-out perplexity, agreement table, completions, this card"] = eval_command(
            model_dir, ev["settings"])
    table = (model_dir / "depth_agreement.md").read_text() if (model_dir / "depth_agreement.md").is_file() else None
    schedule = batch_schedule(read_loss_log(model_dir / "loss.csv"), summary["config"]["context_length"])
    path = model_dir / "README.md"
    path.write_text(render_card(model_dir.name, summary, ev, table, commands, schedule))
    return path
