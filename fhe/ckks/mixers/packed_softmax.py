"""Attention of the softmax family on one packed sample: PowerSoftmax (Eq. 7), dot-product softmax
and DCT-Former (exp by polynomial), each with Goldschmidt 1/x, as their batch lowerings in this
package.

With S the stride and T' = pow2(T), query t sits beside key (t + r) mod T' after r one-position
rotations of k (no level):

    p_r = q ⊙ rot(k, r·S)            r = 0 … T'−1
    s   = Σ_r mask_r ⊙ HeadSum(p_r)   head sums by rotate-and-add; one masked sum puts offset r in
    block r e   = f(s)                        sᵖ or exp(s): one polynomial for all T' offsets at
    once a   = Σ_blocks e (+ ε)            the row sums, by rotate-and-add over blocks o   =
    Σ_blocks (e ⊙ v_all) ⊙ Goldschmidt(a),  v_all: block r = rot(v, r·S)

so the score function, the division and the value product each run once (when the T' blocks do not
fit the slots, :attr:`~fhe.ckks.packed.PackedProgram.pack_attention` is false and they run offset by
offset).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith
from fhe.ckks.mixers import register_packed_mixer
from fhe.ckks.mixers.power_softmax import causal_row_scale
from fhe.ckks.mixers.softmax import dct_matrix
from fhe.ckks.packing import Layout, PVec, Rotations, apply_maps, pow2, rotate_and_sum
from models.config import AttentionKind

if TYPE_CHECKING:
    from fhe.ckks.packed import PackedProgram


@register_packed_mixer(AttentionKind.POWER_SOFTMAX, AttentionKind.DOT_PRODUCT, AttentionKind.DCT)
def lower_packed(
    pk: PackedProgram, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine
) -> Affine:
    return lower_packed_attention(pk, ar, rot, f"{tag}.attention", key, x)


def lower_packed_attention(
    pk: PackedProgram, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine
) -> Affine:
    """The module's equations; DCT-Former runs them on its n̄ compressed positions, D̄ and D̄ᵀ
    folded into the projections."""
    prog, T, S = pk.program, pk.T, pk.stride
    cfg, w = prog.config, prog.weights
    C, H, dh, p = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.power_p
    power = cfg.attention is AttentionKind.POWER_SOFTMAX
    causal = cfg.causal and power  # folded into the head sums; softmax: pk.pair_keep
    seq = (
        dct_matrix(T, min(cfg.dct_n_bar or max(1, T // 2), T))
        if cfg.attention is AttentionKind.DCT
        else np.eye(T)
    )
    n = seq.shape[0]
    rec = prog.ops[f"{tag}.reciprocal"]
    D = rec["scale"]
    if power:
        cq, shift = (
            1 / (np.sqrt(dh) * (T * D) ** (1 / p)),
            0.0,
        )  # 1/√d, Eq. 7's 1/L, Goldschmidt's 1/D
    else:
        exp = prog.ops[f"{tag}.scores.exp"]
        cq, shift = 1 / (np.sqrt(dh) * exp["half"]), -exp["mid"] / exp["half"]  # t = (s − mid)/half
    lay, seq_map = Layout(n, C, S, pk.block), np.kron(seq, np.eye(C))

    def proj(name: str, scale: float | np.ndarray) -> PVec:
        rows = np.broadcast_to(np.asarray(scale, dtype=np.float64), (n * C,))  # per output row
        m = (seq_map @ per_position(w[f"{key}.{name}.weight"], T)) * rows[:, None]
        return pk.materialize(
            ar,
            rot,
            f"{key}.{name}",
            x.apply(m, seq_map @ np.tile(w[f"{key}.{name}.bias"], T) * rows),
            lay,
        )

    if causal:  # each query's row sum as a mean over its keys (power_softmax.causal_row_scale)
        cq = cq * np.repeat(causal_row_scale(T, p), C)
    with ar.stage(f"{tag}.qkv"):
        q, k, v = proj("q_proj", cq), proj("k_proj", 1.0), proj("v_proj", 1.0)
        if power and pk.key_mask is not None:  # a padding key's K is 0: sᵖ = 0 (Eq. 11's x ⊙ M)
            m_all = pk.materialize(ar, rot, "key_mask", pk.mask_of(np.eye(T), C), lay)
            k = PVec(ar.mul(k.val, m_all.val), lay)
    sums = np.kron(np.eye(n * H), np.ones((dh, dh)))  # Σ over a head's channels, broadcast back
    n_blocks = pk.block // S  # T' relative positions, padding included
    shifts, packed = range(n_blocks), pk.pack_attention

    def head_sum(r: int) -> tuple[tuple, np.ndarray]:  # offset r's map key and matrix
        if not causal:
            return ("head_sum",), sums
        return ("head_sum", r, "causal"), np.repeat(pk.causal_keep(n, r), C)[:, None] * sums

    with ar.stage(f"{tag}.scores"):
        # q_t · k_{(t+r) mod T'}, then one masked sum or map: two levels on every product, so q
        # and k are renewed once here (bootstrapping engines) rather than each product later
        qv = ar.before_fanout(q.val, 2)
        prods = [ar.mul(qv, kr) for kr in pk.shifted(ar, k.val, 2)]
        if packed and dh == pow2(dh):
            # Σ over each head's channels lands on its first channel (log₂ dh rotations); one masked
            # sum
            # keeps those slots, offset r in block r; broadcasting back to the head is rotations
            # again
            heads = [rotate_and_sum(ar, pr, 1, dh) for pr in prods]
            masks = pk.head_masks(n, causal)  # causal: Eq. 11's mask folded in
            s = [rotate_and_sum(ar, ar.dot_plain(heads, masks), -1, dh, pk.n_slots)]
        elif packed:  # heads of other widths: the head sums as maps into block r
            dst = [Layout(n, C, S, pk.attention_period, offset=r * pk.block) for r in shifts]
            s = [
                apply_maps(
                    ar,
                    [
                        (pr, pk.map_of(("packed", r, causal), head_sum(r)[1], lay, dst[r]))
                        for r, pr in zip(shifts, prods, strict=True)
                    ],
                    None,
                    rot,
                    pk.n_slots,
                )
            ]
        else:
            s = [
                apply_maps(ar, [(pr, pk.map_of(*head_sum(r), lay, lay))], None, rot, pk.n_slots)
                for r, pr in zip(shifts, prods, strict=True)
            ]
        del prods
    with ar.stage(f"{tag}.power" if power else f"{tag}.exp"):
        if power:
            e = [A.power_even(ar, sr, p) for sr in s]  # (s/L')ᵖ / D; a padding key scores 0, adds 0
            pad = 0.0
        else:  # exp(s)/D; a padding key scores s = 0, adding the constant p(t(0))/D to each row sum
            coeffs = tuple(c / D for c in exp["coeffs"])
            e = [A.poly_eval(ar, ar.add_scalar(sr, shift), coeffs) for sr in s]
            # masks: the removed pairs' e (padding keys included) set to 0, one level
            keep = pk.pair_keep(ar, rot, tag)
            e = pk.apply_keep(ar, e, keep)
            at_zero = float(np.polynomial.polynomial.polyval(shift, coeffs))
            pad = 0.0 if keep else (n_blocks - n) * at_zero
    del s
    with ar.stage(f"{tag}.reciprocal"):
        total = rotate_and_sum(ar, e[0], pk.block, n_blocks) if packed else ar.sum(e)
        if pk.key_mask is None or not power:
            a = ar.add_scalar(total, (prog._inference_eps() if power else 0.0) / D - pad)
        else:  # ε once per kept key: ε·Σ_j m_j / T at query t (j <= t when causal), times its scale
            reach = np.tril(np.ones((T, T))) if causal else np.ones((T, T))
            scale = (causal_row_scale(T, p) if causal else np.ones(T)) ** p
            kept = pk.materialize(ar, rot, "kept_keys", pk.mask_of(reach, C), lay)
            weights = lay.place(np.repeat(prog._inference_eps() * scale / (T * D), C), pk.n_slots)
            a = ar.add(total, ar.dot_plain([kept.val], [weights]))
        y = A.goldschmidt_reciprocal(ar, a, rec["iterations"])
    with ar.stage(f"{tag}.values"):
        # v_all: block r holds v rotated by r positions (masks: one level, off the critical path)
        if packed:
            v_all = ar.dot_plain(pk.shifted(ar, v.val), pk.block_masks(n_blocks))
            num = rotate_and_sum(ar, ar.mul(e[0], v_all), pk.block, n_blocks)
        else:
            num = ar.sum([ar.mul(er, vr) for vr, er in zip(pk.shifted(ar, v.val), e, strict=True)])
        o = ar.mul(num, y)
    out = (
        per_position(w[f"{key}.out_proj.weight"], T) @ seq_map.T
    )  # D̄ᵀ (DCT-Former), then the projection
    return Affine([(PVec(o, lay), out)], np.tile(w[f"{key}.out_proj.bias"], T))
