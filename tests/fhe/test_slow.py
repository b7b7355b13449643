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
    reports = sweep(["inhibitor", "dot-product"], [2, 4, 8, 16], d=2, n_bits=4, lut_bits=7, execute=True,
                    repeats=1)
    assert all(r.error is None and r.exact for r in reports)
    for t in (2, 4, 8, 16):
        inh, dot = (next(r for r in reports if r.seq_len == t and r.variant == v) for v in ("inhibitor", "dot-product"))
        assert inh.pbs_count < dot.pbs_count and inh.run_median_s < dot.run_median_s


def test_encrypted_digits_model_equals_clear_program():
    data = load_task("digits")
    cfg = config_for_task(data, attention="inhibitor", d_model=8, n_heads=1, norm="none", d_ff=8)
    model = train(cfg, data, TrainConfig(epochs=20, lr=3e-3), progress=False).model
    compiled = compile_model(model, data.x_train[:300], TfheParams(n_bits=4, inputset_size=50),
                             QuantConfig(n_bits=4, lut_bits=7))
    compiled.keygen()
    x = data.x_test[:2]
    clear = compiled.program.run_int(compiled.program.quantize_input(x), "clip")[0]
    for xi, want in zip(compiled.program.quantize_input(x), clear, strict=True):
        np.testing.assert_array_equal(compiled.backend.encrypt_run_decrypt(xi), want)
