"""Long encrypted runs, deselected by default: `.venv/bin/pytest -m slow`."""

import numpy as np
import pytest

from circuits.sweep import sweep
from fhe.harness import compile_model
from fhe.schemes import TfheParams
from models.tasks import load_task
from models.training import TrainConfig, config_for_task, train
from quant import QuantConfig

pytestmark = pytest.mark.slow


def test_whole_sweep_is_exact_and_inhibitor_is_cheaper():
    reports = sweep(
        ["inhibitor", "dot-product"],
        [2, 4, 8, 16],
        d=2,
        n_bits=4,
        lut_bits=7,
        execute=True,
        repeats=1,
    )
    assert all(r.error is None and r.exact for r in reports)
    for t in (2, 4, 8, 16):
        inh, dot = (
            next(r for r in reports if r.seq_len == t and r.variant == v)
            for v in ("inhibitor", "dot-product")
        )
        assert inh.pbs_count < dot.pbs_count and inh.run_median_s < dot.run_median_s


def test_encrypted_digits_model_equals_clear_program():
    data = load_task("digits")
    cfg = config_for_task(data, attention="inhibitor", d_model=8, n_heads=1, norm="none", d_ff=8)
    model = train(cfg, data, TrainConfig(epochs=20, lr=3e-3), progress=False).model
    compiled = compile_model(
        model,
        data.x_train[:300],
        TfheParams(quant=QuantConfig(n_bits=4), inputset_size=50),
        QuantConfig(n_bits=4, lut_bits=7),
    )
    compiled.keygen()
    x = data.x_test[:2]
    clear = compiled.program.run_int(compiled.program.quantize_input(x), "clip")[0]
    for xi, want in zip(compiled.program.quantize_input(x), clear, strict=True):
        np.testing.assert_array_equal(compiled.backend.encrypt_run_decrypt(xi), want)


def test_whole_model_simulation_equals_clear_on_10000_inputs():
    """The default TFHE recipe on a digits model: Concrete's simulation == the clear integer program
    on 10 000 inputs spread over the whole input range (pixels uniform in [0, 1], beyond the
    data)."""
    from fhe.tfhe.recipe import DEFAULT_QUANT

    data = load_task("digits", patch=4)
    cfg = config_for_task(data, attention="inhibitor", d_model=8, n_heads=2, norm="batchnorm")
    model = train(cfg, data, TrainConfig(epochs=10, lr=3e-3), progress=False).model
    compiled = compile_model(
        model,
        data.x_train[:500],
        TfheParams(quant=DEFAULT_QUANT),
        DEFAULT_QUANT,
        simulate_only=True,
    )
    x = np.random.default_rng(0).random((10_000, *data.x_test.shape[1:]))
    check = compiled.verify(x, limit=len(x))
    assert check.n == 10_000 and check.consistent, check.describe()


@pytest.mark.parametrize("variant", ["inhibitor", "dot-product", "signed-inhibitor", "geglu"])
def test_attention_circuits_encrypted_equal_clear_on_100_inputs(variant):
    from circuits.attention import CircuitSpec, build
    from fhe.tfhe.backend import TfheBackend

    built = build(CircuitSpec(variant, 2, d=2, n_bits=4, lut_bits=5))
    params = TfheParams(quant=QuantConfig(n_bits=4), inputset_size=64)
    backend = TfheBackend.compile(built.graph, built.calib_ints, params)
    backend.keygen()
    lo, hi = int(built.calib_ints.min()), int(built.calib_ints.max())
    xs = np.concatenate(
        [
            built.calib_ints[:50],
            np.random.default_rng(1).integers(lo, hi + 1, (50, *built.calib_ints.shape[1:])),
        ]
    )
    clear, _ = built.graph.run(xs, policy="clip")
    for x, want in zip(xs, clear, strict=True):
        np.testing.assert_array_equal(backend.encrypt_run_decrypt(x), want)
