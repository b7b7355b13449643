"""The Inhibitor under CKKS (Inhibitor paper Eqs. 5-7): |x| and ReLU by Chebyshev polynomials.

TFHE evaluates |·| and (·)⁺ exactly by table lookups; CKKS has only additions and products, so each
is a polynomial fitted on its calibrated interval (error ≤ ``activation_tol`` × max|x| there, see
:func:`fhe.ckks.approx.abs_fit`). The Inhibitor keeps its one FHE virtue here: no ciphertext ×
ciphertext product outside those polynomials. Its cost is their number, T²·d per head and layer,
each a degree-~20-30 polynomial (depth ~5): the comparison with PowerSoftmax is the point of
compiling it.

    t_ijc = (q_ic − k_jc − mid)/half        1/half folded into W_q and W_k: no level
    Z'_ij = (Σ_c |·|/γ − α)⁺               Eq. 5 (one map into the ReLU's interval, one level)
    H_ic  = Σ_j (V_jc − Z'_ij)⁺            Eq. 6; signed (Eq. 7): Σ_j (V⁺ − Z')⁺ − (|V⁻| − Z')⁺

Masks, as the float model (``functional.inhibitor``: the sums over j skip the removed keys): causal
pairs j > i are never computed; a padded model's terms are multiplied by the client's encrypted key
mask m_j (one level). ``inhibitor_mean`` scales query i's sums by a public 1 / T or m_i / n,
folded into the output projection (no level).

Packed (one sample in the slots, :func:`lower_packed_inhibitor`): the same equations on all T
relative offsets at once, block r of the attention period holding key (i + r) mod T beside query i,
as the packed softmax family does (:mod:`fhe.ckks.mixers.packed_softmax`): one |x| polynomial, one
head-sum map that also broadcasts Z' back to the head's channels, one ReLU per value sign, a
rotate-and-add over the blocks for Σ_j.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fhe.ckks import approx as A
from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith, Val
from fhe.ckks.mixers import register_packed_mixer, register_poly_mixer
from fhe.ckks.packing import Layout, PVec, Rotations, apply_maps, pow2, rotate_and_sum
from fhe.errors import FheError
from models.config import AttentionKind, inhibitor_mean_scale

if TYPE_CHECKING:
    from fhe.ckks.packed import PackedProgram


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


@register_poly_mixer(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)
def lower(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    return lower_inhibitor(prog, ar, f"{tag}.attention", key, x)


def _mapped(
    ar: Arith, prog, name: str, vals: list[Val], weights: list[float], bias: float = 0.0
) -> Val:
    """Σ wᵢ vᵢ + b mapped into the interval of approximation ``name`` (one level)."""
    mid, half = prog.fit_map(name)
    return ar.lincomb(vals, [wi / half for wi in weights], (bias - mid) / half)


def lower_inhibitor(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    cfg, w = prog.config, prog.weights
    T, C, H, dh = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_head
    gamma, alpha = cfg.inhibitor_gamma or math.sqrt(dh), cfg.inhibitor_alpha
    signed = cfg.attention is AttentionKind.SIGNED_INHIBITOR
    n_abs, n_z = f"{tag}.scores.abs", f"{tag}.scores.inhibit"
    n_pos, n_neg, n_vp = (
        f"{tag}.values.inhibit",
        f"{tag}.values_neg.inhibit",
        f"{tag}.v_pos.inhibit",
    )
    mid, half = prog.fit_map(n_abs)
    with ar.stage(f"{tag}.qkv"):
        q_map = x.apply(
            per_position(w[f"{key}.q_proj.weight"], T) / half,
            np.tile(w[f"{key}.q_proj.bias"], T) / half,
        )
        k_map = x.apply(
            per_position(w[f"{key}.k_proj.weight"], T) / half,
            np.tile(w[f"{key}.k_proj.bias"], T) / half,
        )
        v_map = x.apply(
            per_position(w[f"{key}.v_proj.weight"], T), np.tile(w[f"{key}.v_proj.bias"], T)
        )
        q, k, v = q_map.materialize(ar), k_map.materialize(ar), v_map.materialize(ar)
    if signed:
        with ar.stage(f"{tag}.values"):
            v_pos = prog.approximate(
                ar, n_vp, [_mapped(ar, prog, n_vp, [vi], [1.0]) for vi in v], _relu
            )
            v_neg = [
                ar.add(p, ar.neg(vi)) for p, vi in zip(v_pos, v, strict=True)
            ]  # |V⁻| = V⁺ − V, free
    # the (i, j) pairs computed: causal (Eq. 11, public) keeps j <= i only; a padded model's key
    # mask m_j (encrypted) multiplies each pair's term (one level)
    pairs = [(i, j) for i in range(T) for j in (range(i + 1) if cfg.causal else range(T))]
    mask = prog.key_mask
    o: list[Val | None] = [None] * (T * C)
    for head in range(H):
        cols = range(head * dh, (head + 1) * dh)
        with ar.stage(f"{tag}.scores"):
            t = [
                ar.add_scalar(ar.add(q[i * C + c], ar.neg(k[j * C + c])), -mid / half)
                for i, j in pairs
                for c in cols
            ]
            a = prog.approximate(ar, n_abs, t, np.abs)  # |Q_ic − K_jc|, Eq. 5
            dist = [ar.sum(a[n * dh : (n + 1) * dh]) for n in range(len(pairs))]
            z = prog.approximate(
                ar, n_z, [_mapped(ar, prog, n_z, [d], [1 / gamma], -alpha) for d in dist], _relu
            )
        with ar.stage(f"{tag}.values"):
            for c in cols:
                src = v_pos if signed else v
                pos = prog.approximate(
                    ar,
                    n_pos,
                    [
                        _mapped(ar, prog, n_pos, [src[j * C + c], z[n]], [1, -1])
                        for n, (i, j) in enumerate(pairs)
                    ],
                    _relu,
                )
                if signed:
                    neg = prog.approximate(
                        ar,
                        n_neg,
                        [
                            _mapped(ar, prog, n_neg, [v_neg[j * C + c], z[n]], [1, -1])
                            for n, (i, j) in enumerate(pairs)
                        ],
                        _relu,
                    )
                    pos = [ar.add(p, ar.neg(n)) for p, n in zip(pos, neg, strict=True)]
                if mask is not None:
                    pos = [ar.mul(term, mask[j]) for term, (_, j) in zip(pos, pairs, strict=True)]
                for i in range(T):  # Eq. 6 / 7: Σ over the keys query i keeps
                    row = [term for term, p in zip(pos, pairs, strict=True) if p[0] == i]
                    o[i * C + c] = ar.sum(row)
    return Affine([(o, _out_proj(cfg, w, key))], np.tile(w[f"{key}.out_proj.bias"], T))


# ------------------------------------------------------------------------------------ packed layout
@register_packed_mixer(AttentionKind.INHIBITOR, AttentionKind.SIGNED_INHIBITOR)
def lower_packed(
    pk: PackedProgram, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine
) -> Affine:
    return lower_packed_inhibitor(pk, ar, rot, f"{tag}.attention", key, x)


def lower_packed_inhibitor(
    pk: PackedProgram, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine
) -> Affine:
    """Eqs. 5-7 on one packed sample. Slots outside the activation (channels c ≥ C of a position)
    are kept at the middle of every fitted interval (t = 0): a Chebyshev fit is only bounded on [−1,
    1], and one slot far outside it would overflow the ciphertext's modulus for all the others."""
    prog = pk.program
    cfg, w = prog.config, prog.weights
    T, C, H, dh, S = cfg.seq_len, cfg.d_model, cfg.n_heads, cfg.d_head, pk.stride
    if (
        pow2(T) != T
    ):  # padding keys (zeros) would put |q − 0| outside the calibrated interval of |q − k|
        raise FheError(
            f"the packed Inhibitor needs a power-of-two sequence length (T = {T}); use --layout "
            "batch"
        )
    gamma, alpha = cfg.inhibitor_gamma or math.sqrt(dh), cfg.inhibitor_alpha
    signed = cfg.attention is AttentionKind.SIGNED_INHIBITOR
    n_abs, n_z = f"{tag}.scores.abs", f"{tag}.scores.inhibit"
    lay, packed, n_blocks = pk.layout(C), pk.pack_attention, pk.block // S
    coeffs = {
        name: tuple(prog.ops[name]["coeffs"]) for name in prog.ops if name.startswith(f"{tag}.")
    }

    def proj(name: str, role: str, scale: float = 1.0, shift: float = 0.0) -> Val:
        """(W x + b − shift)·scale on the real slots; ``role`` names the map (one projection, two
        uses)."""
        aff = x.apply(
            per_position(w[f"{key}.{name}.weight"], T) * scale,
            (np.tile(w[f"{key}.{name}.bias"], T) - shift) * scale,
        )
        return pk.materialize(ar, rot, f"{key}.{name}.{role}", aff, lay).val

    # offset r: block r of one ciphertext (packed) or ciphertext r; the masks keep the real slots of
    # each
    blocks = (
        [Layout(T, C, S, pk.attention_period, offset=r * pk.block) for r in range(n_blocks)]
        if packed
        else [lay] * n_blocks
    )
    real = (
        [pk.placed((tag, "real", r), np.ones(T * C), b) for r, b in enumerate(blocks)]
        if packed
        else [pk.placed((tag, "real", 0), np.ones(T * C), lay)] * n_blocks
    )

    def offsets(v: Val) -> list[Val]:
        """v_{(i + r) mod T} beside query i: all offsets in one ciphertext, or one ciphertext
        each."""
        shifted = pk.shifted(ar, v)
        return (
            [ar.dot_plain(shifted, real)]
            if packed
            else [ar.dot_plain([s], [m]) for s, m in zip(shifted, real, strict=True)]
        )

    mid, half = prog.fit_map(n_abs)
    with ar.stage(f"{tag}.qkv"):
        q, k = (
            proj("q_proj", "abs", 1 / half, mid),
            proj("k_proj", "abs", 1 / half),
        )  # t = (q − k − mid)/half
        # (values, interval name): V, or V⁺ and |V⁻| = V⁺ − V (Eq. 7)
        if signed:
            n_vp = f"{tag}.v_pos.inhibit"
            vmid, vhalf = prog.fit_map(n_vp)
            v_pos = A.poly_eval(ar, proj("v_proj", "v_pos", 1 / vhalf, vmid), coeffs[n_vp])
            v_pos = ar.dot_plain(
                [v_pos], [pk.placed((tag, "real"), np.ones(T * C), lay)]
            )  # 0 off the activation
            sources = [
                (v_pos, f"{tag}.values.inhibit"),
                (ar.add(v_pos, ar.neg(proj("v_proj", "v"))), f"{tag}.values_neg.inhibit"),
            ]
        else:
            sources = [(proj("v_proj", "v"), f"{tag}.values.inhibit")]
    zmid, zhalf = prog.fit_map(n_z)
    sums = np.kron(np.eye(T * H), np.ones((dh, dh))) / (
        gamma * zhalf
    )  # Σ_c over a head, back to its channels
    z_bias = pk.placed((tag, "z_bias"), np.full(T * C, (-alpha - zmid) / zhalf), lay)
    outs = []
    with ar.stage(f"{tag}.scores"):
        k_all = offsets(k)
        zs = []
        for kg in k_all:
            a = A.poly_eval(ar, ar.add(q, ar.neg(kg)), coeffs[n_abs])  # |Q_ic − K_jc|, Eq. 5
            terms = (
                [(a, pk.map_of((tag, "dist", r), sums, b, b)) for r, b in enumerate(blocks)]
                if packed
                else [(a, pk.map_of((tag, "dist"), sums, lay, lay))]
            )
            zs.append(
                A.poly_eval(ar, apply_maps(ar, terms, z_bias, rot, pk.n_slots), coeffs[n_z])
            )  # Z'
            del a
    with ar.stage(f"{tag}.values"):
        keep = pk.pair_keep(ar, rot, tag)  # masks: the removed pairs' terms set to 0, one level
        c0 = coeffs[n_z][0]  # Z' off the activation (t = 0 there)
        for src, name in sources:
            vmid, vhalf = prog.fit_map(name)

            # real slots: −mid/half; elsewhere +Z'(0)/half, which puts t back at 0 there
            def shift(m: float = vmid, h: float = vhalf) -> np.ndarray:
                return lay.place(np.full(T * C, -(m + c0) / h), pk.n_slots) + c0 / h

            b = pk.cached((tag, name), shift)
            ts = [
                ar.add_plain(ar.lincomb([vg, zg], [1 / vhalf, -1 / vhalf]), b)
                for vg, zg in zip(offsets(src), zs, strict=True)
            ]
            relu = pk.apply_keep(ar, [A.poly_eval(ar, t, coeffs[name]) for t in ts], keep)
            outs.append(rotate_and_sum(ar, relu[0], pk.block, n_blocks) if packed else ar.sum(relu))
    o = outs[0] if not signed else ar.add(outs[0], ar.neg(outs[1]))  # Eq. 6, or Eq. 7's difference
    return Affine([(PVec(o, lay), _out_proj(cfg, w, key))], np.tile(w[f"{key}.out_proj.bias"], T))


def _out_proj(cfg, w: dict, key: str) -> np.ndarray:
    """The output projection per position, (T·C, T·C); with ``inhibitor_mean``, query i's sums
    scaled by 1 / T or m_i / n (:func:`models.config.inhibitor_mean_scale`) folded into its
    columns: no level, no rotation."""
    T, C = cfg.seq_len, cfg.d_model
    out = per_position(w[f"{key}.out_proj.weight"], T)
    if cfg.inhibitor_mean:
        out = out * np.repeat(inhibitor_mean_scale(T, cfg.causal), C)[None, :]
    return out
