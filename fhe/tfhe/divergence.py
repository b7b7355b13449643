"""Which node makes a compiled circuit differ from the clear integer program.

When Concrete's simulation of a whole circuit disagrees with the clear program on an input, the
first node whose simulated value differs is found by bisection over prefixes of the program: each
prefix (the nodes up to one, whose value becomes the output) is compiled and simulated on the same
input, and compared with the clear program's value of that node. About log2(#nodes) compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quant.ir import FREE_OPS, Graph, OverflowPolicy


@dataclass(frozen=True)
class Divergence:
    node: str
    op: str
    tag: str
    bits: int | None
    max_abs_diff: float

    def describe(self) -> str:
        return (
            f"first diverging node {self.node!r} ({self.op}, tag {self.tag!r}, {self.bits} bits; "
            f"max |simulated - clear| {self.max_abs_diff:g})"
        )


def prefix(graph: Graph, name: str) -> Graph:
    """The program up to and including node ``name``, with ``name`` as its output (nodes are
    shared)."""
    sub = Graph()
    sub.input_name, sub.input_shape = graph.input_name, graph.input_shape
    for node_name, node in graph.nodes.items():
        sub.nodes[node_name] = node
        if node_name == name:
            break
    sub.set_output(name)
    return sub


def first_divergence(
    graph: Graph, x_int: np.ndarray, calib_ints: np.ndarray, params
) -> Divergence | None:
    """The first node whose simulated value on ``x_int`` differs from the clear program's, or None
    when no prefix reproduces a difference (e.g. a difference that only the whole circuit's
    parameters cause)."""
    from fhe.tfhe.backend import TfheBackend

    record: dict[str, np.ndarray] = {}
    graph.run(x_int, OverflowPolicy.CLIP, record=record)
    candidates = [
        n for n, node in graph.nodes.items() if node.op not in FREE_OPS and node.op != "input"
    ]

    def diff(name: str) -> float:
        backend = TfheBackend.compile(prefix(graph, name), calib_ints, params, simulate_only=True)
        try:
            sim = backend.simulate(x_int)
        finally:
            backend.circuit.cleanup()
        return float(np.abs(np.asarray(sim, dtype=np.int64) - record[name]).max())

    lo, hi = 0, len(candidates) - 1
    if diff(candidates[hi]) == 0:
        return None
    while lo < hi:  # invariant: candidates[hi] differs
        mid = (lo + hi) // 2
        if diff(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    node = graph.nodes[candidates[hi]]
    return Divergence(node.name, node.op, node.tag, node.bits, diff(node.name))
