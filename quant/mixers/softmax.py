"""Normalised attention N(σ(QKᵀ/√d)) V (PowerSoftmax paper Eq. 3): classic dot-product softmax (σ =
exp, Eq. 1) and PowerSoftmax (σ = x^p, Eq. 2, in its length-agnostic inference form, Eq. 7)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from models.config import AttentionKind
from quant.lowering import Lowering, QValue
from quant.mixers import _causal, register_mixer
from quant.mixers._heads import kept_keys, mask_keys, merge_heads, project_qkv


@register_mixer(AttentionKind.DOT_PRODUCT)
def lower_dot_product(
    low: Lowering, mixer, h: QValue, name: str, cfg
) -> tuple[QValue, torch.nn.Linear]:
    heads = project_qkv(low, mixer, h, name, cfg)
    out = lower_normalized(
        low, heads.q, heads.k, heads.v, f"{name}.attn", exp_scores(), causal=cfg.causal
    )
    return merge_heads(low, out, name), mixer.out_proj


@register_mixer(AttentionKind.POWER_SOFTMAX)
def lower_power_softmax(
    low: Lowering, mixer, h: QValue, name: str, cfg
) -> tuple[QValue, torch.nn.Linear]:
    heads = project_qkv(low, mixer, h, name, cfg)
    # a padding key's K is zeroed: s_ij = 0 and (0)^p = 0, Eq. 11's x ⊙ M
    k = mask_keys(low, heads.k, low.quantizers[f"{name}.k.out"], f"{name}.k", f"{name}.qkv")
    out = lower_normalized(
        low,
        heads.q,
        k,
        heads.v,
        f"{name}.attn",
        power_scores(mixer.p),
        eps=mixer.inference_eps,
        length_agnostic=True,
        causal=cfg.causal,
    )
    return merge_heads(low, out, name), mixer.out_proj


def row_max(low: Lowering, s: QValue, name: str, tag: str) -> QValue:
    """max over the last axis by a tree of max(a, b) = b + (a − b)⁺: one ReLU lookup per comparison,
    L − 1 per row. Returns shape (..., 1)."""
    level = 0
    while s.shape[-1] > 1:
        n = s.shape[-1]
        half = n // 2
        a = low.slice_last(s, 0, half, f"{name}.max{level}.a")
        b = low.slice_last(s, half, 2 * half, f"{name}.max{level}.b")
        gap = low.lut_exact(
            low.sub(a, b, f"{name}.max{level}.d", tag),
            torch.relu,
            f"{name}.max{level}.relu",
            tag,
            rounding=True,
        )  # an approximate maximum is enough: softmax is shift-invariant
        m = low.add(b, gap, f"{name}.max{level}", tag)
        if n % 2:  # carry the odd element to the next level
            rest = low.slice_last(s, n - 1, n, f"{name}.max{level}.rest")
            m = _concat_last(low, m, rest, f"{name}.max{level}.cat")
        s, level = m, level + 1
    return s


def _concat_last(low: Lowering, a: QValue, b: QValue, name: str) -> QValue:
    node = low.graph.add(name, "concat", (a.node, b.node), axis=-1)
    return low._out(node, a.scale, torch.cat([a.fake, b.fake], dim=-1))


Numerator = Callable[[Lowering, QValue, str, float, bool], QValue]


def _scores_lookup(
    low: Lowering, s: QValue, fn: Callable[[Tensor], Tensor], point: str, tag: str, causal: bool
) -> QValue:
    """fn(s) in one unsigned lookup per score; ``causal``: on the kept pairs j <= i only, the
    removed ones 0 (Eq. 11's x ⊙ M)."""
    if not causal:
        return low.lut(s, fn, point, tag, signed=False)
    kept = _causal.gather(low, s, f"{point}.causal", tag)
    e = low.lut(kept, fn, point, tag, signed=False)
    return _causal.scatter(low, e, s.shape[1], f"{point}.scatter", tag)


def exp_scores() -> Numerator:
    """softmax numerator exp(c·(s − max_j s)): the row maximum is subtracted exactly as in float
    softmax (shift invariance), so the largest numerator of every row is 1 and the sum is >= 1.
    Causal: the maximum runs over the kept keys (each removed score replaced by the row's
    diagonal one, no PBS)."""

    def fn(low: Lowering, s: QValue, name: str, c: float, causal: bool) -> QValue:
        tag = f"{name}.softmax"
        floor = None
        if low.key_mask is not None:  # s − B(1 − m_j): a padding key falls far below every real one
            span = float(s.fake.max() - s.fake.min()) or 1.0
            m = low.reshape(low.key_mask, (1, 1, low.key_mask.shape[0]), f"{name}.mask.row")
            s = low.add_const(
                low.add_count(s, m, 3 * span, f"{name}.masked", tag),
                np.array(-3 * span),
                f"{name}.masked.shift",
                tag,
            )
            floor = -1.5 * span  # kept keys shift to >= −span, padding ones to <= −2·span
        ref = _causal.diagonal_filled(low, s, f"{name}.fill", tag) if causal else s
        top = row_max(low, ref, f"{name}.rowmax", tag)
        shifted = low.sub(s, top, f"{name}.shift", tag)  # <= 0 on the kept keys

        def exp(t: Tensor) -> Tensor:
            e = torch.exp(t * c)
            return e if floor is None else torch.where(t > floor, e, torch.zeros_like(e))

        return _scores_lookup(low, shifted, exp, f"{name}.exp", tag, causal)

    return fn


def power_scores(p: int) -> Numerator:
    def fn(low: Lowering, s: QValue, name: str, c: float, causal: bool) -> QValue:
        pow_p = lambda t: (t * c).pow(p)  # noqa: E731
        return _scores_lookup(low, s, pow_p, f"{name}.pow", f"{name}.softmax", causal)

    return fn


def lower_normalized(
    low: Lowering,
    q: QValue,
    k: QValue,
    v: QValue,
    name: str,
    numerator: Numerator,
    eps: float = 0.0,
    length_agnostic: bool = False,
    causal: bool = False,
) -> QValue:
    """N(σ(QKᵀ/√d)) V (PowerSoftmax paper Eq. 3) with σ = exp (softmax, Eq. 1) or x^p (Eq. 2).

    The division becomes a reciprocal lookup on the row sum and one encrypted product per score.
    PowerSoftmax uses its length-agnostic inference form (Eq. 7): (x^p / L) / (ε + mean x^p).
    ``causal`` (Eq. 11, M_ij = [j <= i]): the numerators of removed keys are 0 and ε counts once
    per kept key, (x_j^p / L) / (ε·(i + 1) / L + mean x^p), as the float model
    (:func:`models.attention.functional.power_softmax`); the per-row ε·(i + 1) is a clear constant
    added to the row sum, quantized to its grid.
    """
    tag = f"{name}.softmax"
    d = q.shape[-1]
    kt = low.transpose(k, (0, 2, 1), f"{name}.kT")
    s = low.matmul(q, kt, f"{name}.qk", f"{name}.scores")  # (nh, T, T)
    e = numerator(
        low, s, name, 1.0 / math.sqrt(d), causal
    )  # σ(s/√d) in one lookup on the product's accumulator
    den = low.sum(e, -1, f"{name}.den", tag, keepdims=True)  # (nh, T, 1)
    L = s.shape[-1]
    e_scale = float(e.scale)  # per-tensor
    per_key_eps = bool(length_agnostic and eps and (causal or low.key_mask is not None))
    if per_key_eps and low.key_mask is not None:  # ε per kept key, counted under encryption
        kept = kept_keys(low, causal, f"{name}.kept", tag)  # (T, 1)
        kept = low.expand_dims(kept, -3, f"{name}.kept.e")  # (1, T, 1), beside den (nh, T, 1)
        den = low.add_count(den, kept, eps, f"{name}.den.eps", tag)
    elif per_key_eps:
        den = low.add_const(den, eps * _causal.kept_per_query(L), f"{name}.den.eps", tag)

    def recip(t: Tensor) -> Tensor:
        if per_key_eps:  # ε·(kept keys) is in t already
            return 1.0 / t.clamp_min(e_scale)
        if length_agnostic:  # Eq. (7): 1 / (L (ε + mean))
            return 1.0 / (L * (eps + t / L)).clamp_min(e_scale)
        return 1.0 / (eps + t).clamp_min(e_scale)  # Eq. (5); at least one quantum avoids 1/0

    r = low.lut(den, recip, f"{name}.recip", tag, signed=False)
    a = low.mul(e, r, f"{name}.norm", tag)  # (nh, T, T)
    a = low.requant(a, f"{name}.probs", tag, signed=False)
    return low.matmul(a, v, f"{name}.av", f"{name}.values")
