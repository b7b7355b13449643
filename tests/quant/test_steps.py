"""quant/steps.py: a monotone lookup of few levels as comparisons on fewer bits, same integers."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models import AttentionKind, Transformer, TransformerConfig
from quant import OverflowPolicy, QuantConfig
from quant.export import export
from quant.ir import Graph
from quant.ops import round_bit_pattern
from quant.steps import MAX_STEPS, split_step_lookups


def step_table(base: int, steps: list[tuple[int, int]]):
    """f(x) = base + Σ Δ·[x >= θ], computed naively element by element (the reference)."""

    def fn(x):
        x = np.asarray(x)
        return base + sum((d * (x >= t) for t, d in steps), np.zeros_like(x))

    return fn


def one_lookup(fn, lo: int, hi: int, rounding_bits: int = 0, shape=(4,)) -> Graph:
    g = Graph()
    g.add("x", "input", shape=shape)
    g.add("f", "lut", ("x",), fn=fn, shape=shape, rounding_bits=rounding_bits)
    g.set_output("f")
    xs = np.linspace(lo, hi, 8 * shape[0]).round().astype(np.int64).reshape(8, *shape)
    g.calibrate(xs)
    return g


def every_input(g: Graph) -> np.ndarray:
    lo, hi = g.nodes["x"].bit_range()
    return np.arange(lo, hi + 1).reshape(-1, 1).repeat(g.input_shape[0], 1)


@settings(max_examples=150, deadline=None)
@given(
    signed=st.booleans(),
    width=st.integers(5, 8),
    bits=st.integers(2, 4),
    own_rounding=st.integers(0, 3),
    data=st.data(),
)
def test_a_split_lookup_gives_the_same_integers_on_every_input_its_width_holds(
    signed, width, bits, own_rounding, data
):
    lo, hi = (-(2 ** (width - 1)), 2 ** (width - 1) - 1) if signed else (0, 2**width - 1)
    n = data.draw(st.integers(1, MAX_STEPS))
    thetas = sorted(data.draw(st.sets(st.integers(lo + 1, hi), min_size=n, max_size=n)))
    sign = data.draw(st.sampled_from([1, -1]))
    deltas = [sign * data.draw(st.integers(1, 3)) for _ in thetas]
    fn = step_table(data.draw(st.integers(-4, 4)), list(zip(thetas, deltas, strict=True)))
    g = one_lookup(fn, lo, hi, own_rounding)
    x = every_input(g)
    want = g.run(x)[0]
    reads_before = g.nodes["f"].lut_input_bits(g)
    split = split_step_lookups(g, bits)
    if reads_before <= bits:  # already as narrow
        assert split == []
        return
    reads = [n.lut_input_bits(g) for n in g.nodes.values() if n.op == "lut"]
    if split:
        assert all(r <= bits for r in reads) and g.nodes["f"].op == "add_const"
        np.testing.assert_array_equal(g.run(x)[0], want)  # checked against every width too
    else:  # the table's own rounding merged every step away (a constant): left alone
        assert len(np.unique(want)) == 1


def test_only_monotone_uniform_tables_of_few_steps_wider_than_bits_are_split():
    def kept(fn, lo=0, hi=63, shape=(4,)) -> bool:
        g = one_lookup(fn, lo, hi, shape=shape)
        return split_step_lookups(g, 4) == []

    assert not kept(step_table(0, [(3, 1), (6, 1), (9, 1)]))
    assert kept(np.abs, lo=-32, hi=31)  # not monotone
    assert kept(step_table(0, [(t, 1) for t in range(5, 45, 10)]))  # four steps
    assert kept(step_table(0, [(3, 1)]), hi=15)  # reads 4 bits already
    assert kept(lambda x: (x >= 10) * np.arange(1, 5), shape=(4,))  # a table per element
    assert kept(lambda x: np.zeros_like(x))  # no step


def test_the_inhibitors_z_is_split_and_the_program_is_unchanged():
    """An Inhibitor at 3-bit V: z = (‖q − k‖₁/γ − α)⁺ saturates at max|V| = 3, four levels read from
    the L1 distance's wider sum. With ``step_lut_bits`` it becomes comparisons of at most that
    many bits (3 here), and the program gives the same integers on the calibration set and on other
    inputs; nothing else changes."""
    torch.manual_seed(3)
    cfg = TransformerConfig(
        seq_len=6,
        in_features=5,
        n_outputs=3,
        attention=AttentionKind.INHIBITOR,
        d_model=16,
        n_heads=2,
        norm="none",
    )
    model = Transformer(cfg).double().eval()
    x = torch.rand(200, 6, 5, dtype=torch.float64)
    quant = QuantConfig(n_bits=6, attention_bits=3, lut_bits=6)
    whole = export(model, x, quant)
    split = export(model, x, quant.replace(step_lut_bits=3))
    z = "block0.mix.attn.z"
    assert whole.graph.nodes[z].lut_input_bits(whole.graph) > 3
    assert split.graph.nodes[z].op == "add_const"
    added = set(split.graph.nodes) - set(whole.graph.nodes)
    assert added and all(n.startswith(z + ".step") for n in added)
    steps = [split.graph.nodes[n] for n in added if split.graph.nodes[n].op == "lut"]
    assert 1 <= len(steps) <= MAX_STEPS
    assert all(s.lut_input_bits(split.graph) <= 3 for s in steps)
    other = torch.randn(100, 6, 5, dtype=torch.float64) * 0.6 + 0.5
    for inputs in (x, other):
        a, _ = whole.run_int(whole.quantize_input(inputs), OverflowPolicy.CLIP)
        b, _ = split.run_int(split.quantize_input(inputs), OverflowPolicy.CLIP)
        np.testing.assert_array_equal(a, b)


def test_a_split_program_round_trips_through_the_client_artifacts_files(tmp_path):
    """The client's copy of the program (quant/graph_io.py: tables, no code) gives the same
    integers as the split program on every input the widths hold."""
    from quant.graph_io import load_graph, save_graph

    g = one_lookup(step_table(1, [(5, 2), (20, 1)]), -32, 31)
    assert split_step_lookups(g, 3) == ["f"]
    save_graph(g, tmp_path / "program")
    x = every_input(g)
    np.testing.assert_array_equal(load_graph(tmp_path / "program").run(x)[0], g.run(x)[0])


def test_step_lut_bits_is_checked_and_round_trips_through_json():
    cfg = QuantConfig(lut_bits=6, step_lut_bits=4)
    assert QuantConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"step_lut_bits must be in \[2, 16\]"):
        QuantConfig(step_lut_bits=1)


def test_the_comparisons_round_exactly_at_their_thresholds():
    """Each comparison rounds x + c by r bits and reads [round >= B]: around every threshold θ,
    θ − 1 reads 0 and θ reads 1 (Concrete's rounding, ties upwards)."""
    g = one_lookup(step_table(0, [(3, 1), (6, 1), (9, 1)]), 0, 40)
    split_step_lookups(g, 3)
    for t in (3, 6, 9):
        x = np.array([[t - 1] * 4, [t] * 4])
        got = g.run(x)[0][:, 0]
        assert got[1] - got[0] == 1
    shifted = [n for n in g.nodes.values() if n.name.endswith(".in")]
    for n in shifted:
        r = g.nodes[n.name[: -len(".in")]].attrs["rounding_bits"]
        assert r >= 1 and int(round_bit_pattern(np.array(n.lo), r)) >= 0
