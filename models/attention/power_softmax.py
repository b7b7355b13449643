"""PowerSoftmax attention for polynomial (CKKS) transformers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.attention import functional as AF
from models.attention.base import MultiHeadAttention
from models.attention.registry import register_attention
from models.config import AttentionKind, TransformerConfig


@register_attention(AttentionKind.POWER_SOFTMAX)
class PowerSoftmaxAttention(MultiHeadAttention):
    """HE-friendly attention (Zimerman et al., PowerSoftmax paper).

    Training form (Fig. 2 middle): stable PowerSoftmax (Eq. 6) with ε-Lipschitz division (Eq. 5):
    H = N_ε((S/c)^p) V with S = QKᵀ/√d. Inference form for the polynomial model (Fig. 2 right):
    length-agnostic division (Eq. 7), selected with ``inference_form=True``.
    The latest scores are kept in ``last_range`` so training can add the range loss of Eq. (9).

    FHE note: only x^p (log2 p squarings), a mean with a clear 1/L, and one reciprocal that Goldschmidt
    iterations approximate on a calibrated interval; multiplicative depth, not PBS, is the cost.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.p = config.power_p
        self.eps = config.power_eps
        self.inference_form = False
        self.track_range = False
        self.last_range: Tensor | None = None

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, nh, T, T)
        if self.track_range:
            self.last_range = AF.power_softmax_range(scores)  # Eq. (9) summand
        if self.inference_form:
            attn = AF.power_softmax(scores, self.p, self.eps, length_agnostic=True)  # Eq. (7)
        else:
            attn = AF.power_softmax(scores, self.p, self.eps, stable=True)  # Eqs. (5), (6)
        return attn @ v  # (B, nh, T, dh)


def range_loss(model: torch.nn.Module) -> Tensor:
    """L_PowerSoftmax (Eq. 9): the sum over PowerSoftmax layers of max |input| over heads."""
    terms = [m.last_range for m in model.modules() if isinstance(m, PowerSoftmaxAttention)]
    terms = [t for t in terms if t is not None]
    if not terms:
        return torch.zeros(())
    return torch.stack(terms).sum()


def set_range_tracking(model: torch.nn.Module, enabled: bool) -> None:
    for m in model.modules():
        if isinstance(m, PowerSoftmaxAttention):
            m.track_range = enabled
            m.last_range = None
