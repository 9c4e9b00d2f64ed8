"""Publishing inducing-adapter checkpoints: the model card and the Hub upload.

The card is generated from the checkpoint's `metrics.json` (written by the trainer) and
`adapter_config.json`: `library_name: peft`, `base_model`, tags, how to load the adapters with
PEFT and with `dex-decode`, and the per-exit agreement table (logit lens vs adapter, held out).
Only the checkpoint's top-level files are uploaded (never the resumable `state/` or `logs/`).
"""

from __future__ import annotations

import hashlib
import json
import os

__all__ = ["UPLOAD_NAMES", "write_model_card", "model_card", "files_to_upload", "push_checkpoint"]

#: What a published inducing-adapter repo holds.
UPLOAD_NAMES = ("README.md", "adapter_config.json", "adapter_model.safetensors", "metrics.json")
TAGS = ("peft", "dex", "depth-exploration-decoding", "inducing-adapter", "early-exit", "self-distillation")


def _base_reference(adapter_config: dict, base_hub_id: str | None) -> tuple[str, bool]:
    """(name for the card's `base_model`, whether the base was a local directory)."""
    name = adapter_config.get("base_model_name_or_path") or "unknown"
    local = name.startswith((".", os.sep))
    if base_hub_id:
        return base_hub_id, False
    # a local path is no Hub id; its last component is the best name there is
    return (os.path.basename(os.path.normpath(name)), True) if local else (name, False)


def model_card(adapter_config: dict, metrics: dict | None, base_hub_id: str | None = None,
               repo_id: str | None = None, ckpt_dir: str | None = None) -> str:
    """The README.md text (YAML front matter + markdown); loading snippets name `repo_id` or `ckpt_dir`."""
    base, local = _base_reference(adapter_config, base_hub_id)
    where = repo_id or ckpt_dir or "path/to/this/checkpoint"
    # a base trained from a local directory is recorded relative to the checkpoint: resolve it the same way
    load_base = f'base_model_path("{where}")' if local else f'"{base}"'
    base_import = ["from dex_adapt.adapters import base_model_path  # the recorded base, resolved against the ckpt",
                   f"# (recorded: {adapter_config.get('base_model_name_or_path')})"] if local else []
    depths = adapter_config.get("exit_depths") or []
    kind = adapter_config.get("kind", "bottleneck")
    size = f" of width {adapter_config.get('bottleneck_size')}" if kind == "bottleneck" else " (full-rank)"
    lines = [
        "---",
        "library_name: peft",
        f"base_model: {base}",
        "tags:",
        *[f"- {t}" for t in TAGS],
        "pipeline_tag: text-generation",
        "---",
        "",
        f"# Inducing adapters for `{base}`",
        "",
        f"Inducing adapters (DEX, Depth Exploration Decoding) at exit depths {_ranges(depths)} of a "
        f"{adapter_config.get('num_hidden_layers')}-layer base ({kind}{size}). Each is a residual, "
        "zero-initialised map on the hidden state `h_d` trained by self-distillation so that "
        "`lm_head(norm(A_d(h_d)))` agrees with the model's own final distribution. The base model's "
        "forward is never changed: DEX decoding with these adapters is lossless.",
        "",
        f"Base fingerprint: `{adapter_config.get('base_fingerprint')}` "
        "(checked when loading; another base is refused).",
        "",
        "## How to load",
        "",
        "```python",
        "import dex_adapt  # registers the DEX_INDUCING PEFT method",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM",
        *base_import,
        "",
        f"base = AutoModelForCausalLM.from_pretrained({load_base})",
        f'model = PeftModel.from_pretrained(base, "{where}")',
        "",
        "from dex_adapt.adapters import load_exit_adapters  # depth -> module, for your own decoder",
        f'adapters = load_exit_adapters("{where}", base)',
        "```",
        "",
        "Lossless DEX decoding:",
        "",
        "```bash",
        f'dex-decode --adapters {where} --explorers 4 --prompt "def add(a, b):" --verify',
        "```",
        "",
    ]
    if metrics:
        ev, tr = metrics["eval"], metrics["train"]
        lines += [
            "## Per-exit top-1 agreement with the final token (held out)",
            "",
            f"Held-out data: {', '.join(ev['sources'])} ({ev['blocks']} blocks, {ev['tokens']} positions per exit). "
            "`agree` = fraction of positions where the exit's argmax equals the model's own; KL = KL(final || exit).",
            "",
            "| depth | agree (logit lens) | agree (adapter) | KL (lens) | KL (adapter) |",
            "|---:|---:|---:|---:|---:|",
            *[f"| {e['depth']} | {e['lens_agree']:.3f} | {e['adapter_agree']:.3f} | {e['lens_kl']:.3f} | "
              f"{e['adapter_kl']:.3f} |" for e in ev["exits"]],
            "",
            "## Training",
            "",
            f"{tr['steps']} steps of {tr['tokens_per_step']} tokens, final loss {tr['final_loss']:.4f}.",
            f"Cost: {_ms(tr['seconds_per_micro_step'])} per training micro-step vs "
            f"{_ms(tr['seconds_per_base_forward'])} per no-grad base forward on the same batch"
            + (f" ({tr['step_over_forward']:.2f}x)." if tr.get("step_over_forward") else "."),
            "",
            "Command:",
            "",
            "```bash",
            metrics.get("command") or "(not recorded)",
            "```",
            "",
        ]
    return "\n".join(lines)


def _ms(seconds) -> str:
    return "n/a" if seconds is None or seconds != seconds else f"{seconds * 1000:.1f} ms"


def _ranges(depths: list[int]) -> str:
    if not depths:
        return "(none)"
    if len(depths) > 2 and depths == list(range(depths[0], depths[-1] + 1)):
        return f"{depths[0]}..{depths[-1]}"
    return ", ".join(map(str, depths))


def write_model_card(ckpt_dir: str, metrics: dict | None = None, base_hub_id: str | None = None,
                     repo_id: str | None = None) -> str:
    """(Re)write `README.md` of a checkpoint from its config and metrics.json; returns the path."""
    from dex_adapt.adapters.checkpoint import read_adapter_config

    config = read_adapter_config(ckpt_dir)
    if metrics is None and os.path.isfile(os.path.join(ckpt_dir, "metrics.json")):
        with open(os.path.join(ckpt_dir, "metrics.json")) as f:
            metrics = json.load(f)
    path = os.path.join(ckpt_dir, "README.md")
    with open(path, "w") as f:
        f.write(model_card(config, metrics, base_hub_id, repo_id, ckpt_dir=os.path.normpath(ckpt_dir)))
    return path


def files_to_upload(ckpt_dir: str, repo_id: str | None = None, base_hub_id: str | None = None) -> list[dict]:
    """[{path, bytes, sha256, content}] of what a push uploads, in upload order.

    The model card is regenerated in memory so that its "how to load" names `repo_id` (the file on
    disk is left alone); the other files are uploaded as they are.
    """
    from dex_adapt.adapters.checkpoint import read_adapter_config

    config = read_adapter_config(ckpt_dir)
    metrics = None
    if os.path.isfile(os.path.join(ckpt_dir, "metrics.json")):
        with open(os.path.join(ckpt_dir, "metrics.json")) as f:
            metrics = json.load(f)
    out = []
    for name in UPLOAD_NAMES:
        path = os.path.join(ckpt_dir, name)
        if name == "README.md":
            content = model_card(config, metrics, base_hub_id, repo_id).encode()
        elif os.path.isfile(path):
            with open(path, "rb") as f:
                content = f.read()
        else:
            continue
        out.append({"path": name, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest(),
                    "content": content})
    return out


def push_checkpoint(ckpt_dir: str, repo_id: str, private: bool = False, dry_run: bool = False,
                    endpoint: str | None = None, token: str | None = None, base_hub_id: str | None = None,
                    print_fn=print) -> list[dict]:
    """Create `repo_id` (if needed) and upload the checkpoint in one commit; `dry_run` only prints it."""
    from dex_adapt.adapters.checkpoint import WEIGHTS_NAME, read_adapter_config

    read_adapter_config(ckpt_dir)  # one-line errors for a missing/foreign checkpoint
    if not os.path.isfile(os.path.join(ckpt_dir, WEIGHTS_NAME)):
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in adapter checkpoint {ckpt_dir}")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"--repo-id must look like user/name, got {repo_id!r}")
    files = files_to_upload(ckpt_dir, repo_id, base_hub_id)
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=endpoint, token=token)
    verb = "would upload" if dry_run else "uploading"
    print_fn(f"{verb} to {api.endpoint}/{repo_id} ({'private' if private else 'public'} model repo):")
    for f in files:
        print_fn(f"  {f['path']}  {f['bytes']} bytes  sha256:{f['sha256']}")
    if dry_run:
        return files
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.create_commit(repo_id, repo_type="model", commit_message="Upload DEX inducing adapters",
                      operations=[CommitOperationAdd(f["path"], f["content"]) for f in files])
    print_fn(f"pushed {len(files)} files to {api.endpoint}/{repo_id}")
    return files
