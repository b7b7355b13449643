"""Exit codes tell the truth after an encrypted run (pytest, and the `fhe` console script).

Once concrete-python 2.11 has run an encrypted circuit, a process's normal shutdown exits 0 whatever
status it was given; tests/conftest.py and ``fhe_cli.entry`` leave with ``os._exit`` instead.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FHE = Path(sys.executable).with_name("fhe")


def _pytest(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/fixtures/failing_after_encryption.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_failing_test_after_an_encrypted_run_fails_the_session():
    res = _pytest({"FHE_FIXTURE_PASS": "0"})
    assert "1 failed" in res.stdout, res.stdout + res.stderr
    assert res.returncode == 1, res.stdout


def test_the_same_test_passing_exits_zero():
    res = _pytest({"FHE_FIXTURE_PASS": "1"})
    assert "1 passed" in res.stdout, res.stdout + res.stderr
    assert res.returncode == 0


@pytest.mark.skipif(
    not FHE.exists(), reason="the fhe console script is not installed in this environment"
)
def test_a_cli_command_failing_after_an_encrypted_run_exits_non_zero(tiny_model, tmp_path):
    # the report is written after keygen and one encrypted sample; its folder does not exist
    bad_json = tmp_path / "no-such-dir" / "report.json"
    res = subprocess.run(
        [
            str(FHE),
            "compile",
            str(tiny_model),
            "--n-bits",
            "3",
            "--lut-bits",
            "5",
            "--inputset",
            "20",
            "--json",
            str(bad_json),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "encrypted output equals the clear integer program" in res.stdout, (
        res.stdout + res.stderr
    )
    assert res.returncode != 0, res.stdout + res.stderr
    assert "no-such-dir" in res.stderr
