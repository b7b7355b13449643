"""Registry of attention modules, filled by a decorator next to each class definition."""

from __future__ import annotations

from torch import nn

from models.config import TransformerConfig
from models.registry import KindRegistry

MODULES: KindRegistry[type[nn.Module]] = KindRegistry("attention module")
register_attention = MODULES.register


def build_attention(config: TransformerConfig) -> nn.Module:
    """The token-mixing sub-layer for ``config.attention``."""
    cls = MODULES.get(config.attention)
    if cls is None:
        known = ", ".join(k.value for k in MODULES.kinds())
        raise ValueError(f"no attention module for {config.attention.value!r}; known: {known}")
    return cls(config)


def registered_kinds():
    return MODULES.kinds()
