"""Proven ranges (quant/ranges.py) against the interpreter: every value any accepted input produces
lies inside its node's proven interval, element by element."""

import numpy as np
import pytest

from circuits.attention import CircuitSpec, build
from quant.ranges import overflow_risks, proven_intervals, widen_to_proven

VARIANTS = ["inhibitor", "signed-inhibitor", "dot-product", "power-softmax", "dct", "geglu"]
QMAX = 31  # 6-bit circuits: inputs in [-31, 31]


def _inputs(shape, n=64, seed=0):
    rng = np.random.default_rng(seed)
    checker = np.indices(shape).sum(0) % 2 == 0
    edges = [
        np.full(shape, -QMAX),
        np.full(shape, QMAX),
        np.where(checker, -QMAX, QMAX),
        np.where(checker, QMAX, -QMAX),
    ]
    return np.concatenate([np.stack(edges), rng.integers(-QMAX, QMAX + 1, size=(n, *shape))])


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_value_lies_inside_its_proven_interval(variant):
    graph = build(CircuitSpec(variant, 4, n_bits=6, lut_bits=5)).graph
    bounds = proven_intervals(graph, -QMAX, QMAX)
    record = {}
    graph.run(_inputs(graph.input_shape), "clip", record=record)
    for name, values in record.items():
        if graph.nodes[name].op == "input":
            continue
        assert (values >= bounds[name].lo).all() and (values <= bounds[name].hi).all(), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_proven_widths_never_clip_and_never_change_a_value(variant):
    built = build(CircuitSpec(variant, 4, n_bits=6, lut_bits=5))
    xs = _inputs(built.graph.input_shape, seed=1)
    before = [
        built.graph.run(x, "clip") for x in xs
    ]  # (output, clipped) with the calibrated widths
    widen_to_proven(built.graph, -QMAX, QMAX)
    assert overflow_risks(built.graph, -QMAX, QMAX) == []
    out, clipped = built.graph.run(xs, "error")  # raises on any overflow
    assert clipped == {}
    unclipped = [i for i, (_, c) in enumerate(before) if not c]
    assert unclipped
    for i in unclipped:
        np.testing.assert_array_equal(out[i], before[i][0])


def test_the_inhibitor_circuit_has_one_node_at_risk():
    """The issue's case: on the T=8 Inhibitor circuit the all-max input overflows the calibrated
    output sum."""
    graph = build(CircuitSpec("inhibitor", 8, n_bits=6, lut_bits=5)).graph
    risks = overflow_risks(graph, -QMAX, QMAX)
    assert [r["node"] for r in risks] == ["c.attn.h"]
    assert list(graph.run(np.full(graph.input_shape, QMAX), "clip")[1]) == ["c.attn.h"]
