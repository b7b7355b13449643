"""Activation polynomials shared by the float models (``models.layers``) and the CKKS programs
(``fhe.ckks.approx``): plain arithmetic, for tensors and numpy arrays alike, so that a CKKS server
imports no torch."""

from __future__ import annotations

from typing import Any

QUAD_COEFFS = (0.5, 0.25, 0.125)  # quad(x) = c₀ + c₁x + c₂x²


def quad(x: Any) -> Any:
    """0.125x² + 0.25x + 0.5: the degree-2 stand-in for GELU of MPCFormer (Li et al., 2023), which
    a CKKS program evaluates exactly (one squaring) where GELU needs a fitted polynomial."""
    c0, c1, c2 = QUAD_COEFFS
    return c2 * x * x + c1 * x + c0
