"""The resumable CPU pretraining loop and the export of the shipped checkpoint.

State lives in `work_dir/state.pt` (model + optimizer + step + RNG states + counters), written
atomically every `checkpoint_every` steps; rerunning the same command resumes from it, and because
batches are a pure function of the step (see `data.batch_for_step`) a resumed run sees the same
data a straight run would. `loss.csv` in the work dir is truncated back to the resumed step.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import random
import shutil
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..files import restore_ordinary_modes
from .config import PretrainConfig, to_dict
from .data import PreparedData, batch_for_step, prepare_data
from .model import build_model, early_exit_loss, generation_config, lm_loss

__all__ = ["lr_at", "train", "heldout_loss"]

CSV_FIELDS = ["step", "tokens", "loss", "lr", "tokens_per_s"]


def progress(step: int, elapsed_s: float, cfg: PretrainConfig) -> float:
    """Fraction of the run done: steps or wall-clock budget, whichever is further along."""
    p = step / cfg.max_steps
    if cfg.time_budget_s > 0:
        p = max(p, elapsed_s / cfg.time_budget_s)
    return min(1.0, p)


def lr_at(step: int, cfg: PretrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warmup (in steps) to `lr`, then cosine decay to `lr * min_lr_ratio` at progress 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p0 = cfg.warmup_steps / cfg.max_steps
    frac = min(1.0, max(0.0, (progress(step, elapsed_s, cfg) - p0) / max(1e-9, 1 - p0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def _optimizer(model, cfg: PretrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
    )


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, *, context_length: int, max_tokens: int,
                 batch_size: int = 4) -> tuple[float, int]:
    """Mean next-token CE over the first `max_tokens` of `stream` in non-overlapping windows."""
    model.eval()
    n = min(stream.numel(), max_tokens) // context_length
    if n == 0:
        raise ValueError("held-out stream shorter than one context window")
    windows = stream[: n * context_length].view(n, context_length)
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        ids = windows[i:i + batch_size]
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        k = ids.numel() - ids.shape[0]  # predicted positions
        total += loss.item() * k
        count += k
    model.train()
    return total / count, count


def _save_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write never leaves a half checkpoint


def read_loss_log(path: Path, upto_step: int | None = None) -> list[dict]:
    """Rows of a `loss.csv` (all, or up to `upto_step`); none when there is no file."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if upto_step is None or int(r["step"]) <= upto_step]


def _write_log(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(rows)


def plot_loss(rows: list[dict], png: Path, title: str, heldout: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    toks = [int(r["tokens"]) / 1e6 for r in rows]
    losses = [float(r["loss"]) for r in rows]
    ax.plot(toks, losses, lw=0.6, alpha=0.4, label="train loss (per step)")
    # Batches of 1-2 files make per-step loss noisy; an EMA shows the trend.
    ema, smooth = losses[0] if losses else 0.0, []
    for x in losses:
        ema = 0.95 * ema + 0.05 * x
        smooth.append(ema)
    ax.plot(toks, smooth, lw=1.5, color="C0", label="train loss (EMA 0.95)")
    if heldout is not None and toks:
        ax.axhline(heldout, color="C1", ls="--", label=f"held-out loss {heldout:.3f}")
    ax.set_xlabel("training tokens seen (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def train(cfg: PretrainConfig, log=print) -> dict:
    """Run (or resume, or just re-export) the run described by `cfg`; returns the summary."""
    torch.set_num_threads(cfg.threads)
    work = Path(cfg.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    data = prepare_data(work, seed=cfg.seed, vocab_size=cfg.vocab_size, context_length=cfg.context_length,
                        max_train_files=cfg.max_train_files, max_heldout_files=cfg.max_heldout_files, log=log)
    eos = data.tokenizer.eos_token_id
    model = build_model(cfg, len(data.tokenizer), eos)
    opt = _optimizer(model, cfg)
    ee_gen = torch.Generator().manual_seed(cfg.seed + 1)

    state_path = work / "state.pt"
    step, train_seconds, elapsed = 0, 0.0, 0.0
    if state_path.is_file():
        st = torch.load(state_path, map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, train_seconds, elapsed = st["step"], st["train_seconds"], st.get("elapsed_s", 0.0)
        torch.set_rng_state(st["torch_rng"])
        random.setstate(st["python_rng"])
        ee_gen.set_state(st["ee_rng"])
        log(f"resumed from {state_path} at step {step}")
    rows = read_loss_log(work / "loss.csv", step)
    # Tokens are counted, not derived from the step: a run resumed with another batch_size stays right.
    tokens_seen = int(rows[-1]["tokens"]) if rows else step * cfg.tokens_per_step

    def checkpoint() -> None:
        _save_state(state_path, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "train_seconds": train_seconds, "elapsed_s": elapsed, "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "ee_rng": ee_gen.get_state(),
        })
        _write_log(work / "loss.csv", rows)

    model.train()
    bar = tqdm(total=cfg.max_steps, initial=step, desc="pretrain", unit="step", dynamic_ncols=True)
    t_mark = time.perf_counter()
    while progress(step, elapsed, cfg) < 1.0:
        ids = batch_for_step(data.train, step, batch_size=cfg.batch_size,
                             context_length=cfg.context_length, seed=cfg.seed)
        lr = lr_at(step, cfg, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        if cfg.early_exit:
            loss, final = early_exit_loss(model, ids, layers_per_step=cfg.ee_layers_per_step,
                                          ee_scale=cfg.ee_loss_scale, p_max=cfg.layer_dropout_max,
                                          generator=ee_gen)
        else:
            loss = lm_loss(model, ids)
            final = loss.detach()
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        train_seconds += dt
        now = time.perf_counter()
        elapsed += now - t_mark
        t_mark = now
        step += 1
        tokens_seen += cfg.tokens_per_step
        tps = cfg.tokens_per_step / dt
        rows.append({"step": step, "tokens": tokens_seen, "loss": f"{final.item():.5f}",
                     "lr": f"{lr:.3e}", "tokens_per_s": f"{tps:.1f}"})
        bar.update(1)
        bar.set_postfix(loss=f"{final.item():.3f}", tok_s=f"{tps:.0f}", lr=f"{lr:.1e}")
        if step % cfg.checkpoint_every == 0 or progress(step, elapsed, cfg) >= 1.0:
            checkpoint()
            log(f"step {step}: loss {final.item():.4f}, {tokens_seen / train_seconds:.0f} tokens/s "
                f"(mean), checkpoint -> {state_path}")
    bar.close()
    return export(cfg, model, data, rows, step, train_seconds, log=log)


def export(cfg: PretrainConfig, model, data: PreparedData, rows: list[dict], steps: int,
           train_seconds: float, log=print) -> dict:
    """Score held-out loss, then write the shipped bf16 checkpoint + tokenizer + curve + summary.

    Everything is written to a sibling temporary directory that then replaces `out_dir` whole: a
    kill mid-export never leaves a mixed directory, and an evaluation card of older weights
    (`train/eval_base.py --write-card`) does not survive next to new ones.
    """
    out = Path(cfg.out_dir)
    target = out.resolve()
    loss, n_scored = heldout_loss(model, data.heldout, context_length=cfg.context_length,
                                  max_tokens=cfg.eval_tokens)
    staging = target.with_name(f".{target.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        summary = _write_export(cfg, model, data, rows, steps, train_seconds, loss, n_scored, staging, target.name)
        _replace_dir(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"exported {out}: held-out loss {loss:.4f} (ppl {math.exp(loss):.2f}) on {n_scored} tokens")
    return summary


def _replace_dir(new: Path, target: Path) -> None:
    """Put directory `new` at `target`, moving any old `target` out of the way first."""
    old = target.with_name(f".{target.name}.replaced")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _write_export(cfg: PretrainConfig, model, data: PreparedData, rows: list[dict], steps: int,
                  train_seconds: float, loss: float, n_scored: int, out: Path, name: str) -> dict:
    eos = data.tokenizer.eos_token_id
    shipped = copy.deepcopy(model).to(torch.bfloat16)
    shipped.generation_config = generation_config(eos)
    shipped.save_pretrained(str(out))
    restore_ordinary_modes(out)
    data.tokenizer.save_pretrained(str(out))
    _write_log(out / "loss.csv", rows)
    plot_loss(rows, out / "loss.png", title=f"{name}: pretraining loss", heldout=loss)
    tokens_seen = int(rows[-1]["tokens"]) if rows else steps * cfg.tokens_per_step
    summary = {
        "config": to_dict(cfg),
        "data": data.meta,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps,
        "tokens_seen": tokens_seen,
        "epochs": tokens_seen / max(1, data.meta["train_tokens"]),
        "train_seconds": round(train_seconds, 1),
        "train_tokens_per_s": round(tokens_seen / train_seconds, 1) if train_seconds else None,
        "final_train_loss": float(rows[-1]["loss"]) if rows else None,
        "heldout_loss_fp32": loss,
        "heldout_ppl_fp32": math.exp(loss),
        "heldout_tokens_scored": n_scored,
        "torch": torch.__version__,
    }
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
