"""PowerSoftmax attention for polynomial (CKKS) transformers."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from models.attention import functional as AF
from models.attention.base import MultiHeadAttention
from models.attention.registry import register_attention
from models.config import AttentionKind, PowerForm, TransformerConfig
from models.layers import FeedForward, RangedLayerNorm


@register_attention(AttentionKind.POWER_SOFTMAX)
class PowerSoftmaxAttention(MultiHeadAttention):
    """HE-friendly attention (Zimerman et al., PowerSoftmax paper).

    Training form (Fig. 2 middle): stable PowerSoftmax (Eq. 6) with ε-Lipschitz division (Eq. 5):
    H = N_ε((S/c)^p) V with S = QKᵀ/√d. Inference form for the polynomial model (Fig. 2 right):
    length-agnostic division (Eq. 7), selected with ``inference_form=True``. Eq. 7 as printed has no
    ε: ε (Eq. 5) is added to the stable form's normalised powers, whose sum is ≥ 1, where it is
    negligible; added to the un-normalised mean of the inference form it would dominate small scores
    (measured on a digits model: 65.0% with ``inference_eps = 0``, 40.8% with ε = 1e-3), so
    ``inference_eps`` is 0 unless the model was trained in the length-agnostic form itself
    (``power_form``), where ε also bounds the polynomial division's interval from below (Eq. 5's
    purpose). The latest scores are kept in ``last_range`` so training can add the range loss of Eq.
    (9).

    FHE note: only x^p (log2 p squarings), a mean with a clear 1/L, and one reciprocal that
    Goldschmidt iterations approximate on a calibrated interval; multiplicative depth, not PBS, is
    the cost.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.p = config.power_p
        self.eps = config.power_eps
        self.form = config.power_form
        self.inference_form = False

    @property
    def inference_eps(self) -> float:
        """ε of the inference form: the model's ε when it was trained in that form, else 0."""
        return self.eps if self.form is PowerForm.LENGTH_AGNOSTIC else 0.0

    supports_mask = True

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, nh, T, T)
        self.record_range(scores)  # Eq. (9) summand
        if self.form is PowerForm.LENGTH_AGNOSTIC or self.inference_form:
            attn = AF.power_softmax(
                scores, self.p, self.inference_eps, length_agnostic=True, mask=mask
            )  # Eqs. (7), (11)
        else:
            attn = AF.power_softmax(
                scores, self.p, self.eps, stable=True, mask=mask
            )  # Eqs. (5), (6), (11)
        return attn @ v  # (B, nh, T, dh)


def _sum_ranges(model: torch.nn.Module, kind: type) -> Tensor:
    recorders: list[Any] = [m for m in model.modules() if isinstance(m, kind)]
    terms: list[Tensor] = [m.last_range for m in recorders if m.last_range is not None]
    return torch.stack(terms).sum() if terms else torch.zeros(())


def range_loss(model: torch.nn.Module) -> Tensor:
    """L_PowerSoftmax (Eq. 9): the sum over attention layers of max |score| over heads (the
    PowerSoftmax layers; softmax's too, whose exp is a polynomial on that interval under CKKS)."""
    return _sum_ranges(model, MultiHeadAttention)


def activation_range_loss(model: torch.nn.Module) -> Tensor:
    """The activation range loss (Alg. 1 step 2, after Zimerman et al.): the sum over FFN
    activations of max |input|, which narrows the interval (hence the degree) of the polynomial
    activation."""
    return _sum_ranges(model, FeedForward)


def norm_range_loss(model: torch.nn.Module) -> Tensor:
    """The norm range loss: the sum over LayerNorms of the hinge on their input variances' spread
    (:class:`models.layers.RangedLayerNorm`), which narrows the interval (hence the Newton steps)
    of the encrypted 1/√σ²."""
    return _sum_ranges(model, RangedLayerNorm)


def set_range_tracking(
    model: torch.nn.Module,
    enabled: bool,
    threshold: float = 0.0,
    act_threshold: float = 0.0,
    norm_ratio: float = 1.0,
) -> None:
    """Record ranges on the next forward; thresholds turn the losses into hinges (see
    power_softmax_range); ``norm_ratio`` is the LayerNorm variance ratio κ the norm hinge allows."""
    trackers: list[Any] = [m for m in model.modules() if hasattr(m, "track_range")]
    for m in trackers:
        m.track_range = enabled
        if isinstance(m, MultiHeadAttention):
            m.range_threshold = threshold
        elif isinstance(m, RangedLayerNorm):
            m.range_threshold = math.log(norm_ratio)
        else:
            m.range_threshold = act_threshold
        m.last_range = None
