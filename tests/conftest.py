import os
import random
import sys

import numpy as np
import pytest
import torch

torch.set_num_threads(2)

_SESSION: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _train_tiny(path, *extra: str):
    from click.testing import CliRunner

    from fhe_cli import main

    res = CliRunner().invoke(
        main,
        [
            "train",
            "--task",
            "digits",
            *extra,
            "--attention",
            "inhibitor",
            "--norm",
            "none",
            "--d-model",
            "4",
            "--heads",
            "1",
            "--epochs",
            "10",
            "--quiet",
            "-o",
            str(path),
        ],
    )
    assert res.exit_code == 0, res.output
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny trained digits Inhibitor model file (`fhe train`, 4 tokens of 4x4 pixels, d_model 4,
    no norm): quick to compile and to run encrypted (~13 s a sample at 3 bits, half the 8-token
    model's time)."""
    return _train_tiny(tmp_path_factory.mktemp("tiny") / "tiny.pt", "--patch", "4")


@pytest.fixture(scope="session")
def tiny_rows_model(tmp_path_factory):
    """The same on the default tokens (8 rows of 8 pixels), whose residual branch overflows on
    inputs unlike the calibration set (the overflow tests need such a model)."""
    return _train_tiny(tmp_path_factory.mktemp("tiny_rows") / "tiny_rows.pt")


def pytest_sessionfinish(session, exitstatus):
    _SESSION["exitstatus"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Exit with pytest's own status, whatever the interpreter's shutdown does.

    Once concrete-python 2.11 has run an encrypted circuit in a process, that process exits 0
    whatever ``sys.exit`` asked for (tests/test_exit_codes.py reproduces it), so a failing suite
    would look green. After pytest has printed everything, flush and leave with ``os._exit``
    (skipping the shutdown handlers that swallow the code)."""
    if "exitstatus" in _SESSION:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_SESSION["exitstatus"])
