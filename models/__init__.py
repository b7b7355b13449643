"""Float PyTorch models: the attention zoo and the transformer encoder. No FHE library is imported
here."""

from models.config import Activation, AttentionKind, InputKind, NormKind, TransformerConfig
from models.transformer import Transformer

__all__ = [
    "Activation",
    "AttentionKind",
    "InputKind",
    "NormKind",
    "Transformer",
    "TransformerConfig",
]
