"""Activator (Activator paper Eqs. 8-10): a GEGLU unit in place of attention (and GEGLU-only
blocks)."""

from __future__ import annotations

import torch

from models.config import AttentionKind
from quant.lowering import Lowering, QValue
from quant.mixers import register_mixer


@register_mixer(AttentionKind.ACTIVATOR, AttentionKind.GEGLU_ONLY)
def lower(low: Lowering, mixer, h: QValue, name: str, cfg) -> tuple[QValue, torch.nn.Linear]:
    return lower_geglu(low, mixer, h, name)


def lower_geglu(low: Lowering, unit, h: QValue, name: str) -> tuple[QValue, torch.nn.Linear]:
    """Activator GEGLU unit (Eqs. 8-10) without inner norms: Down(Up₁x ⊙ GELU(Up₂x))."""
    u = low.linear(h, unit.up_value.weight, unit.up_value.bias, f"{name}.up", f"{name}.geglu")
    g = low.linear(h, unit.up_gate.weight, unit.up_gate.bias, f"{name}.gate", f"{name}.geglu")
    u = low.requant(u, f"{name}.up.out", f"{name}.geglu", signed=True)  # P1
    g = low.lut(g, torch.nn.functional.gelu, f"{name}.gelu", f"{name}.geglu", signed=True)  # P2
    p = low.requant(
        low.mul(u, g, f"{name}.prod", f"{name}.geglu"),
        f"{name}.prod.out",
        f"{name}.geglu",
        signed=True,
    )
    return p, unit.down
