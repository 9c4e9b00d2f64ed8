"""Reading an inducing-adapter checkpoint's config without importing torch or PEFT.

`dex-push` and the decoder's `--adapters` option only need the recorded base model and a clear
error for a missing or foreign checkpoint; this module keeps that path to json + os.
"""

from __future__ import annotations

import json
import os

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "PEFT_TYPE", "read_adapter_config", "base_model_path"]

PEFT_TYPE = "DEX_INDUCING"  # == config.PEFT_TYPE (kept here so this module stays import-light)
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"


def read_adapter_config(ckpt_dir: str) -> dict:
    """The raw adapter_config.json of an inducing-adapter checkpoint (one-line errors)."""
    path = os.path.join(ckpt_dir, CONFIG_NAME)
    if not os.path.isdir(ckpt_dir):
        raise FileNotFoundError(f"adapter checkpoint directory not found: {ckpt_dir}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {CONFIG_NAME} in adapter checkpoint {ckpt_dir}")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if raw.get("peft_type") != PEFT_TYPE:
        raise ValueError(f"{path} has peft_type {raw.get('peft_type')!r}, expected {PEFT_TYPE!r} (inducing adapters)")
    return raw


def base_model_path(ckpt_dir: str) -> str:
    """The base model recorded in the adapter config.

    A relative path is resolved against the checkpoint directory (so `checkpoints/x-dex` can say
    `../x` and work from any working directory); a name that is neither absolute, nor relative with
    a leading `./`/`../`, nor an existing directory beside the checkpoint is returned as is (a hub id).
    """
    name = read_adapter_config(ckpt_dir).get("base_model_name_or_path")
    if not name:
        raise ValueError(f"adapter checkpoint {ckpt_dir} records no base model; pass the base model explicitly")
    if os.path.isabs(name):
        return name
    resolved = os.path.normpath(os.path.join(ckpt_dir, name))
    if name.startswith(("./", "../")) or os.path.isdir(resolved):
        return resolved
    return name
