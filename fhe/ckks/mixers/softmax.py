"""Dot-product softmax attention and DCT-Former under CKKS: exp by a Chebyshev polynomial,
Goldschmidt 1/x.

The PowerSoftmax paper's Table 5 baseline in a whole model: e_ij = exp(s_ij) by a polynomial fitted
with relative error ≤ ``activation_tol`` on the calibrated score interval (no row max: the interval
is the calibration's), the row sums' 1/x by Goldschmidt on their calibrated interval (its scale D
folded into the polynomial's coefficients), and (Σ_j e_ij v_j)·(1/a_i) as in the PowerSoftmax
lowering.

DCT-Former (Alg. 1): Q̄ = D̄Q, K̄ = D̄K, V̄ = D̄V are clear linear maps of the sequence, so they
fold into the projections (no level), attention runs on n̄ compressed tokens, and D̄ᵀ folds into the
output projection: the n̄² cost of the paper, for free linear algebra.
"""

from __future__ import annotations

import math

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, Val
from fhe.ckks.mixers import register_poly_mixer
from fhe.errors import FheError
from models.config import AttentionKind


@register_poly_mixer(AttentionKind.DOT_PRODUCT)
def lower(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    return lower_softmax(prog, ar, f"{tag}.attention", key, x, np.eye(prog.config.seq_len))


@register_poly_mixer(AttentionKind.DCT)
def lower_dct(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    cfg = prog.config
    if cfg.dct_ideal:
        raise FheError(
            "DCT-Former's Algorithm 2 (--dct-ideal) is for evaluation only; compile the model "
            "trained with Algorithm 1"
        )
    n_bar = min(cfg.dct_n_bar or max(1, cfg.seq_len // 2), cfg.seq_len)
    return lower_softmax(prog, ar, f"{tag}.attention", key, x, dct_matrix(cfg.seq_len, n_bar))


def dct_matrix(n: int, m: int) -> np.ndarray:
    """D̄ (m × n) of the float model (models.attention.functional.dct_matrix), in float64 (torch
    imported here: a server of another kind loads its program without it)."""
    import torch

    from models.attention import functional as AF

    return AF.dct_matrix(n, m, dtype=torch.float64).numpy()


def lower_softmax(prog, ar: Arith, tag: str, key: str, x: Affine, seq: np.ndarray) -> Affine:
    """softmax(QKᵀ/√d)V on the sequence map ``seq`` (n × T: identity, or DCT-Former's D̄)."""
    cfg, w = prog.config, prog.weights
    T, C, H, dh = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_head
    n = seq.shape[0]
    n_exp, n_rec = f"{tag}.scores.exp", f"{tag}.reciprocal"
    mid, half = prog.fit_map(n_exp)
    D = prog.ops.get(n_rec, {}).get("scale", 1.0)
    S = np.kron(seq, np.eye(C))  # the sequence map on the flattened (T·C) values

    def proj(name: str, scale: float) -> list[Val]:
        m = S @ per_position(w[f"{key}.{name}.weight"], T) * scale
        return x.apply(m, S @ np.tile(w[f"{key}.{name}.bias"], T) * scale).materialize(ar)

    with ar.stage(f"{tag}.qkv"):  # t = (s − mid)/half: 1/√d and 1/half folded into W_q
        q, k, v = (
            proj("q_proj", 1 / (math.sqrt(dh) * half)),
            proj("k_proj", 1.0),
            proj("v_proj", 1.0),
        )
    # masks (dot-product: n = T): causal pairs j > i are never computed (Eq. 11, public); a padded
    # model's key mask m_j (encrypted) multiplies e_ij (one level): softmax over the kept keys
    keys = [range(i + 1) if cfg.causal else range(n) for i in range(n)]
    mask = prog.key_mask
    o: list[Val | None] = [None] * (n * C)
    for head in range(H):
        cols = range(head * dh, (head + 1) * dh)
        with ar.stage(f"{tag}.scores"):
            t = [
                ar.add_scalar(
                    ar.sum([ar.mul(q[i * C + c], k[j * C + c]) for c in cols]), -mid / half
                )
                for i in range(n)
                for j in keys[i]
            ]
            flat = prog.approximate(ar, n_exp, t, np.exp, scale=1 / D)  # exp(s_ij)/D
            e: list[list[Val]] = []
            for i in range(n):
                row, flat = flat[: len(keys[i])], flat[len(keys[i]) :]
                if mask is not None:
                    row = [ar.mul(r, mask[j]) for r, j in zip(row, keys[i], strict=True)]
                e.append(row)
        with ar.stage(f"{tag}.reciprocal"):
            a = [ar.sum(row) for row in e]
            prog._observe(ar, n_rec, a)
            if n_rec in prog.ops:
                y = [A.goldschmidt_reciprocal(ar, ai, prog.ops[n_rec]["iterations"]) for ai in a]
            else:
                y = [Val(1 / ai.data, ai.level) for ai in a]
        with ar.stage(f"{tag}.values"):
            for i in range(n):
                for c in cols:
                    terms = zip(e[i], keys[i], strict=True)
                    num = ar.sum([ar.mul(eij, v[j * C + c]) for eij, j in terms])
                    o[i * C + c] = ar.mul(num, y[i])
    out = per_position(w[f"{key}.out_proj.weight"], T) @ S.T  # D̄ᵀ, then the output projection
    return Affine([(o, out)], np.tile(w[f"{key}.out_proj.bias"], T))
