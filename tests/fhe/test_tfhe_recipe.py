"""TFHE defaults, the stage table and the pre-flight check; the default `fhe train` model
compiles."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from circuits.attention import CircuitSpec, build
from fhe.schemes import TfheParams
from fhe.tfhe.backend import TfheBackend
from fhe.tfhe.recipe import (
    DEFAULT_QUANT,
    SLOW_HOUR_FACTOR,
    KeysTooLargeError,
    Preflight,
    preflight,
    resolve_quant,
)
from fhe_cli import main
from models.config import AttentionKind
from quant import QuantConfig

FHE = Path(sys.executable).with_name("fhe")


def test_resolve_quant_takes_the_record_then_the_options():
    assert resolve_quant() == DEFAULT_QUANT
    recorded = QuantConfig(n_bits=5, lut_bits=6).to_dict()
    assert resolve_quant(recorded).n_bits == 5 and resolve_quant(recorded).lut_bits == 6
    q = resolve_quant(recorded, n_bits=7, lut_bits=0, weight_bits=None)
    assert q.n_bits == 7 and q.lut_bits is None and q.weight_bits is None


@pytest.fixture(scope="module")
def backend():
    built = build(CircuitSpec(AttentionKind.INHIBITOR, 2, d=2, n_bits=3, lut_bits=4))
    return TfheBackend.compile(
        built.graph,
        built.calib_ints,
        TfheParams(quant=QuantConfig(n_bits=3), inputset_size=32),
        simulate_only=True,
    )


def test_stage_table_accounts_for_every_pbs(backend):
    rep = backend.report()
    stages = rep["stages"]
    assert sum(r["pbs"] for r in stages) == rep["pbs_count"]
    assert abs(sum(r["est_time_share"] for r in stages) - 1) < 1e-3
    assert all(r["lookup_input_bits"] is None or r["lookup_input_bits"] <= 4 for r in stages)
    assert rep["estimated_latency_s"] > 0


def test_preflight_refuses_keys_that_do_not_fit(backend):
    check = preflight(backend.circuit, memory_bytes=1)
    with pytest.raises(KeysTooLargeError, match="--lut-bits"):
        check.check()
    preflight(backend.circuit, memory_bytes=1 << 40).check()
    assert "MiB" in check.describe()


def test_preflight_states_the_estimate_and_its_slow_machine_bound():
    text = Preflight(917 * 2**20, 24.5, 1 << 34).describe()
    assert "917 MiB" in text and "24.5 s per sample" in text
    assert f"up to {24.5 * SLOW_HOUR_FACTOR:.0f} s" in text


@pytest.fixture(scope="module")
def default_model(tmp_path_factory):
    """`fhe train` with default options (BatchNorm), at a small size to keep the test short: d_model
    4 and 4 tokens of 4x4 pixels."""
    path = tmp_path_factory.mktemp("default") / "model.pt"
    res = CliRunner().invoke(
        main,
        [
            "train",
            *("--d-model", "4", "--heads", "1", "--patch", "4", "--epochs", "3"),
            *("--quiet", "-o", str(path)),
        ],
    )
    assert res.exit_code == 0, res.output
    return path


@pytest.mark.skipif(
    not FHE.exists(), reason="the fhe console script is not installed in this environment"
)
def test_default_train_then_compile_runs_encrypted(default_model, tmp_path):
    rep_path = tmp_path / "r.json"
    res = subprocess.run(
        [str(FHE), "compile", str(default_model), "--json", str(rep_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "expected evaluation keys" in res.stdout
    assert "/1437 calibration samples" in res.stdout  # all of train; consistent, or exit 1
    assert "encrypted output equals the clear integer program: True" in res.stdout
    rep = json.loads(rep_path.read_text())
    assert max(r["lookup_input_bits"] or 0 for r in rep["stages"]) <= DEFAULT_QUANT.lut_bits
    # seeded keys by default: what the client stores and uploads is a fraction of what the server
    # expands
    # (uncompressed, the serialisation is ~85% of Concrete's in-memory size); the run above used
    # them
    keys = rep["key_sizes_bytes"]
    assert rep["compressed_keys"] and 0 < keys["evaluation_serialized"] < keys["evaluation"] / 2, (
        keys
    )


@pytest.mark.skipif(
    not FHE.exists(), reason="the fhe console script is not installed in this environment"
)
def test_compile_refuses_before_keygen_when_keys_will_not_fit(default_model):
    env = {**os.environ, "FHE_AVAILABLE_MEMORY_BYTES": "1000000"}
    res = subprocess.run(
        [str(FHE), "compile", str(default_model)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 1
    assert "keygen needs about" in res.stderr and "--lut-bits" in res.stderr
    assert "generating keys" not in res.stdout


def test_compile_refuses_a_circuit_whose_simulation_differs_from_the_program(
    default_model, monkeypatch
):
    real = TfheBackend.simulate

    def off_by_one_on_the_third_input(self, x, seen=[]):  # noqa: B006 - shared across calls
        # every simulation of the third calibration input differs (a sampled PBS error would not
        # reproduce, and the check would not refuse it)
        if len(seen) < 3:
            seen.append(np.array(x))
        wrong = len(seen) == 3 and np.array_equal(x, seen[2])
        return real(self, x) + wrong

    monkeypatch.setattr(TfheBackend, "simulate", off_by_one_on_the_third_input)
    res = CliRunner().invoke(main, ["compile", str(default_model), "--no-run", "--calib", "20"])
    assert res.exit_code == 1, res.output
    assert "19/20 calibration samples" in res.output and "first mismatch: sample 2" in res.output
    assert "refusing" in res.output
