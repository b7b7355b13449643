"""Activator / GEGLU-only unit (Activator paper Eqs. 8-10)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith
from fhe.ckks.mixers import register_packed_mixer, register_poly_mixer
from fhe.ckks.packing import PVec, Rotations
from models.config import Activation, AttentionKind, NormKind

if TYPE_CHECKING:
    from fhe.ckks.packed import PackedProgram


@register_poly_mixer(AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY)
def lower(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    return lower_geglu(prog, ar, f"{tag}.geglu", key, x)


def lower_geglu(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    """Activator / GEGLU-only unit (Activator paper Eqs. 8-10): down(LN(up₁x) ⊙ LN(GELU(up₂x)))."""
    w, T = prog.weights, prog.config.seq_len
    hidden = w[f"{key}.up_value.weight"].shape[0]
    u = x.apply(per_position(w[f"{key}.up_value.weight"], T), np.tile(w[f"{key}.up_value.bias"], T))
    g = x.apply(per_position(w[f"{key}.up_gate.weight"], T), np.tile(w[f"{key}.up_gate.bias"], T))
    vals, scale, offset = prog._activation(ar, f"{tag}.gelu", g, Activation.GELU)
    gate_map = Affine.scaled(vals, scale, offset, len(vals))
    gate = vals
    if prog.config.norm is NormKind.LAYERNORM:
        u = prog._layernorm(ar, f"{tag}.norm_value", u, hidden)
        normed = prog._layernorm(ar, f"{tag}.norm_gate", gate_map, hidden)
        with ar.stage(f"{tag}.gate"):
            gate = normed.materialize(ar)
    elif (scale, offset) != (1.0, 0.0):
        with ar.stage(f"{tag}.gate"):
            gate = gate_map.materialize(ar)
    with ar.stage(f"{tag}.gate"):
        prod = [ar.mul(a, b) for a, b in zip(u.materialize(ar), gate, strict=True)]
    return Affine(
        [(prod, per_position(w[f"{key}.down.weight"], T))], np.tile(w[f"{key}.down.bias"], T)
    )


@register_packed_mixer(AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY)
def lower_packed(
    pk: PackedProgram, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine
) -> Affine:
    return lower_packed_geglu(pk, ar, rot, f"{tag}.geglu", key, x)


def lower_packed_geglu(
    pk: PackedProgram, ar: Arith, rot: Rotations, tag: str, key: str, x: Affine
) -> Affine:
    """The same unit on one packed sample: every map by the diagonal method, LayerNorm as in the
    packed program (position-wise maps, Newton 1/√)."""
    w, T = pk.program.weights, pk.T
    hidden = w[f"{key}.up_value.weight"].shape[0]
    lay = pk.layout(hidden)
    u = x.apply(per_position(w[f"{key}.up_value.weight"], T), np.tile(w[f"{key}.up_value.bias"], T))
    g = x.apply(per_position(w[f"{key}.up_gate.weight"], T), np.tile(w[f"{key}.up_gate.bias"], T))
    gate, scale, offset = pk.activation(ar, rot, f"{tag}.gelu", g, lay, Activation.GELU)
    gate_map = Affine.scaled(gate, scale, offset, lay.size)
    if pk.program.config.norm is NormKind.LAYERNORM:
        u = pk.layernorm(ar, rot, f"{tag}.norm_value", u, hidden)
        normed = pk.layernorm(ar, rot, f"{tag}.norm_gate", gate_map, hidden)
        with ar.stage(f"{tag}.gate"):
            gate = pk.materialize(ar, rot, f"{tag}.norm_gate.out", normed, lay)
    elif (scale, offset) != (1.0, 0.0):
        with ar.stage(f"{tag}.gate"):
            gate = pk.materialize(ar, rot, f"{tag}.gate.out", gate_map, lay)
    with ar.stage(f"{tag}.gate"):
        prod = ar.mul(pk.materialize(ar, rot, f"{key}.up_value", u, lay).val, gate.val)
    return Affine(
        [(PVec(prod, lay), per_position(w[f"{key}.down.weight"], T))],
        np.tile(w[f"{key}.down.bias"], T),
    )
