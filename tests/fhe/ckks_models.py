"""A tiny untrained polynomial-friendly transformer shared by the CKKS tests."""

from models.config import TransformerConfig
from models.transformer import Transformer


def tiny(**overrides) -> Transformer:
    cfg = dict(seq_len=4, in_features=3, n_outputs=3, attention="power-softmax", d_model=4, n_heads=2, norm="none",
               ffn_activation="gelu", power_form="length-agnostic")
    cfg.update(overrides)
    return Transformer(TransformerConfig(**cfg)).double().eval()
