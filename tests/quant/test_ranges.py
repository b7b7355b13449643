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


@pytest.mark.parametrize(
    ("lo", "hi", "r"),
    [(-37, 41, 0), (-37, 41, 3), (-1000, 999, 4), (5, 5, 2), (-300_000, 200_000, 12)],
)
def test_a_rounded_lookups_bounds_are_the_table_over_every_value_its_source_holds(lo, hi, r):
    """quant.ranges._table_bounds against the table evaluated on every integer of the source's
    interval, rounded as the node rounds; a wide sum rounded to a few bits (the last case: half a
    million values, 123 entries once rounded) is bounded, not refused as too wide."""
    from quant.ir import Node
    from quant.ops import round_bit_pattern
    from quant.ranges import TABLE_LIMIT, Interval, _table_bounds

    def fn(t):
        return np.clip(t // 7 - (t % 5), -900, 900)  # neither monotone nor odd

    node = Node("n", "lut", attrs={"rounding_bits": r, "fn": fn, "shape": (2,)})
    src = Interval(np.array([lo, lo + (hi - lo) // 2]), np.array([hi, hi]))
    every = fn(np.unique(round_bit_pattern(np.arange(lo, hi + 1, dtype=np.int64), r)))
    got = _table_bounds(node, src)
    assert got.lo.min() == every.min() and got.hi.max() == every.max()
    wide = Node("w", "lut", attrs={"rounding_bits": 0, "fn": fn, "shape": (1,)})
    with pytest.raises(ValueError, match="too wide to tabulate"):
        _table_bounds(wide, Interval(np.array([0]), np.array([TABLE_LIMIT + 5])))
