"""DCT-Former attention: softmax attention in a DCT-compressed sequence domain."""

from __future__ import annotations

from torch import Tensor

from models.attention import functional as AF
from models.attention.base import MultiHeadAttention
from models.attention.registry import register_attention
from models.config import AttentionKind, TransformerConfig


@register_attention(AttentionKind.DCT)
class DCTAttention(MultiHeadAttention):
    """DCT-Former (Scribano et al., 2023), Algorithm 1: Q̄, K̄, V̄ = D̄Q, D̄K, D̄V (n̄ rows each),
    output D̄ᵀ softmax(Q̄K̄ᵀ/√d) V̄. ``dct_ideal`` selects Algorithm 2 (evaluation only).

    The DCT is computed with Makhoul's FFT algorithm, so any sequence length works.
    FHE note: D̄ is a clear matrix, so compression is a free linear layer; the quadratic part of the
    circuit shrinks from T² to n̄² scores.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.n_bar = config.dct_n_bar or max(1, config.seq_len // 2)
        self.ideal = config.dct_ideal

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        # no mask (supports_mask is False): the DCT compresses the whole sequence, padding included
        return AF.dct_attention(q, k, v, self.n_bar, ideal=self.ideal)  # (B, nh, T, dh)
