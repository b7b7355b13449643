"""Float PyTorch models: the attention zoo and the transformer encoder. No FHE library is imported
here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.config import Activation, AttentionKind, InputKind, NormKind, TransformerConfig

if TYPE_CHECKING:
    from models.transformer import Transformer


def __getattr__(name: str):
    """``Transformer`` on first use (PEP 562): the configuration alone imports no torch, so that a
    CKKS server, which reads a compiled program's config only, does not load it."""
    if name == "Transformer":
        from models.transformer import Transformer

        return Transformer
    raise AttributeError(f"module 'models' has no attribute {name!r}")


__all__ = [
    "Activation",
    "AttentionKind",
    "InputKind",
    "NormKind",
    "Transformer",
    "TransformerConfig",
]
