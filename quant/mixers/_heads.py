"""What every Q/K/V attention lowering shares: the projections, their requantisation, head
split/merge."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quant.lowering import Lowering, QValue
from quant.quantizer import Quantizer


@dataclass
class Heads:
    q: QValue  # (n_heads, T, d_head)
    k: QValue
    v: QValue
    v_quantizer: Quantizer  # V's grid (the Inhibitor requantises its scores onto it)


def project_qkv(
    low: Lowering,
    mixer,
    h: QValue,
    name: str,
    cfg,
    shared_qk: bool = False,
    into_lookups=False,
    positive_v: bool = False,
) -> Heads:
    """Q, K, V = h W_{q,k,v}ᵀ + b, requantised and split into heads. ``shared_qk``: Q and K on one
    quantizer (a kind that subtracts them, e.g. the Inhibitor's Eq. 5). A tied mixer (K = Q) has one
    projection: ``k`` is ``q``. ``into_lookups``: Q, K and V feed table lookups directly (the
    Inhibitor's |q − k| and (v − z)⁺), so their requantisations read ``attention_lut_bits``.
    ``positive_v``: V⁺ instead of V, its ReLU right after V's lookup so that Concrete fuses the two
    into one table."""
    nh, dh = cfg.n_heads, cfg.d_head
    T = h.shape[0]

    def heads(x: QValue, label: str) -> QValue:  # (T, C) -> (nh, T, dh)
        x = low.reshape(x, (T, nh, dh), f"{name}.{label}.split")
        return low.transpose(x, (1, 0, 2), f"{name}.{label}.heads")

    tag = f"{name}.qkv"
    narrow = low.config.attention_lut_bits if into_lookups else None
    q_acc = low.linear(h, mixer.q_proj.weight, mixer.q_proj.bias, f"{name}.q", tag)
    v_acc = low.linear(h, mixer.v_proj.weight, mixer.v_proj.bias, f"{name}.v", tag)
    if mixer.tie_qk:  # K = Q: one projection, one requantisation (on the shared Q/K grid)
        q_qk = low.fit(f"{name}.qk", q_acc.fake, signed=True)
        q = low.requant(q_acc, f"{name}.q.out", tag, quantizer=q_qk, lut_bits=narrow)
        k = q
    elif shared_qk:
        k_acc = low.linear(h, mixer.k_proj.weight, mixer.k_proj.bias, f"{name}.k", tag)
        q_qk = low.fit(f"{name}.qk", torch.cat([q_acc.fake, k_acc.fake]), signed=True)
        q = low.requant(q_acc, f"{name}.q.out", tag, quantizer=q_qk, lut_bits=narrow)
        k = low.requant(k_acc, f"{name}.k.out", tag, quantizer=q_qk, lut_bits=narrow)
    else:
        k_acc = low.linear(h, mixer.k_proj.weight, mixer.k_proj.bias, f"{name}.k", tag)
        q = low.requant(q_acc, f"{name}.q.out", tag, signed=True, lut_bits=narrow)
        k = low.requant(k_acc, f"{name}.k.out", tag, signed=True, lut_bits=narrow)
    v = low.requant(v_acc, f"{name}.v.out", tag, signed=True, lut_bits=narrow)
    if positive_v:
        v = low.lut_exact(v, torch.relu, f"{name}.v.pos", tag)
    q_heads = heads(q, "q")
    k_heads = q_heads if k is q else heads(k, "k")
    return Heads(q_heads, k_heads, heads(v, "v"), low.quantizers[f"{name}.v.out"])


def merge_heads(low: Lowering, out: QValue, name: str) -> QValue:
    """(n_heads, T, d_head) -> (T, n_heads · d_head)."""
    nh, T, dh = out.shape
    out = low.transpose(out, (1, 0, 2), f"{name}.merge.t")
    return low.reshape(out, (T, nh * dh), f"{name}.merge")


def mask_keys(low: Lowering, x: QValue, quantizer: Quantizer, name: str, tag: str) -> QValue:
    """(nh, T, d) with the rows of padding positions zeroed by the client's encrypted key mask
    (:attr:`Lowering.key_mask`), one lookup per element; ``x`` unchanged without a mask."""
    if low.key_mask is None:
        return x
    m = low.expand_dims(low.key_mask, -3, f"{name}.mask.e")  # (1, T, 1)
    bounds = (quantizer.qmin - quantizer.zero_point, quantizer.qmax - quantizer.zero_point)
    return low.keep(x, m, bounds, f"{name}.masked", tag)


def kept_keys(low: Lowering, causal: bool, name: str, tag: str) -> QValue:
    """(T, 1): the keys query i keeps under the client's key mask (and, ``causal``, j <= i): an
    encrypted count, no lookup."""
    assert low.key_mask is not None
    T = low.key_mask.shape[0]
    reach = np.tril(np.ones((T, T), dtype=np.int64)) if causal else np.ones((T, T), np.int64)
    return low.matmul_left(reach, low.key_mask, name, tag, integer=True)
