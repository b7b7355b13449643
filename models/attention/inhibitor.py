"""Inhibitor attention: Manhattan-distance scores and ReLU inhibition."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.attention import functional as AF
from models.attention.base import MultiHeadAttention
from models.attention.registry import register_attention
from models.config import AttentionKind, TransformerConfig, inhibitor_mean_scale


@register_attention(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)
class InhibitorAttention(MultiHeadAttention):
    """The Inhibitor (Brännvall, arXiv:2310.02041).

    Eq. (5): Z_ij = Σ_k |Q_ik − K_jk| / γ, shifted Z' = (Z − α)⁺;
    Eq. (6): H_ik = Σ_j (V_jk − Z'_ij)⁺; signed variant Eq. (7).
    By default the forward pass uses the memory-saving form of Eqs. (8)-(10) (fused pairwise L1
    distances, no (T, T, d) tensor); ``memory_efficient=False`` uses the broadcast form.
    ``inhibitor_mean``: each query's sums are scaled to means, by 1 / T, or with the causal mask
    by m_i / n ≈ 1 / (i + 1) for query i over its i + 1 keys
    (:func:`models.config.inhibitor_mean_scale`).

    FHE note: only additions, |x| and ReLU: under TFHE each |·| and (·)⁺ is one PBS and there is no
    ciphertext×ciphertext product, so the circuit needs about half the PBS of dot-product attention.
    """

    row_scale: Tensor | None  # (T, 1) under inhibitor_mean (a buffer, not saved: config says it)

    def __init__(self, config: TransformerConfig, memory_efficient: bool = True) -> None:
        super().__init__(config)
        self.signed = config.attention is AttentionKind.SIGNED_INHIBITOR
        self.alpha = config.inhibitor_alpha
        self.gamma = config.inhibitor_gamma or math.sqrt(config.d_head)
        self.memory_efficient = memory_efficient
        scale = (
            inhibitor_mean_scale(config.seq_len, config.causal) if config.inhibitor_mean else None
        )
        self.register_buffer(
            "row_scale",
            None if scale is None else torch.from_numpy(scale)[:, None],  # (T, 1)
            persistent=False,
        )

    supports_mask = True

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        fn = AF.inhibitor if self.memory_efficient else AF.inhibitor_broadcast
        h = fn(q, k, v, self.gamma, self.alpha, self.signed, mask)  # (B, nh, T, dh)
        if self.row_scale is None:
            return h
        return h * self.row_scale[: h.shape[-2]].to(h.dtype)
