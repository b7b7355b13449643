"""Encrypted CKKS runs (TenSEAL) against the clear polynomial program, and the secret key
boundary."""

import json

import numpy as np
import pytest
import tenseal as ts
import torch
from ckks_models import secret_key_windows, tiny
from click.testing import CliRunner

from fhe.ckks import ApproxConfig
from fhe.harness import compile_model
from fhe.schemes import CkksParams
from fhe_cli import main

LOOSE = ApproxConfig(reciprocal_tol=0.05, activation_tol=0.05)


def compiled(model, **params):
    calib = torch.randn(300, 4, 3, dtype=torch.float64)
    return compile_model(model, calib, CkksParams(approx=LOOSE, **params))


def assert_matches_clear(cm, n=64):
    x = torch.randn(n, 4, 3, dtype=torch.float64).numpy()
    cm.keygen()
    enc, clear = cm.encrypt_run_decrypt(x), cm.clear(x)
    assert enc.shape == clear.shape == (n, 3)
    assert np.max(np.abs(enc - clear)) < 1e-3 * max(1.0, np.abs(clear).max())
    assert (enc.argmax(1) == clear.argmax(1)).mean() >= 0.98
    return cm.report()


def test_geglu_program_runs_encrypted_without_refresh():
    cm = compiled(tiny(attention="geglu-only"))
    rep = assert_matches_clear(cm)
    assert (
        rep["poly_modulus_degree"] == 16384
        and rep["depth"] <= 7
        and not rep["client_assisted_refresh"]
    )
    assert rep["op_counts"]["client_refresh"] == 0 and rep["op_counts"]["rotation"] == 0
    assert rep["key_sizes_bytes"]["galois_keys"] == 0 and rep["key_sizes_bytes"]["relin_keys"] > 0
    # one compiled-model class for both schemes: CKKS's codec is the identity, and there is no
    # integer program
    x = torch.randn(5, 4, 3, dtype=torch.float64).numpy()
    np.testing.assert_array_equal(cm.simulate(x), cm.clear(x))
    assert cm.model.config.attention.value == "geglu-only"
    with pytest.raises(AttributeError, match="ckks compiled model has no integer program"):
        _ = cm.program


def test_power_softmax_runs_encrypted_with_a_labelled_refresh():
    cm = compiled(tiny(power_eps=0.5), poly_modulus_degree=8192, refresh=True)
    rep = assert_matches_clear(cm)
    assert rep["client_assisted_refresh"] and rep["op_counts"]["client_refresh"] > 0
    assert rep["program_depth_without_refresh"] > rep["depth"] == 2
    assert {"block0.attention.reciprocal", "block0.ffn.gelu"} <= rep["approximations"].keys()
    assert rep["timings_s"]["run"] > 0 and "stage.block0.attention.scores" in rep["timings_s"]


@pytest.mark.parametrize("kind", ["dot-product", "dct", "inhibitor"])
def test_every_kind_runs_encrypted(kind):
    """exp and Goldschmidt (dot-product, DCT-Former) and the Inhibitor's |x| and ReLU polynomials,
    encrypted (N = 8192 with labelled refreshes keeps the run to seconds), against the clear
    polynomial program."""
    overrides = {"seq_len": 3, "d_model": 2, "n_heads": 1} if kind == "inhibitor" else {}
    model = tiny(attention=kind, **overrides)
    calib = torch.randn(300, model.config.seq_len, 3, dtype=torch.float64)
    cm = compile_model(
        model, calib, CkksParams(approx=LOOSE, poly_modulus_degree=8192, refresh=True)
    )
    x = torch.randn(32, model.config.seq_len, 3, dtype=torch.float64).numpy()
    cm.keygen()
    enc, clear = cm.encrypt_run_decrypt(x), cm.clear(x)
    assert np.max(np.abs(enc - clear)) < 1e-3 * max(1.0, np.abs(clear).max())
    assert (enc.argmax(1) == clear.argmax(1)).mean() >= 0.95


@pytest.mark.slow
def test_power_softmax_runs_encrypted_non_interactively_at_n32768():
    rep = assert_matches_clear(compiled(tiny(power_eps=0.5)))
    assert rep["poly_modulus_degree"] == 32768 and rep["op_counts"]["client_refresh"] == 0


def test_server_artifact_holds_no_secret_key(tmp_path):
    cm = compiled(tiny(attention="geglu-only"))
    cm.keygen()
    paths = cm.save(tmp_path, include_secret_key=True)
    server_ctx = ts.context_from((paths["server"] / "context.public").read_bytes())
    assert server_ctx.is_public() and not server_ctx.has_secret_key()
    secret = secret_key_windows(cm.backend.client_ctx)
    assert len(secret) > 10
    server_bytes = b"".join(p.read_bytes() for p in paths["server"].iterdir())
    client_bytes = (paths["client"] / "context.secret").read_bytes()
    assert all(w in client_bytes for w in secret)  # the search finds the key where it is ...
    assert not any(w in server_bytes for w in secret)  # ... and not in the server artifact
    # the server still computes: a ciphertext linked to the public context runs the program
    x = torch.randn(4, 4, 3, dtype=torch.float64).numpy()
    out = cm.backend.run(cm.backend.encrypt(x))
    assert all(ct.context().is_private() for ct in out)  # decryption happens back on the client
    np.testing.assert_allclose(cm.backend.decrypt(out), cm.clear(x), atol=1e-3)


@pytest.fixture(scope="module")
def ps_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckks") / "ps.pt"
    res = CliRunner().invoke(
        main,
        [
            "train",
            "--task",
            "digits",
            "--attention",
            "power-softmax",
            "--norm",
            "none",
            "--ffn-activation",
            "gelu",
            "--power-form",
            "length-agnostic",
            "--d-model",
            "4",
            "--heads",
            "1",
            "--epochs",
            "3",
            "--quiet",
            "-o",
            str(path),
        ],
    )
    assert res.exit_code == 0, res.output
    return path


def test_cli_compile_report_and_encrypted_compare(ps_checkpoint, tmp_path):
    rep_path = tmp_path / "rep.json"
    res = CliRunner().invoke(
        main,
        [
            "compile",
            str(ps_checkpoint),
            "--scheme",
            "ckks",
            "--no-run",
            "--refresh",
            "--poly-modulus-degree",
            "8192",
            "--json",
            str(rep_path),
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(rep_path.read_text())
    for key in (
        "scheme",
        "depth",
        "depth_per_tag",
        "poly_modulus_degree",
        "coeff_mod_bit_sizes",
        "scale_bits",
        "security_bits",
        "op_counts",
        "key_sizes_bytes",
        "timings_s",
        "seq_len",
    ):
        assert key in rep, key
    assert rep["scheme"] == "ckks" and rep["seq_len"] == 8 and rep["security_bits"] == 128
    assert rep["coeff_mod_bit_sizes"] == [60, 40, 40, 60]
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(
        main,
        [
            "compare",
            str(ps_checkpoint),
            "--scheme",
            "ckks",
            "--mode",
            "execute",
            "--n",
            "40",
            "--refresh",
            "--poly-modulus-degree",
            "8192",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    cmp = json.loads(out.read_text())
    assert cmp["n"] == 40 and cmp["mse_encrypted_vs_clear"]["max_per_sample"] < 1e-4
    assert cmp["agreement"]["encrypted_vs_poly_clear"] >= 0.95
    assert set(cmp["accuracy"]) == {"float", "float_inference", "poly_clear", "encrypted"}


def test_cli_depth_error_names_the_fix(ps_checkpoint):
    res = CliRunner().invoke(
        main,
        [
            "compile",
            str(ps_checkpoint),
            "--scheme",
            "ckks",
            "--no-run",
            "--poly-modulus-degree",
            "8192",
        ],
    )
    assert res.exit_code == 1 and "multiplicative depth" in res.output and "--refresh" in res.output


def test_operands_keep_their_level_despite_tenseals_in_place_mod_switch():
    """TenSEAL mod-switches the second operand in place when it has more levels left; the arithmetic
    orders operands so that no value loses levels behind the bookkeeping's back (regression)."""
    from fhe.ckks import Val
    from fhe.ckks.backend import CkksArith

    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[60, 40, 40, 60]
    )
    ctx.global_scale = 2.0**40
    ar = CkksArith(max_depth=2)
    x = Val(ts.ckks_vector(ctx, [0.5, -1.0]), 0)
    y = ar.lincomb([x], [0.5])  # level 1
    ar.add(y, x)
    ar.mul(y, x)  # x second and shallower: TenSEAL alone would switch x down to level 1
    xx = ar.square(ar.square(x))  # needs x at level 0 still
    np.testing.assert_allclose(xx.data.decrypt(), [0.0625, 1.0], atol=1e-4)


def test_cli_compile_out_then_fhe_run_serves_from_the_artifacts(ps_checkpoint, tmp_path):
    art = tmp_path / "art"
    res = CliRunner().invoke(
        main,
        [
            "compile",
            str(ps_checkpoint),
            "--scheme",
            "ckks",
            "--no-run",
            "--refresh",
            "--poly-modulus-degree",
            "8192",
            "--out",
            str(art),
        ],
    )
    assert res.exit_code == 0, res.output
    assert not ts.context_from((art / "server" / "context.public").read_bytes()).has_secret_key()
    res = CliRunner().invoke(main, ["run", str(art), "--sample", "2"])
    assert res.exit_code == 0, res.output
    logits = json.loads(res.output.split("logits")[1].strip())
    from fhe.ckks.backend import CkksServer
    from models.tasks import load_task

    x = load_task("digits").x_test[2:3].numpy()
    np.testing.assert_allclose(logits, CkksServer(art / "server").program.clear(x)[0], atol=2e-3)


def test_train_init_fine_tunes_an_existing_model_in_the_length_agnostic_form(tmp_path):
    base, tuned = tmp_path / "base.pt", tmp_path / "tuned.pt"
    common = [
        "train",
        "--task",
        "digits",
        "--attention",
        "power-softmax",
        "--norm",
        "none",
        "--d-model",
        "4",
        "--heads",
        "1",
        "--epochs",
        "1",
        "--quiet",
    ]
    assert (
        CliRunner().invoke(main, [*common, "--power-eps", "0.02", "-o", str(base)]).exit_code == 0
    )
    res = CliRunner().invoke(
        main,
        [
            *common,
            "--init",
            str(base),
            "--power-form",
            "length-agnostic",
            "--range-loss",
            "0.1",
            "--range-threshold",
            "1",
            "-o",
            str(tuned),
        ],
    )
    assert res.exit_code == 0, res.output
    from models.training import load_checkpoint

    cfg = load_checkpoint(tuned).model.config
    assert cfg.power_form == "length-agnostic" and cfg.power_eps == 0.02  # ε kept from --init
