"""The op registry (quant/ops.py): every op has a TFHE lowering and an interval rule, the table in
docs/quantization.md is the registry's, and a newly registered op is what the interpreter runs."""

from pathlib import Path

import numpy as np
import pytest

from fhe.tfhe.backend import TFHE_LOWERINGS, _lower_node
from quant.ir import Graph
from quant.ops import OPS, OpSpec, op_spec, ops_table, register_op
from quant.ranges import INTERVAL_RULES

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "quantization.md"


def test_every_op_has_a_tfhe_lowering_and_an_interval_rule():
    for name, spec in OPS.items():
        assert spec.traceable or name in TFHE_LOWERINGS, name
        assert name in INTERVAL_RULES, name
    assert set(TFHE_LOWERINGS) <= set(OPS) and set(INTERVAL_RULES) <= set(OPS)


def test_the_guide_table_is_the_registry():
    assert ops_table() in GUIDE.read_text()


def test_pbs_cost_comes_from_the_spec():
    assert op_spec("lut").pbs_count({"shape": (2, 3)}) == 6
    assert op_spec("lut").pbs_count({"shape": (2, 3), "rounding_bits": 2}) == 12
    assert op_spec("matmul").pbs_count({"shape": (2, 3), "inner": 4}) == 48
    assert op_spec("linear").pbs_count({}) == 0 and not op_spec("reshape").bootstraps


def test_a_registered_op_runs_in_the_interpreter_and_unknown_ones_are_named():
    spec = register_op(
        OpSpec("double_test", "2x", "leveled", lambda a, args: 2 * args[0], traceable=True)
    )
    try:
        g = Graph()
        g.add("x", "input", shape=(3,))
        g.add("y", "double_test", ("x",))
        g.set_output("y")
        out, _ = g.run(np.array([[1, -2, 3]]))
        np.testing.assert_array_equal(out, [[2, -4, 6]])
        assert g.pbs_estimate() == 0 and not g.nodes["y"].is_pbs
        with pytest.raises(ValueError, match="already registered"):
            register_op(spec)
    finally:
        del OPS["double_test"]
    g = Graph()
    g.add("x", "input", shape=(3,))
    with pytest.raises(
        ValueError, match="no op 'cube' is registered"
    ):  # refused when the graph is built
        g.add("y", "cube", ("x",))
    untraceable = register_op(OpSpec("untraceable_test", "x", "leveled", lambda a, args: args[0]))
    try:
        with pytest.raises(
            NotImplementedError, match="no TFHE lowering registered for op 'untraceable_test'"
        ):
            _lower_node(g.nodes["x"].__class__("n", untraceable.name), [np.zeros(3)])
    finally:
        del OPS["untraceable_test"]


def test_nodes_with_missing_unknown_or_mistyped_attributes_are_refused_when_built():
    import numpy as np
    import pytest

    from quant.ir import Graph

    g = Graph()
    g.add("x", "input", shape=(3,))
    with pytest.raises(ValueError, match=r"node 'l' \(linear\): missing attribute\(s\) \['bias'\]"):
        g.add("l", "linear", ("x",), weight=np.eye(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"unknown attribute\(s\) \['scale'\]"):
        g.add("s", "sum", ("x",), axis=-1, scale=2)
    with pytest.raises(ValueError, match="attribute 'fn' is a int, expected Callable"):
        g.add("t", "lut", ("x",), fn=3, shape=(3,))
    g.add("ok", "lut", ("x",), fn=lambda v: v, shape=(3,), rounding_bits=np.int64(1))
    assert list(g.nodes) == ["x", "ok"]  # refused nodes were not added
