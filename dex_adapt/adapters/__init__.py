"""Inducing adapters as a PEFT method (DESIGN.md §6), and the decoder's seam.

Importing `dex_adapt` registers the method with PEFT, so PEFT's own `get_peft_model`,
`save_pretrained`, `PeftConfig.from_pretrained` and `PeftModel.from_pretrained` handle inducing
adapters. Importing PEFT costs seconds, and most of `dex_adapt` (the lattice, the cost model) never
needs it, so registration is deferred: if PEFT is already imported it happens now, otherwise a
one-shot import hook registers the method the moment PEFT finishes importing. The public names
below are loaded on first use (PEP 562).

The decoder's seam:
- `load_exit_adapters(ckpt_dir, model) -> {depth: module}`: each module maps `h_d` `[..., H]` to
  `[..., H]` (residual included), in the model's dtype/device, eval mode; checks the fingerprint.
- `base_model_path(ckpt_dir) -> str`: the base recorded in the adapter config (a relative path is
  resolved against the checkpoint directory).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = [
    "InducingConfig",
    "InducingModel",
    "InducingAdapter",
    "BaseModelMismatchError",
    "load_exit_adapters",
    "base_model_path",
    "read_adapter_config",
    "save_exit_adapters",
    "exit_logits",
    "exit_adapters",
    "base_fingerprint",
    "register",
]

_WHERE = {
    "InducingConfig": "config",
    "InducingAdapter": "layer",
    "InducingModel": "model",
    "BaseModelMismatchError": "model",
    "exit_adapters": "model",
    "base_fingerprint": "model",
    "register": "model",
    "load_exit_adapters": "exits",
    "base_model_path": "checkpoint",
    "read_adapter_config": "checkpoint",
    "save_exit_adapters": "exits",
    "exit_logits": "exits",
}


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_now() -> None:
    # When one of our own modules is what imports PEFT, it is only half-initialised here;
    # `model.py` then registers at the end of its own import instead.
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.startswith(__name__ + ".") and getattr(getattr(mod, "__spec__", None), "_initializing", False):
            return
    importlib.import_module(f"{__name__}.model").register()


class _RegisterAfterPeftImport(importlib.abc.MetaPathFinder):
    """One-shot: find `peft` as usual, and run `_register_now` after its module body executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "peft":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_now()

        spec.loader.exec_module = exec_then_register
        return spec


if "peft" in sys.modules:
    _register_now()
elif not any(isinstance(f, _RegisterAfterPeftImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterPeftImport())
