"""Proven value ranges: interval arithmetic over the integer program, for every input the client
accepts.

Calibration (:meth:`quant.ir.Graph.calibrate`) fixes each node's bit width from the values a
calibration set produces. An input the calibration set did not resemble can push a leveled value
(an accumulator, a sum) past that width: the clear program saturates it, the encrypted circuit wraps
around, and the two disagree silently. This module bounds every node over *all* inputs in the
client's accepted range instead: clear weights and constants are known, so each op maps element-wise
intervals to element-wise intervals exactly or conservatively, and a table lookup's output is
bounded by its table over every (rounded) input its source can hold. With every node's width set
from these bounds (``fhe compile --ranges proven``) no value can leave its width, so encrypted ==
clear for every input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant.ir import FREE_OPS, Graph, Node, round_bit_pattern, value_bits
from quant.ops import op_spec

TABLE_LIMIT = 1 << 18  # most table entries evaluated per lookup node (once rounded)


@dataclass(frozen=True)
class Interval:
    lo: np.ndarray  # element-wise bounds, shaped like the node's value (no batch axis)
    hi: np.ndarray

    @property
    def scalar(self) -> tuple[int, int]:
        return int(self.lo.min()), int(self.hi.max())


def proven_intervals(graph: Graph, input_lo: int, input_hi: int) -> dict[str, Interval]:
    """Element-wise bounds of every node for every input in [input_lo, input_hi]."""
    env: dict[str, Interval] = {}
    for node in graph.nodes.values():
        args = [env[i] for i in node.inputs]
        if node.op == "input":
            shape = graph.input_shape
            env[node.name] = Interval(
                np.full(shape, input_lo, np.int64), np.full(shape, input_hi, np.int64)
            )
        else:
            env[node.name] = _bound(node, args)
    return env


def proven_ranges(graph: Graph, input_lo: int, input_hi: int) -> dict[str, tuple[int, int]]:
    """Per node, the (lo, hi) every input in [input_lo, input_hi] keeps it within."""
    return {name: iv.scalar for name, iv in proven_intervals(graph, input_lo, input_hi).items()}


def widen_to_proven(graph: Graph, input_lo: int, input_hi: int) -> list[dict]:
    """Sets every node's range to the union of its calibrated and proven ranges; returns the nodes
    whose bit width grew (name, tag, op, calibrated and proven bits)."""
    proven = proven_ranges(graph, input_lo, input_hi)
    grown = []
    for name, node in graph.nodes.items():
        if node.lo is None or node.hi is None:
            raise ValueError("calibrate the program before proving its ranges")
        before = node.bits
        node.lo, node.hi = min(node.lo, proven[name][0]), max(node.hi, proven[name][1])
        if node.bits != before:
            grown.append(
                {
                    "node": name,
                    "tag": node.tag,
                    "op": node.op,
                    "calibrated_bits": before,
                    "proven_bits": node.bits,
                }
            )
    return grown


def overflow_risks(graph: Graph, input_lo: int, input_hi: int) -> list[dict]:
    """Nodes whose calibrated width some accepted input can exceed (empty: calibration is safe)."""
    proven = proven_ranges(graph, input_lo, input_hi)
    risks = []
    for name, node in graph.nodes.items():
        lo, hi = proven[name]
        if node.bits is not None and node.op not in FREE_OPS and value_bits(lo, hi) > node.bits:
            risks.append(
                {
                    "node": name,
                    "tag": node.tag,
                    "op": node.op,
                    "calibrated_bits": node.bits,
                    "proven_bits": value_bits(lo, hi),
                }
            )
    return risks


# ------------------------------------------------------------------------------------ per op
def _bound(node: Node, args: list[Interval]) -> Interval:
    if node.op not in INTERVAL_RULES:
        raise ValueError(f"no interval rule registered for op {node.op!r} (node {node.name!r})")
    return INTERVAL_RULES[node.op](node.attrs, args, node)


def _weights(a: dict) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(a["weight"], dtype=np.int64)
    return np.maximum(w, 0), np.minimum(w, 0)


def _linear(a: dict, args: list[Interval], node: Node) -> Interval:
    (pos, neg), x = _weights(a), args[0]
    b = np.asarray(a["bias"], dtype=np.int64)
    return Interval(x.lo @ pos + x.hi @ neg + b, x.hi @ pos + x.lo @ neg + b)


def _matmul_left(a: dict, args: list[Interval], node: Node) -> Interval:
    (pos, neg), x = _weights(a), args[0]
    return Interval(
        np.matmul(pos, x.lo) + np.matmul(neg, x.hi), np.matmul(pos, x.hi) + np.matmul(neg, x.lo)
    )


def _sum(a: dict, args: list[Interval], node: Node) -> Interval:
    keep = a.get("keepdims", False)
    lo, hi = (np.sum(side, axis=a["axis"], keepdims=keep) for side in (args[0].lo, args[0].hi))
    return Interval(lo, hi)


def _matmul(a: dict, args: list[Interval], node: Node) -> Interval:
    x, y = args
    terms = _product_bounds(
        Interval(x.lo[..., :, :, None], x.hi[..., :, :, None]),
        Interval(y.lo[..., None, :, :], y.hi[..., None, :, :]),
    )
    return Interval(terms.lo.sum(axis=-2), terms.hi.sum(axis=-2))


def _layout_bounds(a: dict, args: list[Interval], node: Node) -> Interval:
    """Layout ops move values without changing them: the interpreter's op on each side's bound
    array."""
    spec = op_spec(node.op)
    return Interval(
        *(np.asarray(spec.evaluate(a, [getattr(x, side) for x in args])) for side in ("lo", "hi"))
    )


# The interval rule of every op (quant.ops), keyed like the registry; a test checks none is missing.
INTERVAL_RULES = {
    "linear": _linear,
    "matmul_left": _matmul_left,
    "add_const": lambda a, args, node: Interval(
        args[0].lo + np.asarray(a["value"], dtype=np.int64),
        args[0].hi + np.asarray(a["value"], dtype=np.int64),
    ),
    "mul_const": lambda a, args, node: _product_bounds(args[0], _point(a["value"])),
    "add": lambda a, args, node: Interval(args[0].lo + args[1].lo, args[0].hi + args[1].hi),
    "sub": lambda a, args, node: Interval(args[0].lo - args[1].hi, args[0].hi - args[1].lo),
    "neg": lambda a, args, node: Interval(-args[0].hi, -args[0].lo),
    "sum": _sum,
    "mul": lambda a, args, node: _product_bounds(args[0], args[1]),
    "matmul": _matmul,
    "lut": lambda a, args, node: _table_bounds(node, args[0]),
    **{op: _layout_bounds for op in FREE_OPS},
}


def _point(value) -> Interval:
    v = np.asarray(value, dtype=np.int64)
    return Interval(v, v)


def _product_bounds(x: Interval, y: Interval) -> Interval:
    corners = np.stack(np.broadcast_arrays(x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi))
    return Interval(corners.min(axis=0), corners.max(axis=0))


def _table_bounds(node: Node, src: Interval) -> Interval:
    """A lookup's output over every value its source can hold (rounded as the node rounds)."""
    lo, hi = src.scalar
    r = node.attrs.get("rounding_bits", 0)
    # rounding is monotone: the values it gives over [lo, hi] are the multiples of 2^r between
    # round(lo) and round(hi), every one of them (a wide sum rounded to a few bits is few entries)
    first, last = (int(v) for v in round_bit_pattern(np.array([lo, hi], dtype=np.int64), r))
    if (last - first) >> r >= TABLE_LIMIT:
        raise ValueError(
            f"lookup {node.name!r} reads a range of {hi - lo + 1} values"
            + (f" ({((last - first) >> r) + 1} once rounded by {r} bits)" if r else "")
            + "; too wide to tabulate"
        )
    candidates = np.arange(first, last + 1, 1 << r, dtype=np.int64)
    shape = tuple(node.attrs["shape"])
    column = candidates.reshape((-1,) + (1,) * len(shape))
    grid = np.ascontiguousarray(np.broadcast_to(column, (len(candidates), *shape)))
    values = np.asarray(node.attrs["fn"](grid), dtype=np.int64)
    return Interval(values.min(axis=0), values.max(axis=0))
