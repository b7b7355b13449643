"""fhe.tfhe.compare.compare_tfhe, the library call behind `fhe compare` (a notebook's API)."""

import numpy as np
import pytest

from fhe.harness import compile_model
from fhe.schemes import TfheParams
from fhe.tfhe.compare import compare_tfhe
from fhe.tfhe.recipe import resolve_quant
from models.tasks import load_task_of
from models.training import load_checkpoint, predict


@pytest.fixture(scope="module")
def setup(tiny_model):
    ckpt = load_checkpoint(tiny_model)
    data = load_task_of(ckpt.task)
    compiled = compile_model(ckpt.model, data.x_train[:500], TfheParams(), resolve_quant(None))
    return compiled, data


def test_simulated_comparison_matches_an_independent_count(setup):
    compiled, data = setup
    x, y = data.x_test[:40], data.y_test[:40].numpy()
    seen = []
    res = compare_tfhe(
        compiled, x, y, "simulate", progress=lambda done, total: seen.append((done, total))
    )
    # the reference: the clear integer program and the float model, computed here on the accepted
    # samples
    x_int = compiled.program.quantize_input(x)
    runs = [compiled.program.run_int(xi[None], "clip") for xi in x_int]
    accepted = np.array([not clipped for _, clipped in runs])
    clear = np.concatenate([out for out, _ in runs])[accepted]
    flt = predict(compiled.program.model, x).numpy()[accepted]
    assert res["n"] + res["refused_overflow"] == 40 and res["n"] == accepted.sum()
    # the program outputs the head per token (T, n_out); the client's logits are their sum
    assert compiled.program.client_pools and clear.shape[1:] == (4, 10)
    logits = (clear * compiled.program.output_scale).sum(axis=1)
    assert res["accuracy"]["clear"] == pytest.approx((logits.argmax(-1) == y[accepted]).mean())
    assert res["accuracy"]["float"] == pytest.approx((flt.argmax(-1) == y[accepted]).mean())
    assert (
        res["exact_integer_match"] == 1.0
        and res["accuracy"]["simulate"] == res["accuracy"]["clear"]
    )
    assert seen[-1] == (res["n"], res["n"])
    with pytest.raises(ValueError, match="mode"):
        compare_tfhe(compiled, x, y, "encrypt")


def test_the_compiled_model_speaks_floats_through_its_quantizing_codec(setup):
    compiled, data = setup
    x = data.x_test[:8]
    np.testing.assert_array_equal(compiled.clear(x), compiled.program.forward(x, "clip"))
    np.testing.assert_array_equal(compiled.simulate(x[0]), compiled.clear(x[:1])[0])
    assert compiled.model is compiled.program.model
    # one owner of the quantization: the parameters carry the configuration the program was built
    # with
    assert compiled.backend.params.quant == compiled.program.config == resolve_quant(None)
    assert (
        compiled.report()["n_bits"] == compiled.backend.params.n_bits == resolve_quant(None).n_bits
    )


# ~150 s; Ray batches of both schemes stay in the default run (tests/test_deploy.py)
@pytest.mark.slow
def test_execution_on_ray_workers_equals_the_clear_program(setup):
    compiled, data = setup
    compiled.keygen()
    messages = []
    res = compare_tfhe(
        compiled,
        data.x_test[:2],
        data.y_test[:2].numpy(),
        "execute",
        workers=2,
        on_message=messages.append,
    )
    assert res["exact_integer_match"] == 1.0 and res["n"] + res["refused_overflow"] == 2
    assert messages and messages[0].startswith("Ray: 2 workers")


def test_the_simulation_check_tells_a_sampled_pbs_error_from_a_wrong_circuit(setup, monkeypatch):
    """Concrete's simulation samples PBS errors at the circuit's error probability: a mismatch that
    does not reproduce is one of those; one that does means the circuit is wrong."""
    compiled, data = setup
    x = data.x_train[:20]
    backend = compiled.backend
    real = backend.simulate
    odd = compiled.program.quantize_input(x)[3]
    calls = {"n": 0}

    def once(xi):  # the 4th simulation errs once, like a sampled PBS error
        calls["n"] += 1
        return real(xi) + (calls["n"] == 4)

    monkeypatch.setattr(backend, "simulate", once)
    check = compiled.verify(x)
    assert (check.n_equal, check.n_transient, check.first_mismatch) == (19, 1, 3)
    assert check.consistent and not check.exact and "simulated again" in check.describe()

    def always(xi):  # sample 3 differs every time: the circuit does not compute the program
        return real(xi) + np.array_equal(xi, odd)

    monkeypatch.setattr(backend, "simulate", always)
    check = compiled.verify(x)
    assert (check.n_equal, check.n_transient) == (19, 0) and not check.consistent
    assert "first mismatch: sample 3" in check.describe()
