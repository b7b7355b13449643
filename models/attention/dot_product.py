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
    and softmax needs exp and reciprocal table lookups; under CKKS, exp has no cheap polynomial:
    its degree grows with the scores' interval, which the range loss (PowerSoftmax paper Eq. 9,
    ``record_range``) keeps narrow.
    """

    supports_mask = True

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.track_range:
            self.record_range(q @ k.transpose(-2, -1) / self.d_head**0.5)
        return AF.dot_product(q, k, v, mask)  # (B, nh, T, dh)
