"""Length-agnostic PowerSoftmax attention (PowerSoftmax paper Eq. 7) with Goldschmidt 1/x."""

from __future__ import annotations

import math

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, Val
from fhe.ckks.mixers import register_poly_mixer
from models.config import AttentionKind


@register_poly_mixer(AttentionKind.POWER_SOFTMAX)
def lower(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    return lower_power_softmax(prog, ar, f"{tag}.attention", key, x)


def lower_power_softmax(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    """Length-agnostic PowerSoftmax attention (Eq. 7), Goldschmidt 1/x on the calibrated
    interval. Causal (Eq. 11, M_ij = [j <= i], public): the removed scores are never computed and
    ε counts once per kept key, (x_j^p / L) / (ε·(i + 1) / L + Mean_j x_j^p), as the float model;
    query i is scaled by (T / (i + 1))^(1/p) (free: folded into Q's projection), so that its row
    sum is a mean over its i + 1 keys, on the same interval as a full row's, with ε as it is."""
    cfg, w = prog.config, prog.weights
    T, C, H, dh, p = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.power_p
    keys = [range(i + 1) if cfg.causal else range(T) for i in range(T)]  # the j query i reads
    rows = causal_row_scale(T, p) if cfg.causal else np.ones(T)
    name = f"{tag}.reciprocal"
    calibrating = prog._calibrating(name, ar)
    op = prog.ops.get(name, {})
    D = op.get("scale", 1.0)
    cq = 1 / (math.sqrt(dh) * (T * D) ** (1 / p))  # 1/√d, Eq. 7's 1/L and Goldschmidt's 1/D, folded
    cq_rows = np.repeat(rows * cq, C)  # per query position
    with ar.stage(f"{tag}.qkv"):
        q_map = x.apply(
            per_position(w[f"{key}.q_proj.weight"], T) * cq_rows[:, None],
            np.tile(w[f"{key}.q_proj.bias"], T) * cq_rows,
        )
        q = q_map.materialize(ar)
        k_map = x.apply(
            per_position(w[f"{key}.k_proj.weight"], T), np.tile(w[f"{key}.k_proj.bias"], T)
        )
        k = k_map.materialize(ar)
        v_map = x.apply(
            per_position(w[f"{key}.v_proj.weight"], T), np.tile(w[f"{key}.v_proj.bias"], T)
        )
        v = v_map.materialize(ar)
        mask = prog.key_mask
        if mask is not None:  # a padding key's K is 0: s_ij = 0 and s_ijᵖ = 0 (Eq. 11's x ⊙ M)
            k = [ar.mul(k[j * C + c], mask[j]) for j in range(T) for c in range(C)]
    o: list[Val | None] = [None] * (T * C)
    for head in range(H):
        cols = range(head * dh, (head + 1) * dh)
        with ar.stage(f"{tag}.scores"):
            s = [
                [ar.sum([ar.mul(q[i * C + c], k[j * C + c]) for c in cols]) for j in keys[i]]
                for i in range(T)
            ]
        with ar.stage(f"{tag}.power"):
            sp = [[A.power_even(ar, sij, p) for sij in row] for row in s]  # (s_ij/L')^p / D
        del s  # ciphertexts are large: keep only what later stages read
        with ar.stage(f"{tag}.reciprocal"):
            eps = prog._inference_eps()
            # (ε + Mean_j s_ijᵖ)/D, Eq. 7 (causal: the mean over the keys of the row); with a key
            # mask, ε once per kept key: ε·Σ_j m_j/T (times the row's causal scale)
            if mask is None:
                a = [ar.add_scalar(ar.sum(row), eps / D) for row in sp]
            else:
                a = [
                    ar.add(
                        ar.sum(row),
                        ar.lincomb(
                            [ar.sum([mask[j] for j in keys[i]])], [eps * rows[i] ** p / (T * D)]
                        ),
                    )
                    for i, row in enumerate(sp)
                ]
            prog._observe(ar, name, a)
            if calibrating:
                y = [Val(1 / ai.data, ai.level) for ai in a]
            else:
                y = [A.goldschmidt_reciprocal(ar, ai, op["iterations"]) for ai in a]
        with ar.stage(f"{tag}.values"):
            # (Σ_j s_ijᵖ v_j) · (1/a_i): the numerator sum runs while Goldschmidt iterates,
            # so the division costs one level after the reciprocal instead of two
            for i in range(T):
                for c in cols:
                    num = ar.sum([ar.mul(sp[i][n], v[j * C + c]) for n, j in enumerate(keys[i])])
                    o[i * C + c] = ar.mul(num, y[i])
        del sp, a, y
    return Affine(
        [(o, per_position(w[f"{key}.out_proj.weight"], T))], np.tile(w[f"{key}.out_proj.bias"], T)
    )


def causal_row_scale(T: int, p: int) -> np.ndarray:
    """(T,): (T / (i + 1))^(1/p), query i's scale in a causal PowerSoftmax, so that its scores'
    p-th powers sum to T/(i + 1) times its row sum: a mean over its i + 1 keys (the numerator and
    the row sum scale alike, so the weights are unchanged)."""
    return (T / np.arange(1, T + 1)) ** (1 / p)
