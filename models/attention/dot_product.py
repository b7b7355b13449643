"""Classic scaled dot-product softmax attention."""

from __future__ import annotations

from torch import Tensor

from models.attention import functional as AF
from models.attention.base import MultiHeadAttention
from models.attention.registry import register_attention
from models.config import AttentionKind


@register_attention(AttentionKind.DOT_PRODUCT)
class DotProductAttention(MultiHeadAttention):
    """Softmax attention, Vaswani et al. 2017; Inhibitor paper Eq. (3): H = softmax(QKᵀ/√d) V.

    FHE note: under TFHE, QKᵀ and S·V are ciphertext×ciphertext products (two PBS each in Concrete)
    and softmax needs exp and reciprocal table lookups; under CKKS, exp has no cheap polynomial.
    """

    supports_mask = True

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        return AF.dot_product(q, k, v, mask)  # (B, nh, T, dh)
