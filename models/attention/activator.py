"""Activator: a GEGLU gating unit in place of attention (Activator paper Eqs. 8-10)."""

from __future__ import annotations

from torch import Tensor, nn

from models.attention import functional as AF
from models.attention.registry import register_attention
from models.config import AttentionKind, NormKind, TransformerConfig


@register_attention(AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY)
class GEGLUUnit(nn.Module):
    """Y = LinearDown(P1 * P2) with P1 = LN(Up₁ x) (Eq. 8), P2 = LN(GELU(Up₂ x)) (Eq. 9); the block
    adds the residual (Eq. 10). The inner LayerNorms follow ``config.norm``.

    Token-local: no mixing across positions, so no T² term at all. For ``geglu-only`` the block has
    no separate FFN (Eqs. 12-14). FHE note: one ciphertext×ciphertext product per hidden unit (the
    gate) and one GELU table lookup / polynomial.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        hidden = config.ffn_dim
        self.up_value = nn.Linear(config.d_model, hidden)
        self.up_gate = nn.Linear(config.d_model, hidden)
        self.down = nn.Linear(hidden, config.d_model)
        self.normalize = config.norm is NormKind.LAYERNORM

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the unit's input (a preceding norm folds into them)."""
        return [self.up_value, self.up_gate]

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C)
        return self.down(AF.geglu(self.up_value(x), self.up_gate(x), normalize=self.normalize))
