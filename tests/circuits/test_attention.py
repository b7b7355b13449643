"""circuits/attention.py: each attention circuit's integer program against its float reference."""

import numpy as np
import pytest

from circuits.attention import CORES, CircuitSpec, build
from models.config import AttentionKind


@pytest.mark.parametrize("variant", CORES.kinds())
def test_every_circuit_approximates_its_float_attention(variant):
    """At 8 bits the integer program's dequantized output follows the paper's equation computed in
    float (models.attention.functional) on the same dequantized inputs: small error relative to the
    output's spread (PowerSoftmax's x^4 of an 8-bit score amplifies its rounding: a looser bound),
    and far better than a circuit answering zeros."""
    built = build(CircuitSpec(variant, seq_len=4, d=2, n_bits=8), n_calib=128)
    x = built.calib_ints[:64]
    got = built.graph.run(x, "clip")[0] * built.output_scale
    want = built.reference(x)
    assert got.shape == want.shape
    err = np.abs(got - want).mean()
    spread = np.abs(want - want.mean()).mean()
    assert err < (0.3 if variant is AttentionKind.POWER_SOFTMAX else 0.05) * spread, (
        variant,
        err,
        spread,
    )


def test_lower_precision_costs_accuracy_and_pbs_follow_the_paper():
    """Fewer bits give a larger error (the program really quantizes), and the Inhibitor needs fewer
    PBS than dot-product attention at the same size (the Inhibitor paper's claim, counted on the
    program)."""
    errs = {}
    for bits in (4, 8):
        built = build(
            CircuitSpec(AttentionKind.INHIBITOR, seq_len=4, d=2, n_bits=bits), n_calib=128
        )
        x = built.calib_ints[:64]
        errs[bits] = np.abs(
            built.graph.run(x, "clip")[0] * built.output_scale - built.reference(x)
        ).mean()
    assert errs[8] < errs[4]
    inh = build(CircuitSpec(AttentionKind.INHIBITOR, seq_len=8, d=2, n_bits=6)).graph.pbs_estimate()
    dot = build(
        CircuitSpec(AttentionKind.DOT_PRODUCT, seq_len=8, d=2, n_bits=6)
    ).graph.pbs_estimate()
    assert inh < dot


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="seq_len"):
        CircuitSpec(AttentionKind.INHIBITOR, seq_len=0)
    with pytest.raises(ValueError, match="n_bits"):
        CircuitSpec(AttentionKind.INHIBITOR, seq_len=4, n_bits=1)
    with pytest.raises(ValueError):
        CircuitSpec("fourier", seq_len=4)
