"""The training loop: frozen base + inducing adapters under accelerate (plain, DDP or DeepSpeed).

Determinism, so that a resumed run ends with the same adapter weights as an uninterrupted one:
the block order of optimizer step `s` is a pure function of `(seed, epoch)`, the exits sampled at
step `s` a pure function of `(seed, s)`, and `save_state`/`load_state` restore the adapter
weights, optimizer, LR schedule and the step counter. The frozen base is never written: DeepSpeed
saves with `exclude_frozen_parameters`, the plain path drops frozen entries in a save hook.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import time
from dataclasses import dataclass

import torch

from .config import DistillConfig, to_dict
from .metrics import ExitMeter, format_table
from .objective import DistillObjective

__all__ = ["train", "Progress"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Progress:
    """Optimizer steps done; saved with the accelerate state."""

    step: int = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def _trackers(report_to: str) -> list[str] | None:
    names = [n.strip() for n in report_to.split(",") if n.strip() and n.strip() != "none"]
    return names or None


def _is_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _zero_stage(accelerator) -> int:
    if not _is_deepspeed(accelerator):
        return 0
    return int(accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


def _process_group_kwargs() -> list:
    """DeepSpeed ranks on CPU-only machines need the gloo backend named explicitly.

    accelerate's PartialState only finds a backend for a device (nccl, xccl, ...); on a CPU-only
    machine under `accelerate launch` with a DeepSpeed config it would initialise DeepSpeed's
    process group and then report a single process. Naming gloo makes it a 2-rank (N-rank) run
    over DeepSpeed's CPU accelerator, the same code path as on GPUs.
    """
    from accelerate.utils import InitProcessGroupKwargs

    launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if launched and deepspeed and not torch.cuda.is_available():
        return [InitProcessGroupKwargs(backend="gloo")]
    return []


def build_model(cfg: DistillConfig):
    """Frozen base (+ tokenizer) with inducing adapters injected through PEFT's `get_peft_model`."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dex_adapt.adapters import InducingConfig

    # Under a ZeRO-3 accelerate config with zero3_init, from_pretrained partitions as it loads.
    base = AutoModelForCausalLM.from_pretrained(cfg.model.path, revision=cfg.model.revision,
                                                dtype=_DTYPES[cfg.model.dtype])
    base.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, revision=cfg.model.revision)
    adapter_config = InducingConfig(
        kind=cfg.adapter.kind, bottleneck_size=cfg.adapter.bottleneck_size, activation=cfg.adapter.activation,
        exit_depths=cfg.adapter.exit_depths, revision=cfg.model.revision,
    )
    torch.manual_seed(cfg.train.seed)  # adapter init
    peft_model = get_peft_model(base, adapter_config)
    return peft_model, tokenizer


def _lr_lambda(cfg: DistillConfig):
    t = cfg.train

    def factor(step: int) -> float:
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _sample_depths(all_depths: list[int], k: int, seed: int, step: int) -> list[int]:
    if not k or k >= len(all_depths):
        return list(all_depths)
    return sorted(random.Random(seed * 1_000_003 + step).sample(all_depths, k))


class _Blocks:
    """Token blocks `[N, T]` served as the micro-batch for (global micro-step, rank)."""

    def __init__(self, blocks: torch.Tensor, micro_batch: int, world: int, rank: int, seed: int) -> None:
        self.blocks, self.mb, self.world, self.rank, self.seed = blocks, micro_batch, world, rank, seed
        self.per_epoch = max(1, len(blocks) // (micro_batch * world))
        self._epoch, self._order = -1, None

    def batch(self, micro_step: int) -> torch.Tensor:
        epoch, i = divmod(micro_step, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.blocks), generator=g)
        start = (i * self.world + self.rank) * self.mb
        idx = self._order[start:start + self.mb]
        if len(idx) < self.mb:  # fewer blocks than one global batch: wrap around
            idx = torch.cat([idx, self._order[: self.mb - len(idx)]])
        return self.blocks[idx]


def _latest_state(state_dir: str) -> str | None:
    if not os.path.isdir(state_dir):
        return None
    steps = [int(m.group(1)) for n in os.listdir(state_dir) if (m := re.fullmatch(r"step-(\d+)", n))]
    return os.path.join(state_dir, f"step-{max(steps)}") if steps else None


def _adapter_state_dict(accelerator, peft_model) -> dict[str, torch.Tensor]:
    """Full adapter weights on the main process (gathered from ZeRO-3 partitions; collective)."""
    from dex_adapt.adapters.model import _gathered

    out = {}
    for name, p in peft_model.named_parameters():
        if ".inducing_adapter." not in name:
            continue
        with _gathered(p):
            if accelerator.is_main_process:
                out[name] = p.detach().to("cpu", torch.float32).clone()
    return out


def _save_state(accelerator, path: str) -> None:
    if _is_deepspeed(accelerator):
        accelerator.save_state(path, exclude_frozen_parameters=True)
    else:
        accelerator.save_state(path)


def _drop_frozen_weights(models, weights, output_dir) -> None:
    """save_state hook (non-DeepSpeed): keep only trainable entries; the frozen base is never written."""
    for model, state in zip(models, weights):
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        for key in [k for k in state if k not in trainable]:
            del state[key]


def _batches_for_eval(blocks: torch.Tensor, micro_batch: int):
    for i in range(0, len(blocks), micro_batch):
        yield blocks[i:i + micro_batch]


def evaluate(accelerator, objective, blocks: torch.Tensor, micro_batch: int, depths: list[int]):
    """(lens, adapter) per-depth metrics on held-out blocks; every rank runs every block in step."""
    lens, adapter = ExitMeter(), ExitMeter()
    was_training = objective.training
    objective.eval()
    with torch.no_grad():
        for ids in _batches_for_eval(blocks, micro_batch):
            out = objective(ids.to(accelerator.device), depths, with_lens=True)
            adapter.add_rows(depths, out["stats"])
            lens.add_rows(depths, out["lens_stats"])
    objective.train(was_training)
    return lens.reduced(None, depths), adapter.reduced(None, depths)


def _time_forward(model, ids: torch.Tensor, repeats: int = 3) -> float:
    """Seconds per no-grad forward of the base on `ids` (the unit of the training-cost figure)."""
    with torch.no_grad():
        model(input_ids=ids, output_hidden_states=True, use_cache=False)  # warm-up
        start = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=ids, output_hidden_states=True, use_cache=False)
    return (time.perf_counter() - start) / repeats


def train(cfg: DistillConfig, command: str = "") -> dict | None:
    """Run (or resume) one distillation; returns the metrics dict on the main process."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    from dex_adapt.adapters.model import base_fingerprint

    from . import data as data_mod

    t = cfg.train
    if t.threads:
        torch.set_num_threads(t.threads)
    accelerator = Accelerator(gradient_accumulation_steps=t.grad_accum, log_with=_trackers(t.report_to),
                              project_dir=cfg.logging_dir, step_scheduler_with_optimizer=False,
                              kwargs_handlers=_process_group_kwargs())
    set_seed(t.seed)
    if _is_deepspeed(accelerator):
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        # Data is built after prepare (ZeRO-3 generation needs the engine), so batch sizes are set here.
        ds["train_micro_batch_size_per_gpu"] = t.micro_batch_size
        ds["train_batch_size"] = t.micro_batch_size * t.grad_accum * accelerator.num_processes
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = t.grad_clip
    peft_model, tokenizer = build_model(cfg)
    fingerprint = base_fingerprint(peft_model)
    sharded = any(hasattr(p, "ds_id") for p in peft_model.parameters())
    accelerator.print(f"base {cfg.model.path}: {fingerprint}; exits {peft_model.peft_config['default'].exit_depths}; "
                      f"{sum(p.numel() for p in peft_model.parameters() if p.requires_grad)} adapter parameters"
                      + ("; frozen base partitioned at load (ZeRO-3 zero3_init)" if sharded else ""))
    objective = DistillObjective(peft_model, t.temperature)
    all_depths = objective.depths
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))
    objective, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if not _is_deepspeed(accelerator):
        accelerator.register_save_state_pre_hook(_drop_frozen_weights)

    # ---- data (after prepare: under ZeRO-3 only the engine can run the sharded base) ----
    base_for_generation = accelerator.unwrap_model(objective).peft_model.get_base_model()
    parts = [data_mod.corpus_blocks(cfg.data, tokenizer, "train", accelerator)]
    generated = data_mod.continuation_blocks(cfg.data, tokenizer, base_for_generation, fingerprint, accelerator,
                                             synced_generate=_zero_stage(accelerator) == 3)
    if generated is not None and len(generated):
        parts.append(generated)
    train_blocks = torch.cat([torch.tensor(p["input_ids"], dtype=torch.long) for p in parts])
    eval_blocks = torch.tensor(data_mod.corpus_blocks(cfg.data, tokenizer, "eval", accelerator)["input_ids"],
                               dtype=torch.long)
    blocks = _Blocks(train_blocks, t.micro_batch_size, accelerator.num_processes, accelerator.process_index, t.seed)

    if t.resume:
        latest = _latest_state(cfg.state_dir)
        if latest is None:
            raise FileNotFoundError(f"train.resume is set but there is no saved state in {cfg.state_dir}")
        if _is_deepspeed(accelerator):
            accelerator.load_state(latest, load_module_strict=False)
        else:
            accelerator.load_state(latest, strict=False)  # the state holds adapter weights only
        accelerator.print(f"resumed from {latest} at step {progress.step}")

    accelerator.init_trackers("distill", config=_flat(to_dict(cfg)))
    end = min(t.steps, t.stop_after) if t.stop_after else t.steps
    meter = ExitMeter()
    step_times: list[float] = []
    bar = tqdm(total=end, initial=progress.step, desc="distill", disable=not accelerator.is_local_main_process)
    objective.train()
    last_loss = float("nan")
    loss_history: list[list[float]] = []  # [step, loss] at each log point of this run
    while progress.step < end:
        step = progress.step
        depths = _sample_depths(all_depths, t.exits_per_step, t.seed, step)
        start = time.perf_counter()
        for micro in range(t.grad_accum):
            ids = blocks.batch(step * t.grad_accum + micro).to(accelerator.device)
            with accelerator.accumulate(objective):
                out = objective(ids, depths)
                accelerator.backward(out["loss"])
                if accelerator.sync_gradients and t.grad_clip and not _is_deepspeed(accelerator):
                    accelerator.clip_grad_norm_(params, t.grad_clip)
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad()
            meter.add_rows(depths, out["stats"])
        step_times.append(time.perf_counter() - start)
        last_loss = out["loss"].item()
        progress.step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{last_loss:.4f}")
        if progress.step % t.log_every == 0 or progress.step == end:
            stats = meter.reduced(accelerator, all_depths)
            window = [r["kl"] for r in stats.values() if r["tokens"]]
            window_loss = sum(window) / len(window)  # mean KL over exits and positions since the last log
            log = {"train/loss": window_loss, "train/lr": scheduler.get_last_lr()[0]}
            loss_history.append([progress.step, window_loss])
            for d, row in stats.items():
                if row["tokens"]:
                    log[f"train/kl/depth_{d:02d}"] = row["kl"]
                    log[f"train/agree/depth_{d:02d}"] = row["agree"]
            accelerator.log(log, step=progress.step)
            meter.reset()
        if t.eval_every and progress.step % t.eval_every == 0 and progress.step < end:
            _, adapter_stats = evaluate(accelerator, objective, eval_blocks, t.micro_batch_size, all_depths)
            accelerator.log({f"eval/agree/depth_{d:02d}": r["agree"] for d, r in adapter_stats.items()},
                            step=progress.step)
        if (t.save_every and progress.step % t.save_every == 0) or progress.step == t.stop_after:
            _save_state(accelerator, os.path.join(cfg.state_dir, f"step-{progress.step}"))
    bar.close()

    if t.stop_after and progress.step < t.steps:
        accelerator.print(f"stopped at step {progress.step} of {t.steps}; resume with train.resume=true")
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return None

    # ---- final: held-out table, training cost, adapter checkpoint (+ card, + push) ----
    lens, adapter = evaluate(accelerator, objective, eval_blocks, t.micro_batch_size, all_depths)
    unwrapped = accelerator.unwrap_model(objective).peft_model
    probe = blocks.batch(0).to(accelerator.device)
    forward_s = _time_forward(unwrapped, probe)  # every rank at once: ZeRO-3 forwards are collective
    timed = step_times[min(2, len(step_times) - 1):] if step_times else []
    step_s = sum(timed) / len(timed) / t.grad_accum if timed else float("nan")
    adapter_weights = _adapter_state_dict(accelerator, unwrapped)
    accelerator.log({f"eval/agree/depth_{d:02d}": r["agree"] for d, r in adapter.items()}, step=progress.step)
    metrics = None
    if accelerator.is_main_process:
        metrics = {
            "base_model": cfg.model.path,
            "base_fingerprint": fingerprint,
            "command": command,
            "distributed": {"type": str(accelerator.distributed_type), "processes": accelerator.num_processes},
            "train": {
                "steps": progress.step, "final_loss": last_loss, "loss_history": loss_history,
                "train_blocks": len(train_blocks),
                "tokens_per_step": t.micro_batch_size * t.grad_accum * accelerator.num_processes * cfg.data.seq_len,
                "seconds_per_micro_step": step_s, "seconds_per_base_forward": forward_s,
                "step_over_forward": step_s / forward_s if forward_s == forward_s and forward_s > 0 else None,
            },
            "eval": {
                "sources": cfg.data.eval_sources, "blocks": len(eval_blocks),
                "tokens": next(iter(adapter.values()))["tokens"] if adapter else 0,
                "exits": [{"depth": d, "lens_agree": lens[d]["agree"], "adapter_agree": adapter[d]["agree"],
                           "lens_kl": lens[d]["kl"], "adapter_kl": adapter[d]["kl"]} for d in sorted(adapter)],
            },
            "config": to_dict(cfg),
        }
        _write_outputs(cfg, unwrapped, adapter_weights, metrics, format_table(lens, adapter))
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return metrics


def _write_outputs(cfg: DistillConfig, peft_model, adapter_weights: dict, metrics: dict, table: str) -> None:
    """Main process: adapter checkpoint, metrics.json, model card; print the table; push if asked."""
    from dex_adapt.adapters import save_exit_adapters
    from dex_adapt.distill.publish import push_checkpoint, write_model_card

    out_dir = cfg.train.output_dir
    os.makedirs(out_dir, exist_ok=True)
    save_exit_adapters(peft_model, out_dir, state_dict=adapter_weights,
                       base=cfg.model.path if os.path.isdir(cfg.model.path) else None)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    write_model_card(out_dir, metrics, base_hub_id=cfg.model.hub_id)
    tr = metrics["train"]
    print(f"\nper-exit top-1 agreement with the final token on held-out data "
          f"({metrics['eval']['tokens']} positions per exit):\n{table}")
    print(f"training cost: {tr['seconds_per_micro_step'] * 1000:.1f} ms per micro-step vs "
          f"{tr['seconds_per_base_forward'] * 1000:.1f} ms per no-grad base forward on the same batch "
          f"= {tr['step_over_forward'] or float('nan'):.2f}x")
    print(f"adapters saved to {out_dir}")
    if cfg.hub.push_to_hub:
        push_checkpoint(out_dir, cfg.hub.repo_id, private=cfg.hub.private)


def _flat(d: dict, prefix: str = "") -> dict:
    """Tracker hparams want scalars: flatten sections, stringify lists/None."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out
