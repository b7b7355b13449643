"""Encrypted × encrypted products under TFHE, by quarter squares.

    a·b = ⌊(a + b)²/4⌋ − ⌊(a − b)²/4⌋   (exact: a + b and a − b have the same parity)

Two univariate lookups per product, the PBS count of Concrete's own multiplication. We spell it out
because concrete-python 2.11 multiplies an unsigned by a signed operand wrongly (reproduced in
simulation and execution here; see zama-ai/concrete issues #1302 and #1309 for related mixed-sign
miscomputations), and this form is exact for any signs.

The lookups read a + b and a − b, so their width is the operands' joint range. An unsigned by a
signed operand (probabilities times V) spans both signs: u ∈ [0, 15] and v ∈ [−8, 7] give u ± v in
[−8, 23], 6 bits. :func:`product_shifts` moves a signed operand to [0, 2^w − 1] where that narrows
them (v' = v + 8: u ± v' in [−15, 30], 5 bits), and the clear shifts come back leveled:

    a·b = a'·b' − s_b·a − s_a·b − s_a·s_b   (summed over the inner axis for a matmul)

Widths come from each operand's whole width (``Node.bit_range``), not its calibrated range: the
client accepts any value of that width, and the lookups' inputs are hinted to hold all of them.
"""

from __future__ import annotations

import numpy as np

from quant.ir import Node, value_bits


def _quarter_square(t):
    return (t * t) // 4


def _lookup_bits(a: Node, b: Node, sa: int, sb: int) -> tuple[int, int]:
    """(widest, total) width of a' + b' and a' − b' for a' = a + s_a, b' = b + s_b."""
    (alo, ahi), (blo, bhi) = a.bit_range(), b.bit_range()
    alo, ahi, blo, bhi = alo + sa, ahi + sa, blo + sb, bhi + sb
    s, d = value_bits(alo + blo, ahi + bhi), value_bits(alo - bhi, ahi - blo)
    return max(s, d), s + d


def _shift_to_zero(n: Node) -> int:
    lo, _ = n.bit_range()
    return max(0, -lo)


def product_shifts(a: Node, b: Node) -> tuple[int, int]:
    """Clear shifts (s_a, s_b) that make the quarter-square lookups of a·b narrowest: each signed
    operand may move to start at 0. Ties keep the operands as they are."""
    sa, sb = _shift_to_zero(a), _shift_to_zero(b)
    options = [(0, 0), (sa, 0), (0, sb), (sa, sb)]
    return min(options, key=lambda o: _lookup_bits(a, b, *o))  # min keeps the first of equals


def product_lookup_bits(a: Node, b: Node) -> int:
    """Width of what the quarter-square lookups of a·b read (after :func:`product_shifts`)."""
    return _lookup_bits(a, b, *product_shifts(a, b))[0]


def product(op: str, args, srcs: tuple[Node, Node]):
    """The encrypted ``mul`` (elementwise) or ``matmul`` of ``args``, whose graph nodes are
    ``srcs``, as two hinted lookups per product."""
    from concrete import fhe  # the widths above are also read where Concrete is not installed

    a, b = args
    sa, sb = product_shifts(*srcs)
    bits, _ = _lookup_bits(*srcs, sa, sb)
    a2, b2 = a + sa if sa else a, b + sb if sb else b
    if op == "matmul":
        a2, b2 = np.expand_dims(a2, -1), np.expand_dims(b2, -3)  # (..., M, K, 1), (..., 1, K, N)
    square = fhe.univariate(_quarter_square)
    prods = square(fhe.hint(a2 + b2, bit_width=bits)) - square(fhe.hint(a2 - b2, bit_width=bits))
    if op != "matmul":
        return prods - sb * a - sa * b - sa * sb if sa or sb else prods
    out = np.sum(prods, axis=-2)
    if sb:
        out = out - sb * np.sum(a, axis=-1, keepdims=True)  # (..., M, 1)
    if sa:
        out = out - sa * np.sum(b, axis=-2, keepdims=True)  # (..., 1, N)
    return out - a.shape[-1] * sa * sb if sa and sb else out
