"""The integer program's primitives: bit widths, rounding, overflow policy, the 16-bit check."""

import numpy as np
import pytest

from quant.ir import (
    BitWidthError,
    Graph,
    OverflowPolicy,
    RangeOverflowError,
    lut_rounding,
    round_bit_pattern,
    signed_bits,
)
from quant.quantizer import Quantizer, quantize_weight


@pytest.mark.parametrize(
    "lo,hi,bits", [(0, 0, 1), (-1, 0, 1), (-8, 7, 4), (-9, 7, 5), (-8, 8, 5), (-128, 127, 8)]
)
def test_signed_bits(lo, hi, bits):
    assert signed_bits(lo, hi) == bits


def test_round_bit_pattern_rounds_to_nearest_multiple_ties_up():
    x = np.array([-9, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    expected = [4 * np.floor(v / 4 + 0.5) for v in x]
    assert round_bit_pattern(x, 2).tolist() == expected
    assert round_bit_pattern(x, 0).tolist() == x.tolist()


@pytest.mark.parametrize(
    "lo,hi,lut_bits,lsbs",
    [
        (0, 1000, 5, 5),  # 10 bits; 1000 rounds to 992 (31 · 32): fits 5 bits
        (0, 2040, 5, 7),  # 11 bits, but 2040 rounds up to 2048 by 6 bits: one more LSB
        (0, 2015, 5, 6),  # 2015 rounds down to 1984: 6 LSBs suffice
        (-512, 511, 5, 6),  # signed 10 bits; 511 rounds up to 512 = 16 · 32, 6 bits signed
        (-512, 495, 5, 5),  # 495 rounds down to 480 = 15 · 32: 5 bits signed
        (0, 20, 5, 0),  # already narrow: no rounding
    ],
)
def test_lut_rounding_keeps_the_rounded_input_within_lut_bits(lo, hi, lut_bits, lsbs):
    assert lut_rounding(lo, hi, lut_bits) == lsbs
    rounded = round_bit_pattern(np.arange(lo, hi + 1), lsbs) >> lsbs
    lo_r, hi_r = int(rounded.min()), int(rounded.max())
    width = max(1, int(np.ceil(np.log2(hi_r + 1)))) if lo_r >= 0 else signed_bits(lo_r, hi_r)
    assert width <= lut_bits


def small_graph():
    g = Graph()
    g.add("x", "input", shape=(3,))
    g.add(
        "lin",
        "linear",
        ("x",),
        weight=np.array([[2, 0, 1], [0, 1, 0], [1, 1, 1]]),
        bias=np.array([1, 0, -1]),
    )
    g.add("relu", "lut", ("lin",), fn=lambda v: np.maximum(v, 0), shape=(3,))
    g.add("s", "sum", ("relu",), axis=-1)
    g.set_output("s")
    return g


def test_interpreter_computes_by_hand():
    g = small_graph()
    out, _ = g.run(np.array([[1, 2, 3], [-3, 0, 0]]))
    # row 1: lin = [1*2+3*1+1, 2+3+0, 1+3-1] = [6, 5, 3]; row 2: [-6+1, 0, -3-1] -> relu [0,0,0]
    assert out.tolist() == [14, 0]


def test_overflow_policy_error_names_the_node_and_clip_counts():
    g = small_graph()
    g.calibrate(np.array([[1, 1, 1], [0, 1, 0]]))
    big = np.array([[40, 40, 40]])
    with pytest.raises(RangeOverflowError, match=r"node 'x' \(input.*wrap around"):
        g.run(big, OverflowPolicy.ERROR)
    out, clipped = g.run(big, OverflowPolicy.CLIP)
    assert clipped == {"x": 3}  # saturating the input keeps every later value inside its width
    assert out.max() <= 2 ** g.nodes["s"].bits


def test_check_fits_names_the_lookup_and_suggests_rounding():
    g = Graph()
    g.add("x", "input", shape=(2,))
    g.add("acc", "mul_const", ("x",), value=1000)
    g.add("t", "lut", ("acc",), fn=lambda v: v // 1000, shape=(2,), tag="attn.scores")
    g.set_output("t")
    g.calibrate(np.array([[-100, 100]]))  # acc in [-100000, 100000]: 18 bits
    with pytest.raises(BitWidthError, match=r"'t'.*attn.scores.*rounding-bits"):
        g.check_fits(16)
    g.nodes["t"].attrs["rounding_bits"] = 3
    g.check_fits(16)


def test_quantizer_roundtrip_within_half_a_step():
    x = np.linspace(-3, 5, 101)
    for symmetric in (True, False):
        q = Quantizer.fit(x.min(), x.max(), 6, symmetric)
        back = (q.quantize_np(x) - q.zero_point) * q.scale
        assert np.abs(back - x).max() <= q.scale / 2 + 1e-12
    assert Quantizer.fit(0.0, 1.0, 4).signed is False


def test_weight_quantization_per_channel_has_a_scale_per_output():
    w = np.array([[1.0, -0.1], [0.5, 0.05]])
    w_int, s = quantize_weight(w, 4, per_channel=True)
    assert s.shape == (2,) and np.abs(w_int).max() <= 7
    np.testing.assert_allclose(w_int * s, w, atol=s.max() / 2)
