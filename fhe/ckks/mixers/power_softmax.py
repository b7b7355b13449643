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
    interval."""
    cfg, w = prog.config, prog.weights
    T, C, H, dh, p = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.power_p
    name = f"{tag}.reciprocal"
    calibrating = prog._calibrating(name, ar)
    op = prog.ops.get(name, {})
    D = op.get("scale", 1.0)
    cq = 1 / (math.sqrt(dh) * (T * D) ** (1 / p))  # 1/√d, Eq. 7's 1/L and Goldschmidt's 1/D, folded
    with ar.stage(f"{tag}.qkv"):
        q = x.apply(
            per_position(w[f"{key}.q_proj.weight"], T) * cq,
            np.tile(w[f"{key}.q_proj.bias"], T) * cq,
        )
        q = q.materialize(ar)
        k = x.apply(per_position(w[f"{key}.k_proj.weight"], T), np.tile(w[f"{key}.k_proj.bias"], T))
        k = k.materialize(ar)
        v = x.apply(per_position(w[f"{key}.v_proj.weight"], T), np.tile(w[f"{key}.v_proj.bias"], T))
        v = v.materialize(ar)
    o: list[Val | None] = [None] * (T * C)
    for head in range(H):
        cols = range(head * dh, (head + 1) * dh)
        with ar.stage(f"{tag}.scores"):
            s = [
                [ar.sum([ar.mul(q[i * C + c], k[j * C + c]) for c in cols]) for j in range(T)]
                for i in range(T)
            ]
        with ar.stage(f"{tag}.power"):
            sp = [[A.power_even(ar, sij, p) for sij in row] for row in s]  # (s_ij/L')^p / D
        del s  # ciphertexts are large: keep only what later stages read
        with ar.stage(f"{tag}.reciprocal"):
            eps = prog._inference_eps()
            a = [ar.add_scalar(ar.sum(row), eps / D) for row in sp]  # (ε + Mean_j s_ijᵖ)/D, Eq. 7
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
                    num = ar.sum([ar.mul(sp[i][j], v[j * C + c]) for j in range(T)])
                    o[i * C + c] = ar.mul(num, y[i])
        del sp, a, y
    return Affine(
        [(o, per_position(w[f"{key}.out_proj.weight"], T))], np.tile(w[f"{key}.out_proj.bias"], T)
    )
