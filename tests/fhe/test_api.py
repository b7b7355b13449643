"""fhe/api.py from Python, as a notebook uses it: the calls behind the CLI, without click."""

import numpy as np
import pytest

from fhe import api
from fhe.errors import BadOptionError, FheError
from fhe.summaries import format_report


def test_compile_check_and_report_from_python(tiny_model):
    c = api.compile_file(
        tiny_model,
        api.CompileOptions(n_bits=3, lut_bits=5, inputset=20, n_calib=200),
        simulate_only=True,
    )
    messages = []
    api.check_circuit(c, on_message=messages.append)
    assert messages and messages[0].startswith("simulation == clear integer program on 200/200")
    rep = c.report()
    assert rep["scheme"] == "tfhe" and rep["n_bits"] == 3
    text = format_report(rep)
    assert any(line.split()[:2] == ["PBS", str(rep["pbs_count"])] for line in text.splitlines())
    assert (
        text.count("\n  | ") == len(rep["stages"]) + 1
    )  # one table row per stage, after the header
    # float in, float out: Concrete's simulation of one test sample equals the clear integer program
    x = c.data.x_test[:1]
    np.testing.assert_array_equal(c.compiled.simulate(x[0]), c.compiled.clear(x)[0])


def test_bad_options_and_files_are_told_apart_from_failures(tiny_model, tmp_path):
    with pytest.raises(BadOptionError, match="fhe train"):
        api.compile_file(tmp_path / "missing.pt")
    with pytest.raises(BadOptionError, match="scheme"):
        api.CompileOptions(scheme="bgv")
    with pytest.raises(BadOptionError, match="mode"):
        api.compare_file(tiny_model, mode="guess")
    with pytest.raises(
        FheError, match="needs a polynomial of degree > 31"
    ):  # a failure, not a usage error
        api.compile_file(tiny_model, api.CompileOptions(scheme="ckks"))
    with pytest.raises(BadOptionError, match="outer_bits"):
        api.compile_file(tiny_model, api.CompileOptions(scheme="ckks", outer_bits=70))
    with pytest.raises(BadOptionError, match=".npy"):
        api.read_input(tmp_path / "x.txt")
    np.save(tmp_path / "x.npy", np.ones((4, 16)))
    assert api.read_input(tmp_path / "x.npy").shape == (4, 16)


def test_options_from_a_mapping_keep_only_theirs():
    opts = api.CompileOptions.from_mapping(
        {"scheme": "ckks", "poly_modulus_degree": "16384", "json_path": "x"}
    )
    assert (
        opts.scheme == "ckks" and opts.poly_modulus_degree == 16384 and opts.calib_samples == 5000
    )
    assert api.CompileOptions().calib_samples == 2000


def test_auto_layout_packs_one_query_and_batches_a_dataset():
    def choice(for_dataset=False, **opts):
        return api.choose_layout(api.CompileOptions(scheme="ckks", **opts), for_dataset)

    one, many, refreshed, asked = (
        choice(),
        choice(True),
        choice(refresh=True),
        choice(layout="batch"),
    )
    assert (one.layout, many.layout, refreshed.layout, asked.layout) == (
        "packed",
        "batch",
        "batch",
        "batch",
    )
    assert "one query" in one.reason and "dataset" in many.reason
    assert "--refresh" in refreshed.reason and "asked" in asked.reason
    with pytest.raises(BadOptionError, match="layout"):
        api.CompileOptions(scheme="ckks", layout="diagonal")


def test_compile_options_hold_enums_and_the_parameter_classes_defaults():
    from fhe.ckks.approx import ApproxConfig
    from fhe.schemes import (
        CkksEngine,
        CkksParams,
        LayoutOption,
        Ranges,
        Rounding,
        Scheme,
        TfheParams,
    )
    from quant.config import RangeMode

    opts = api.CompileOptions(
        scheme="ckks", rounding="approximate", ranges="proven", layout="packed", range_mode="minmax"
    )
    assert (opts.scheme, opts.rounding, opts.ranges, opts.layout, opts.range_mode) == (
        Scheme.CKKS,
        Rounding.APPROXIMATE,
        Ranges.PROVEN,
        LayoutOption.PACKED,
        RangeMode.MINMAX,
    )
    assert all(
        isinstance(v, type(w))
        for v, w in [(opts.scheme, Scheme.TFHE), (opts.engine, CkksEngine.TENSEAL)]
    )
    # each default is declared once, by the parameters the backends take
    default, tfhe, ckks, approx = api.CompileOptions(), TfheParams(), CkksParams(), ApproxConfig()
    assert (default.global_p_error, default.inputset, default.ranges, default.compress_keys) == (
        tfhe.global_p_error,
        tfhe.inputset_size,
        tfhe.ranges,
        tfhe.compress_keys,
    )
    assert (default.rounding is Rounding.EXACT) == tfhe.exact_rounding
    assert (default.scale_bits, default.outer_bits, default.engine) == (
        ckks.scale_bits,
        ckks.outer_bits,
        ckks.engine,
    )
    assert (default.reciprocal_tol, default.activation_tol, default.max_degree) == (
        approx.reciprocal_tol,
        approx.activation_tol,
        approx.max_degree,
    )
    for field, bad in [("rounding", "nearest"), ("ranges", "guessed"), ("engine", "seal")]:
        with pytest.raises(BadOptionError, match=f"{field} must be one of"):
            api.CompileOptions(**{field: bad})


def test_quantize_options_give_the_library_quantization_by_default():
    from quant import QuantConfig
    from quant.config import Granularity, RangeMode

    assert api.QuantizeOptions().config() == QuantConfig()
    cfg = api.QuantizeOptions(
        n_bits=4, per_channel=True, asymmetric=True, range_mode="percentile"
    ).config()
    assert (cfg.n_bits, cfg.weight_granularity, cfg.symmetric, cfg.range_mode) == (
        4,
        Granularity.PER_CHANNEL,
        False,
        RangeMode.PERCENTILE,
    )
    with pytest.raises(BadOptionError, match="n_bits"):
        api.QuantizeOptions(n_bits=1).config()
    with pytest.raises(BadOptionError, match="range_mode"):
        api.QuantizeOptions(range_mode="median")


def test_train_request_holds_enums_and_names_the_choices_of_a_bad_one():
    from fhe.api.recipes import Recipe
    from fhe.api.train import QatMethod
    from models.config import Activation, AttentionKind, NormKind, PowerForm

    req = api.TrainRequest(
        attention="power-softmax",
        recipe="ckks",
        norm="layernorm",
        ffn_activation="gelu",
        power_form="length-agnostic",
        qat_method="brevitas",
    )
    assert (req.attention, req.recipe, req.norm, req.ffn_activation) == (
        AttentionKind.POWER_SOFTMAX,
        Recipe.CKKS,
        NormKind.LAYERNORM,
        Activation.GELU,
    )
    assert req.power_form is PowerForm.LENGTH_AGNOSTIC and req.qat_method is QatMethod.BREVITAS
    assert api.TrainRequest().power_form is None and api.TrainRequest().recipe is None
    with pytest.raises(BadOptionError, match="qat_method must be one of program, brevitas"):
        api.TrainRequest(qat_method="distill")
    # the recipe's strings become the same enums
    assert (
        api.with_recipe(api.TrainRequest(task="digits", recipe="ckks")).norm is NormKind.BATCHNORM
    )
