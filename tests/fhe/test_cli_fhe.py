"""`fhe quantize`, `fhe compile` and `fhe compare` on a tiny trained digits model."""

import json

from click.testing import CliRunner

from fhe_cli import main

PARAMS = {
    "lwe_dimension",
    "glwe_dimension",
    "polynomial_size",
    "pbs_base_log",
    "pbs_level",
    "ks_base_log",
    "ks_level",
}


def test_quantize_reports_widths_and_accuracy(tiny_model, tmp_path):
    out = tmp_path / "q.json"
    res = CliRunner().invoke(
        main, ["quantize", str(tiny_model), "--n-bits", "4", "--json", str(out), "--nodes"]
    )
    assert res.exit_code == 0, res.output
    info = json.loads(out.read_text())
    assert info["fits_tfhe"] and info["max_lut_input_bits"] <= 16 and 0 <= info["int_accuracy"] <= 1
    assert "| node | op | tag |" in res.output


def test_compile_report_and_simulated_comparison(tiny_model, tmp_path):
    rep_path = tmp_path / "r.json"
    res = CliRunner().invoke(
        main,
        [
            "compile",
            str(tiny_model),
            "--n-bits",
            "3",
            "--lut-bits",
            "5",
            "--no-run",
            "--json",
            str(rep_path),
            "--inputset",
            "20",
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(rep_path.read_text())
    assert (
        rep["scheme"] == "tfhe"
        and rep["seq_len"] == 4
        and rep["n_bits"] == 3
        and rep["pbs_count"] > 0
    )
    assert rep["params"].keys() >= PARAMS and rep["key_sizes_bytes"]["evaluation"] > 0
    cmp_path = tmp_path / "c.json"
    res = CliRunner().invoke(
        main,
        [
            "compare",
            str(tiny_model),
            "--n-bits",
            "3",
            "--lut-bits",
            "5",
            "--mode",
            "simulate",
            "--n",
            "30",
            "--inputset",
            "20",
            "--json",
            str(cmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    cmp = json.loads(cmp_path.read_text())
    assert cmp["exact_integer_match"] == 1.0  # simulation equals the clear integer program
    assert cmp["agreement"]["simulate_vs_clear"] == 1.0


def test_fhe_commands_fail_clearly(tiny_model, tiny_rows_model, tmp_path):
    res = CliRunner().invoke(
        main, ["compile", str(tiny_rows_model), "--scheme", "ckks"]
    )  # Inhibitor: deep polynomials
    assert (
        res.exit_code == 1
        and "needs multiplicative depth" in res.output
        and "--refresh" in res.output
    )
    res = CliRunner().invoke(
        main, ["compile", str(tiny_model), "--scheme", "ckks"]
    )  # Inhibitor: wide |q − k|
    assert res.exit_code == 1 and "needs a polynomial of degree > 31" in res.output
    assert "relax the tolerance" in res.output
    ln = tmp_path / "ln.pt"
    CliRunner().invoke(
        main,
        [
            "train",
            "--d-model",
            "4",
            "--heads",
            "1",
            "--epochs",
            "1",
            "--norm",
            "layernorm",
            "--quiet",
            "-o",
            str(ln),
        ],
    )
    res = CliRunner().invoke(main, ["compile", str(ln)])
    assert res.exit_code == 1 and "--norm none" in res.output
    res = CliRunner().invoke(main, ["compile", str(tmp_path / "missing.pt")])
    assert res.exit_code == 2 and "fhe train" in res.output


def test_compile_writes_artifacts_that_fhe_run_uses(tiny_model, tmp_path):
    out = tmp_path / "art"
    res = CliRunner().invoke(
        main, ["compile", str(tiny_model), "--n-bits", "3", "--lut-bits", "5", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "encrypted output equals the clear integer program: True" in res.output
    assert not (out / "server" / "keys.bin").exists() and (out / "client" / "keys.bin").exists()
    res = CliRunner().invoke(main, ["run", str(out), "--sample", "3"])
    assert res.exit_code == 0, res.output
    assert "sample 3: label" in res.output and "encrypted prediction" in res.output
    res = CliRunner().invoke(main, ["batch", str(out), "--n", "1"])
    assert res.exit_code == 0, res.output
    assert "1 samples in this process: accuracy" in res.output and "samples/s" in res.output
    res = CliRunner().invoke(main, ["run", str(tmp_path / "nothing")])
    assert res.exit_code == 1 and "no client artifact" in res.output and "fhe compile" in res.output


def test_report_with_its_defaults_compiles_both_kinds_and_plots(tmp_path):
    """`fhe report` at its default rounding compiles dot-product as well as Inhibitor circuits, and
    a simulated sweep (no run times to plot) still writes its PNG."""
    res = CliRunner().invoke(
        main, ["report", "--mode", "simulate", "--seq-lens", "2", "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "tfhe_attention.json").read_text())["reports"]
    assert {r["variant"] for r in rows} == {"inhibitor", "dot-product"}
    assert all(r["error"] is None and r["exact"] for r in rows)
    assert (tmp_path / "tfhe_attention.png").stat().st_size > 0


def test_compare_counts_refused_inputs_and_the_report_names_overflow_risks(tiny_model, tmp_path):
    rep_path = tmp_path / "r.json"
    res = CliRunner().invoke(
        main, ["compile", str(tiny_model), "--no-run", "--json", str(rep_path)]
    )
    assert res.exit_code == 0, res.output
    rep = json.loads(rep_path.read_text())
    assert rep["ranges"] == "calibrated" and rep["overflow_risks"] and "can overflow" in res.output
    cmp_path = tmp_path / "c.json"
    res = CliRunner().invoke(
        main,
        ["compare", str(tiny_model), "--mode", "simulate", "--n", "20", "--json", str(cmp_path)],
    )
    assert res.exit_code == 0, res.output
    cmp = json.loads(cmp_path.read_text())
    assert cmp["refused_overflow"] + cmp["n"] == 20 and cmp["exact_integer_match"] == 1.0


def test_ckks_report_writes_its_rows_and_refuses_unknown_kinds(tmp_path):
    res = CliRunner().invoke(
        main,
        [
            "report",
            "--scheme",
            "ckks",
            "--variants",
            "geglu-only",
            "--seq-lens",
            "4",
            "--mode",
            "simulate",
            "--layouts",
            "packed",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    (row,) = json.loads((tmp_path / "ckks_attention.json").read_text())["reports"]
    assert (row["kind"], row["seq_len"], row["layout"]) == ("geglu-only", 4, "packed") and row[
        "rotations"
    ] > 0
    res = CliRunner().invoke(
        main, ["report", "--scheme", "ckks", "--variants", "fourier", "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "--variants for CKKS" in res.output
    res = CliRunner().invoke(main, ["report", "--seq-lens", "2,x", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "comma-separated" in res.output
