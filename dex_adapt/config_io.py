"""YAML -> plain dataclasses, strictly: unknown keys and wrongly-typed values are errors.

Shared by every config of the project (pretraining, distillation), so a typo in any YAML file is
reported the same way instead of silently falling back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Union

import yaml

__all__ = ["ConfigError", "build_dataclass", "read_yaml_mapping"]


class ConfigError(ValueError):
    """A config file that is missing, malformed, or names unknown/wrongly-typed fields."""


def _type_ok(hint, value) -> bool:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_type_ok(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_type_ok(item, v) for v in value)
    if isinstance(value, bool):  # bool is an int subclass; YAML `true` for an int is a mistake
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float))
    return isinstance(value, hint)


def build_dataclass(cls, data, source: str, section: str | None = None):
    """``cls(**data)`` after checking every key exists and every value has the field's type.

    Messages name ``source`` (a file) and ``section`` (a mapping inside it, if any).
    """
    where = f"{source}: {section}" if section else source
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {names}")
    for key, value in data.items():
        if not _type_ok(hints[key], value):
            want = getattr(hints[key], "__name__", str(hints[key]).replace("typing.", ""))
            label = f"{section}.{key}" if section else key
            raise ConfigError(f"{source}: {label} wants {want}, got {type(value).__name__} {value!r}")
    return cls(**{k: (float(v) if hints[k] is float else v) for k, v in data.items()})


def read_yaml_mapping(path: str | Path) -> dict:
    """The top-level mapping of a YAML file (an empty file is an empty mapping)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data
