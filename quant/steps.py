"""A lookup with few output levels, computed as comparisons that read fewer bits.

A table that is monotone over every value its input's width holds, and takes L levels there, is its
first level plus one step per change:

    f(x) = f(lo) + Σ_t Δ_t · [x >= θ_t],   t = 1 .. L − 1.

Each comparison is exact on a rounded input. With r rounded-away bits and h = 2^(r−1),
round_r(u) >= B (B a multiple of 2^r) holds exactly when u >= B − h (ties round up, as Concrete's
``round_bit_pattern``); so u = x + c with c = B − h − θ_t puts θ_t on a rounding boundary, and the
lookup [round_r(u) >= B] reads r bits fewer than u without moving the threshold. r is the smallest
that brings the lookup to ``bits``; B the smallest multiple of 2^r that keeps u unsigned (a signed
input would read one bit more).

Why: Concrete puts the lookups of one width on one parameter set, each with its own bootstrap key
and keyswitch keys to and from the others. The Inhibitor's z = (‖q − k‖₁/γ − α)⁺ saturates at
max|V|, so at 3-bit V it has 4 levels, but its input (the L1 distance) is 6 bits wide, and that one
lookup kept a 6-bit set's keyswitch keys between the attention's 4-bit lookups. As three 4-bit
comparisons it joins them (the next-word model: keys 2.06 → 1.83 GiB, 13,960 → 15,280 PBS, the same
integers; ``QuantConfig.step_lut_bits``). Each comparison costs its lookup and, under exact
rounding, about one small PBS per rounded-away bit, so only tables of at most :data:`MAX_STEPS`
steps are split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant.graph_io import tabulate
from quant.ir import Graph, Node, rounded_bits
from quant.ops import op_spec

MAX_STEPS = 3  # a 2-bit output (4 levels): three comparisons, each a lookup plus its rounding


@dataclass(frozen=True)
class Step:
    """One comparison: Δ·[x >= θ], read as Δ·[round_r(x + c) >= B] (θ = B − 2^(r−1) − c)."""

    delta: int
    shift: int  # c
    rounding_bits: int  # r
    boundary: int  # B

    def table(self, v: np.ndarray) -> np.ndarray:
        return np.where(v >= self.boundary, self.delta, 0)


def table_levels(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(thresholds, values): the lookup's output is ``values[k]`` from input ``thresholds[k]`` on
    (``thresholds[0]``: the bottom of its source's width), over every input that width holds, if
    every element reads the same table; else None. Read off the lookup's table over its rounded
    inputs (:func:`quant.graph_io.tabulate`): round_r(x) >= d, for d a multiple of 2^r, is
    x >= d − 2^(r−1)."""
    table = tabulate(graph, node)
    values = table.values.reshape(len(table.values), -1)
    if not np.all(values == values[:, :1]):
        return None
    rounded = table.start + table.step * np.arange(len(values), dtype=np.int64)
    lo, _ = graph.nodes[node.inputs[0]].bit_range()
    return np.maximum(rounded - (table.step >> 1), lo), values[:, 0].copy()


def steps_of(
    thresholds: np.ndarray, values: np.ndarray, lo: int, hi: int, bits: int
) -> list[Step] | None:
    """The comparisons that compute the table (``values[k]`` from input ``thresholds[k]`` on, over
    [lo, hi]) with lookups of at most ``bits`` bits; None if it is not monotone or changes more
    than MAX_STEPS times."""
    diffs = np.diff(values)
    if not (np.all(diffs >= 0) or np.all(diffs <= 0)):
        return None
    changes = np.nonzero(diffs)[0]
    if not 0 < len(changes) <= MAX_STEPS:
        return None
    return [_step(int(thresholds[i + 1]), int(diffs[i]), lo, hi, bits) for i in changes]


def _step(theta: int, delta: int, lo: int, hi: int, bits: int) -> Step:
    for r in range(1, 64):
        half = 1 << (r - 1)
        # the smallest boundary whose shift keeps u = x + c >= 0 on the whole width
        boundary = -(-(theta + half - lo) // (1 << r)) * (1 << r)
        c = boundary - half - theta
        if rounded_bits(lo + c, hi + c, r) - r <= bits:
            return Step(delta, c, r, boundary)
    raise AssertionError("unreachable: rounding every bit away leaves a 1-bit lookup")


def split_step_lookups(graph: Graph, bits: int) -> list[str]:
    """Rewrites, in place, every calibrated lookup that reads more than ``bits`` bits and whose
    table is a monotone step function of at most MAX_STEPS steps, as that many comparisons reading
    at most ``bits`` bits each, summed (the same integers on every input the widths hold; the last
    node keeps the lookup's name and range). Returns the rewritten lookups' names."""
    rewritten: dict[str, list[Node]] = {}
    for node in graph.nodes.values():
        if node.op != "lut" or node.attrs.get("per_channel") or node.lo is None:
            continue
        if (node.lut_input_bits(graph) or 0) <= bits:
            continue
        table = table_levels(graph, node)
        if table is None:
            continue
        lo, hi = graph.nodes[node.inputs[0]].bit_range()
        steps = steps_of(*table, lo, hi, bits)
        if steps is not None:
            rewritten[node.name] = _comparisons(node, steps, int(table[1][0]), lo, hi)
    if rewritten:
        nodes = list(graph.nodes.values())
        graph.nodes.clear()
        for node in nodes:
            for n in rewritten.get(node.name, [node]):
                graph.nodes[n.name] = n
    return list(rewritten)


def _comparisons(node: Node, steps: list[Step], first: int, lo: int, hi: int) -> list[Node]:
    name, tag = node.name, node.tag

    def new(suffix: str, op: str, inputs: tuple[str, ...], attrs: dict, lo, hi) -> Node:
        op_spec(op).check_attrs(name + suffix, attrs)
        return Node(name + suffix, op, inputs, attrs, tag, lo, hi)

    out: list[Node] = []
    total = (0, 0)  # the range of the comparisons summed so far
    for t, s in enumerate(steps):
        shifted = new(
            f".step{t}.in", "add_const", node.inputs, {"value": s.shift}, lo + s.shift, hi + s.shift
        )
        attrs = {"fn": s.table, "rounding_bits": s.rounding_bits, "shape": node.attrs["shape"]}
        step = new(f".step{t}", "lut", (shifted.name,), attrs, min(0, s.delta), max(0, s.delta))
        total = (total[0] + min(0, s.delta), total[1] + max(0, s.delta))
        summed = [new(f".step{t}.sum", "add", (out[-1].name, step.name), {}, *total)] if t else []
        out += [shifted, step, *summed]
    return [*out, new("", "add_const", (out[-1].name,), {"value": first}, node.lo, node.hi)]
