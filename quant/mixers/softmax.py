"""Normalised attention N(σ(QKᵀ/√d)) V (PowerSoftmax paper Eq. 3): classic dot-product softmax (σ =
exp, Eq. 1) and PowerSoftmax (σ = x^p, Eq. 2, in its length-agnostic inference form, Eq. 7)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from models.config import AttentionKind
from quant.lowering import Lowering, QValue
from quant.mixers import register_mixer
from quant.mixers._heads import merge_heads, project_qkv


@register_mixer(AttentionKind.DOT_PRODUCT)
def lower_dot_product(
    low: Lowering, mixer, h: QValue, name: str, cfg
) -> tuple[QValue, torch.nn.Linear]:
    heads = project_qkv(low, mixer, h, name, cfg)
    out = lower_normalized(low, heads.q, heads.k, heads.v, f"{name}.attn", exp_scores())
    return merge_heads(low, out, name), mixer.out_proj


@register_mixer(AttentionKind.POWER_SOFTMAX)
def lower_power_softmax(
    low: Lowering, mixer, h: QValue, name: str, cfg
) -> tuple[QValue, torch.nn.Linear]:
    heads = project_qkv(low, mixer, h, name, cfg)
    out = lower_normalized(
        low,
        heads.q,
        heads.k,
        heads.v,
        f"{name}.attn",
        power_scores(mixer.p),
        eps=mixer.inference_eps,
        length_agnostic=True,
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


def exp_scores() -> Callable[[Lowering, QValue, str, float], QValue]:
    """softmax numerator exp(c·(s − max_j s)): the row maximum is subtracted exactly as in float
    softmax (shift invariance), so the largest numerator of every row is 1 and the sum is >= 1."""

    def fn(low: Lowering, s: QValue, name: str, c: float) -> QValue:
        m = row_max(low, s, f"{name}.rowmax", f"{name}.softmax")
        shifted = low.sub(s, m, f"{name}.shift", f"{name}.softmax")  # <= 0
        return low.lut(
            shifted, lambda t: torch.exp(t * c), f"{name}.exp", f"{name}.softmax", signed=False
        )

    return fn


def power_scores(p: int) -> Callable[[Lowering, QValue, str, float], QValue]:
    def fn(low: Lowering, s: QValue, name: str, c: float) -> QValue:
        return low.lut(s, lambda t: (t * c).pow(p), f"{name}.pow", f"{name}.softmax", signed=False)

    return fn


def lower_normalized(
    low: Lowering,
    q: QValue,
    k: QValue,
    v: QValue,
    name: str,
    numerator: Callable[[Lowering, QValue, str, float], QValue],
    eps: float = 0.0,
    length_agnostic: bool = False,
) -> QValue:
    """N(σ(QKᵀ/√d)) V (PowerSoftmax paper Eq. 3) with σ = exp (softmax, Eq. 1) or x^p (Eq. 2).

    The division becomes a reciprocal lookup on the row sum and one encrypted product per score.
    PowerSoftmax uses its length-agnostic inference form (Eq. 7): (x^p / L) / (ε + mean x^p).
    """
    tag = f"{name}.softmax"
    d = q.shape[-1]
    kt = low.transpose(k, (0, 2, 1), f"{name}.kT")
    s = low.matmul(q, kt, f"{name}.qk", f"{name}.scores")  # (nh, T, T)
    e = numerator(
        low, s, name, 1.0 / math.sqrt(d)
    )  # σ(s/√d) in one lookup on the product's accumulator
    den = low.sum(e, -1, f"{name}.den", tag, keepdims=True)  # (nh, T, 1)
    L = s.shape[-1]
    e_scale = e.scale

    def recip(t: Tensor) -> Tensor:
        if length_agnostic:  # Eq. (7): 1 / (L (ε + mean))
            return 1.0 / (L * (eps + t / L)).clamp_min(e_scale)
        return 1.0 / (eps + t).clamp_min(e_scale)  # Eq. (5); at least one quantum avoids 1/0

    r = low.lut(den, recip, f"{name}.recip", tag, signed=False)
    a = low.mul(e, r, f"{name}.norm", tag)  # (nh, T, T)
    a = low.requant(a, f"{name}.probs", tag, signed=False)
    return low.matmul(a, v, f"{name}.av", f"{name}.values")
