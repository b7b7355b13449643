"""Activator / GEGLU-only unit (Activator paper Eqs. 8-10)."""

from __future__ import annotations

import numpy as np

from fhe.ckks.affine import Affine, per_position
from fhe.ckks.arith import Arith
from fhe.ckks.mixers import register_poly_mixer
from models.config import Activation, AttentionKind, NormKind


@register_poly_mixer(AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY)
def lower(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    return lower_geglu(prog, ar, f"{tag}.geglu", key, x)


def lower_geglu(prog, ar: Arith, tag: str, key: str, x: Affine) -> Affine:
    """Activator / GEGLU-only unit (Activator paper Eqs. 8-10): down(LN(up₁x) ⊙ LN(GELU(up₂x)))."""
    w, T = prog.weights, prog.config.seq_len
    hidden = w[f"{key}.up_value.weight"].shape[0]
    u = x.apply(per_position(w[f"{key}.up_value.weight"], T), np.tile(w[f"{key}.up_value.bias"], T))
    g = x.apply(per_position(w[f"{key}.up_gate.weight"], T), np.tile(w[f"{key}.up_gate.bias"], T))
    gate = prog._activation(ar, f"{tag}.gelu", g, Activation.GELU)
    if prog.config.norm is NormKind.LAYERNORM:
        u = prog._layernorm(ar, f"{tag}.norm_value", u, hidden)
        normed = prog._layernorm(ar, f"{tag}.norm_gate", Affine([(gate, np.eye(len(gate)))], np.zeros(len(gate))),
                                 hidden)
        with ar.stage(f"{tag}.gate"):
            gate = normed.materialize(ar)
    with ar.stage(f"{tag}.gate"):
        prod = [ar.mul(a, b) for a, b in zip(u.materialize(ar), gate, strict=True)]
    return Affine([(prod, per_position(w[f"{key}.down.weight"], T))], np.tile(w[f"{key}.down.bias"], T))

