"""The Inhibitor under CKKS (Inhibitor paper Eqs. 5-7): |x| and ReLU by Chebyshev polynomials.

TFHE evaluates |·| and (·)⁺ exactly by table lookups; CKKS has only additions and products, so each is
a polynomial fitted on its calibrated interval (error ≤ ``activation_tol`` × max|x| there, see
:func:`fhe.ckks.approx.abs_fit`). The Inhibitor keeps its one FHE virtue here: no ciphertext ×
ciphertext product outside those polynomials. Its cost is their number, T²·d per head and layer,
each a degree-~20-30 polynomial (depth ~5): the comparison with PowerSoftmax is the point of compiling it.

    t_ijc = (q_ic − k_jc − mid)/half        1/half folded into W_q and W_k: no level
    Z'_ij = (Σ_c |·|/γ − α)⁺               Eq. 5 (one map into the ReLU's interval, one level)
    H_ic  = Σ_j (V_jc − Z'_ij)⁺            Eq. 6; signed (Eq. 7): Σ_j (V⁺ − Z')⁺ − (|V⁻| − Z')⁺
"""

from __future__ import annotations

import math

import numpy as np

from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, Val
from fhe.ckks.mixers import register_poly_mixer
from models.config import AttentionKind


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


@register_poly_mixer(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)
def lower(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    return lower_inhibitor(prog, ar, f"{tag}.attention", key, x)


def _mapped(ar: Arith, prog, name: str, vals: list[Val], weights: list[float], bias: float = 0.0) -> Val:
    """Σ wᵢ vᵢ + b mapped into the interval of approximation ``name`` (one level)."""
    mid, half = prog.fit_map(name)
    return ar.lincomb(vals, [wi / half for wi in weights], (bias - mid) / half)


def lower_inhibitor(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    cfg, w = prog.config, prog.weights
    T, C, H, dh = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_head
    gamma, alpha = cfg.inhibitor_gamma or math.sqrt(dh), cfg.inhibitor_alpha
    signed = cfg.attention is AttentionKind.SIGNED_INHIBITOR
    n_abs, n_z = f"{tag}.scores.abs", f"{tag}.scores.inhibit"
    n_pos, n_neg, n_vp = f"{tag}.values.inhibit", f"{tag}.values_neg.inhibit", f"{tag}.v_pos.inhibit"
    mid, half = prog.fit_map(n_abs)
    with ar.stage(f"{tag}.qkv"):
        q = x.apply(per_position(w[f"{key}.q_proj.weight"], T) / half, np.tile(w[f"{key}.q_proj.bias"], T) / half)
        k = x.apply(per_position(w[f"{key}.k_proj.weight"], T) / half, np.tile(w[f"{key}.k_proj.bias"], T) / half)
        v = x.apply(per_position(w[f"{key}.v_proj.weight"], T), np.tile(w[f"{key}.v_proj.bias"], T))
        q, k, v = q.materialize(ar), k.materialize(ar), v.materialize(ar)
    if signed:
        with ar.stage(f"{tag}.values"):
            v_pos = prog.approximate(ar, n_vp, [_mapped(ar, prog, n_vp, [vi], [1.0]) for vi in v], _relu)
            v_neg = [ar.add(p, ar.neg(vi)) for p, vi in zip(v_pos, v, strict=True)]  # |V⁻| = V⁺ − V, free
    o: list[Val | None] = [None] * (T * C)
    for head in range(H):
        cols = range(head * dh, (head + 1) * dh)
        with ar.stage(f"{tag}.scores"):
            t = [ar.add_scalar(ar.add(q[i * C + c], ar.neg(k[j * C + c])), -mid / half)
                 for i in range(T) for j in range(T) for c in cols]
            a = prog.approximate(ar, n_abs, t, np.abs)  # |Q_ic − K_jc|, Eq. 5
            dist = [ar.sum(a[(i * T + j) * dh:(i * T + j + 1) * dh]) for i in range(T) for j in range(T)]
            z = prog.approximate(ar, n_z, [_mapped(ar, prog, n_z, [d], [1 / gamma], -alpha) for d in dist], _relu)
        with ar.stage(f"{tag}.values"):
            for c in cols:
                src = v_pos if signed else v
                pos = prog.approximate(ar, n_pos, [_mapped(ar, prog, n_pos, [src[j * C + c], z[i * T + j]], [1, -1])
                                                   for i in range(T) for j in range(T)], _relu)
                if signed:
                    neg = prog.approximate(ar, n_neg, [_mapped(ar, prog, n_neg, [v_neg[j * C + c], z[i * T + j]],
                                                               [1, -1]) for i in range(T) for j in range(T)], _relu)
                    pos = [ar.add(p, ar.neg(n)) for p, n in zip(pos, neg, strict=True)]
                for i in range(T):
                    o[i * C + c] = ar.sum(pos[i * T:(i + 1) * T])  # Eq. 6 / 7
    return Affine([(o, per_position(w[f"{key}.out_proj.weight"], T))], np.tile(w[f"{key}.out_proj.bias"], T))
