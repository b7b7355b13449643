"""The Inhibitor (Inhibitor paper Eqs. 5-7) and its signed form, with integer subtraction, |·| and
ReLU lookups only: no ciphertext × ciphertext product."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from models.config import AttentionKind
from quant.lowering import Lowering, QValue
from quant.mixers import _causal, register_mixer
from quant.mixers._heads import mask_keys, merge_heads, project_qkv
from quant.quantizer import Quantizer


@register_mixer(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)
def lower(low: Lowering, mixer, h: QValue, name: str, cfg) -> tuple[QValue, torch.nn.Linear]:
    positive_v = low.config.inhibitor_positive_v and not mixer.signed  # V⁺ for Eq. (6) (below)
    heads = project_qkv(
        low, mixer, h, name, cfg, shared_qk=True, into_lookups=True, positive_v=positive_v
    )  # Q and K share one grid: Eq. (5) subtracts them
    # a padding key's V is zeroed: (0 − Z'_ij)⁺ = 0 and (0⁺ − Z')⁺ + (0⁻ + Z')⁻ = 0 (Z' >= 0), so
    # it inhibits nothing and adds nothing, as the float model's masked sums (Eqs. 6-7)
    v = mask_keys(low, heads.v, heads.v_quantizer, f"{name}.v", f"{name}.qkv")
    out = lower_inhibitor(
        low,
        mixer,
        heads.q,
        heads.k,
        v,
        heads.v_quantizer,
        f"{name}.attn",
        cfg.causal,
        cfg.seq_len if cfg.inhibitor_mean else None,
    )
    return merge_heads(low, out, name), mixer.out_proj


def lower_inhibitor(
    low: Lowering,
    mixer,
    q: QValue,
    k: QValue,
    v: QValue,
    v_quantizer: Quantizer,
    name: str,
    causal: bool = False,
    mean_len: int | None = None,
) -> QValue:
    """Inhibitor, Eqs. (5)-(7).

    Z'_ij = (Σ_k |Q_ik − K_jk| / γ − α)⁺ is requantized directly onto V's scale and saturated at
    max|V|: any larger score already inhibits every value completely, so saturation is exact.
    Eq. (6)'s (V_jk − Z'_ij)⁺ equals (V⁺_jk − Z'_ij)⁺ since Z' >= 0, so the whole-model lowering
    may pass V⁺ (``QuantConfig.inhibitor_positive_v``, fused into V's own lookup): the T²·d ReLU
    lookups then read one bit less (3 instead of 4 at the TFHE defaults), on cheaper parameters.
    ``causal`` (PowerSoftmax paper Eq. 11's mask): the program works on the kept pairs j <= i only
    (:mod:`quant.mixers._causal`): its |·| and ReLU lookups skip the removed ones, and the sums
    over j run per query; ``mean_len`` (the model's seq_len, ``inhibitor_mean``): as means, each
    query's sum times the clear integer m_i over n (:func:`models.config.causal_mean_factors`),
    no lookup (a wider sum for the next ones to round); without the mask, the sum over the T keys
    on a scale 1 / mean_len finer (free: the same integers).
    """
    tag_s, tag_h = f"{name}.scores", f"{name}.inhibit"
    rounding = low.config.round_attention  # round |q − k| and (v − z)⁺ to lut_bits too
    z_q = Quantizer(v_quantizer.scale, 0, v_quantizer.n_bits - 1, False)  # [0, max|V|] on V's grid
    gamma, alpha = mixer.gamma, mixer.alpha
    T = q.shape[1]

    def shifted(dist: QValue) -> QValue:  # Z' = (Z / γ − α)⁺, onto V's grid
        return low.lut(
            dist, lambda t: torch.relu(t / gamma - alpha), f"{name}.z", tag_s, quantizer=z_q
        )

    if mixer.tie_qk:  # K = Q: only the pairs i < j (Z is symmetric, its diagonal 0)
        z = _tied_scores(low, q, shifted, max(0.0, -alpha), z_q, name, tag_s, rounding)
        if causal:  # (nh, P, 1)
            z = _causal.gather(low, z, f"{name}.z.causal", tag_s)
    else:
        diff = low.sub(
            low.expand_dims(q, -2, f"{name}.q.e"),
            low.expand_dims(k, -3, f"{name}.k.e"),
            f"{name}.diff",
            tag_s,
        )  # (nh, T, T, dh)
        if causal:  # (nh, P, dh)
            diff = _causal.gather(low, diff, f"{name}.diff.causal", tag_s)
        dist = low.sum(
            low.lut_exact(diff, torch.abs, f"{name}.abs", tag_s, rounding), -1, f"{name}.l1", tag_s
        )  # Eq. (5)
        z = low.expand_dims(shifted(dist), -1, f"{name}.z.e")  # (nh, T, T, 1) or (nh, P, 1)

    def keys(x: QValue, label: str) -> QValue:  # V_j beside Z'_ij: (nh, 1, T, dh) or (nh, P, dh)
        if causal:
            return _causal.keys(low, x, f"{name}.{label}.e", tag_h)
        return low.expand_dims(x, -3, f"{name}.{label}.e")

    def over_keys(x: QValue) -> QValue:  # Σ_j
        if causal:
            return _causal.sum_per_query(low, x, T, f"{name}.h", tag_h, mean_len)
        h = low.sum(x, -2, f"{name}.h", tag_h)
        return h if mean_len is None else low.rescaled(h, 1.0 / mean_len)

    if not mixer.signed:
        t = low.sub(keys(v, "v"), z, f"{name}.vz", tag_h)  # V_jk − Z'_ij
        t = low.lut_exact(t, torch.relu, f"{name}.relu", tag_h, rounding)  # Eq. (6)
        return over_keys(t)
    v_pos = low.lut_exact(v, torch.relu, f"{name}.v.pos", tag_h)  # V⁺
    v_neg = low.sub(v, v_pos, f"{name}.v.neg", tag_h)  # V⁻ = V − V⁺, free
    pos = low.sub(keys(v_pos, "vp"), z, f"{name}.vpz", tag_h)
    pos = low.lut_exact(pos, torch.relu, f"{name}.relu.pos", tag_h, rounding)  # (V⁺ − Z')⁺
    neg = low.add(keys(v_neg, "vn"), z, f"{name}.vnz", tag_h)
    neg = low.lut_exact(
        neg, lambda t: torch.clamp(t, max=0), f"{name}.relu.neg", tag_h, rounding
    )  # (V⁻ + Z')⁻
    return over_keys(low.add(pos, neg, f"{name}.pn", tag_h))  # Eq. (7)


def pair_matrices(T: int) -> tuple[np.ndarray, np.ndarray]:
    """For the pairs p = (i, j), i < j, of T positions: D (P, T) with D @ q = q_i − q_j, and
    S (T·T, P) with (S @ z)[i·T + j] = z_p for p = {i, j} (0 on the diagonal)."""
    pairs = list(itertools.combinations(range(T), 2))
    d = np.zeros((len(pairs), T), dtype=np.int64)
    s = np.zeros((T * T, len(pairs)), dtype=np.int64)
    for p, (i, j) in enumerate(pairs):
        d[p, i], d[p, j] = 1, -1
        s[i * T + j, p] = s[j * T + i, p] = 1
    return d, s


def _tied_scores(
    low: Lowering,
    q: QValue,
    shifted,
    diagonal: float,
    z_q: Quantizer,
    name: str,
    tag: str,
    rounding,
) -> QValue:
    """Z' of Eq. (5) for K = Q as (nh, T, T, 1): |q_i − q_j| and Z'_ij for the T(T − 1)/2 pairs
    only (one lookup each instead of T²), mirrored by a clear 0/1 matrix (free); the diagonal,
    where Z = 0, is the constant (−α)⁺."""
    nh, T, _ = q.shape
    d, s = pair_matrices(T)
    diff = low.matmul_left(d, q, f"{name}.diff", tag, integer=True)  # (nh, P, dh)
    dist = low.sum(
        low.lut_exact(diff, torch.abs, f"{name}.abs", tag, rounding), -1, f"{name}.l1", tag
    )  # (nh, P)
    z = low.expand_dims(shifted(dist), -1, f"{name}.z.p")  # (nh, P, 1)
    z = low.matmul_left(s, z, f"{name}.z.mirror", tag, integer=True)  # (nh, T·T, 1)
    z = low.reshape(z, (nh, T, T, 1), f"{name}.z.e")
    c = int(z_q.quantize_np(np.array(diagonal)))
    if c:
        z = low.add_const(z, np.eye(T)[:, :, None] * c * z_q.scale, f"{name}.z.diag", tag)
    return z
