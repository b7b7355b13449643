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
