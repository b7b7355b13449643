"""Registry of attention modules, filled by a decorator next to each class definition."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from models.config import AttentionKind, TransformerConfig

_REGISTRY: dict[AttentionKind, type[nn.Module]] = {}


def register_attention(*kinds: AttentionKind) -> Callable[[type[nn.Module]], type[nn.Module]]:
    def wrap(cls: type[nn.Module]) -> type[nn.Module]:
        for kind in kinds:
            if kind in _REGISTRY:
                raise ValueError(f"attention kind {kind.value!r} registered twice")
            _REGISTRY[kind] = cls
        return cls

    return wrap


def build_attention(config: TransformerConfig) -> nn.Module:
    """The token-mixing sub-layer for ``config.attention``."""
    try:
        cls = _REGISTRY[config.attention]
    except KeyError:
        known = ", ".join(k.value for k in _REGISTRY)
        raise ValueError(f"no attention module for {config.attention.value!r}; known: {known}") from None
    return cls(config)


def registered_kinds() -> list[AttentionKind]:
    return list(_REGISTRY)
