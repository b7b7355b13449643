"""The overflow policy (fhe.harness.CompiledModel, quant/ranges.py): every input the client accepts
gives encrypted == clear. Calibrated widths: an input that would leave one is refused; proven
widths: nothing overflows. Checked with Concrete's simulation on edge inputs (all-min, all-max,
checkerboards)."""

import numpy as np
import pytest

from circuits.attention import CircuitSpec, build
from fhe.errors import InputOverflowError
from fhe.schemes import TfheParams
from fhe.tfhe.backend import TfheBackend

# DCT-Former's circuits (~20 s each) run with `-m slow`; the other kinds keep both range modes by
# default
VARIANTS = [
    "inhibitor",
    "signed-inhibitor",
    "dot-product",
    "power-softmax",
    pytest.param("dct", marks=pytest.mark.slow),
    "geglu",
]


def _edges(shape, lo, hi) -> dict[str, np.ndarray]:
    checker = np.indices(shape).sum(0) % 2 == 0
    return {
        "all-min": np.full(shape, lo),
        "all-max": np.full(shape, hi),
        "checker": np.where(checker, lo, hi),
        "checker'": np.where(checker, hi, lo),
    }


@pytest.mark.parametrize("ranges", ["calibrated", "proven"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_accepted_edge_input_simulates_to_the_clear_program(variant, ranges):
    built = build(CircuitSpec(variant, 4, n_bits=6, lut_bits=5))
    backend = TfheBackend.compile(
        built.graph,
        built.calib_ints,
        TfheParams(inputset_size=64, ranges=ranges),
        simulate_only=True,
        input_range=(-31, 31),
    )
    for name, x in _edges(built.graph.input_shape, -31, 31).items():
        clear, clipped = built.graph.run(x, "clip")
        if clipped:  # would be refused by the client
            assert ranges == "calibrated", (
                f"{name} overflows {sorted(clipped)} despite proven widths"
            )
            continue
        np.testing.assert_array_equal(
            backend.simulate(x), clear, err_msg=f"{variant}/{ranges}/{name}"
        )
    backend.circuit.cleanup()


def _model_edges(data) -> dict[str, np.ndarray]:
    lo, hi = float(data.x_train.min()), float(data.x_train.max())
    return _edges(tuple(data.x_test.shape[1:]), lo, hi)


def test_the_client_refuses_inputs_that_would_overflow_and_proven_widths_accept_them(
    tiny_rows_model,
):
    from fhe.harness import compile_model
    from fhe.tfhe.recipe import resolve_quant
    from models.tasks import load_task_of
    from models.training import load_checkpoint

    ckpt = load_checkpoint(tiny_rows_model)
    data = load_task_of(ckpt.task)
    calibrated = compile_model(
        ckpt.model, data.x_train[:500], TfheParams(), resolve_quant(None), simulate_only=True
    )
    assert calibrated.report()["overflow_risks"]
    refused = 0
    for x in _model_edges(data).values():
        x_int = calibrated.program.quantize_input(x)
        nodes = calibrated.overflowing_nodes(x_int)
        if nodes:
            refused += 1
            with pytest.raises(InputOverflowError, match=next(iter(nodes))):
                calibrated.encrypt(x)
        else:
            np.testing.assert_array_equal(
                calibrated.backend.simulate(x_int), calibrated.program.run_int(x_int)[0]
            )
    assert refused, "the tiny model's checkerboard inputs overflow its calibrated residual branch"

    proven = compile_model(
        ckpt.model,
        data.x_train[:500],
        TfheParams(ranges="proven"),
        resolve_quant(None),
        simulate_only=True,
    )
    assert proven.report()["overflow_risks"] == []
    for name, x in _model_edges(data).items():
        x_int = proven.program.quantize_input(x)
        assert proven.overflowing_nodes(x_int) == {}, name
        np.testing.assert_array_equal(
            proven.backend.simulate(x_int), proven.program.run_int(x_int, "error")[0]
        )
