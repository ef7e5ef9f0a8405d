"""The encoder architectures bert_jax trains, one module each, and the registry that names them.

- bert (arch/bert.py): the original BERT, bert_jax.model;
- modern (arch/modern.py): a ModernBERT-style encoder, bert_jax.modern.

config.model.arch names one (no arch field: bert). `of(config.model)` (or of a config instance) gives its
Architecture (arch/base.py), which every other module asks instead of testing which encoder it has: its config and
presets, models, pretrained parameters, scanned layout, FLOPs and transformers converter. `register` adds one (a
third encoder, or a test's toy) without touching any other module.
"""

import dataclasses

from bert_jax.arch import bert
from bert_jax.arch import modern
from bert_jax.arch.base import Architecture

DEFAULT = bert.Bert.name  # a config.model without an arch field: the original BERT's configs predate the field

_REGISTERED: dict[str, Architecture] = {}


def register(architecture: Architecture) -> Architecture:
    """Adds `architecture` under its name (replacing one of that name); returns it."""
    _REGISTERED[architecture.name] = architecture
    return architecture


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTERED)


def _choices() -> str:
    quoted = [repr(name) for name in _REGISTERED]
    return " or ".join(quoted) if len(quoted) < 3 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def get(name: str) -> Architecture:
    """The architecture registered as `name`; ValueError "arch=NAME: choose ..." otherwise."""
    if name not in _REGISTERED:
        raise ValueError(f"arch={name!r}: choose {_choices()}")
    return _REGISTERED[name]


def of(model_config) -> Architecture:
    """The architecture of `config.model` (a ConfigDict or mapping: its arch field) or of a config instance (its
    class)."""
    if dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):
        for architecture in _REGISTERED.values():
            if isinstance(model_config, architecture.config_class):
                return architecture
        raise ValueError(f"{type(model_config).__name__} is no registered architecture's config")
    return get(model_config.get("arch", DEFAULT))


def config_of(model_config):
    """The architecture's config instance of `config.model` (ValueError "FIELD=VALUE: problem" for a bad field)."""
    return of(model_config).config(model_config)


def for_transformers(model_type: str | None) -> Architecture:
    """The architecture that imports transformers' `model_type` (config.json's); BERT's for any other, whose
    converter names what it does not support."""
    for architecture in _REGISTERED.values():
        if model_type in architecture.transformers_model_types:
            return architecture
    return _REGISTERED[DEFAULT]


BERT = register(bert.Bert())
MODERN = register(modern.Modern())
