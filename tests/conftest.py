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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny trained digits Inhibitor model file (`fhe train`, d_model 4, no norm): quick to compile."""
    from click.testing import CliRunner

    from fhe.cli import main

    path = tmp_path_factory.mktemp("tiny") / "tiny.pt"
    res = CliRunner().invoke(main, ["train", "--task", "digits", "--attention", "inhibitor", "--norm", "none",
                                    "--d-model", "4", "--heads", "1", "--epochs", "10", "--quiet", "-o", str(path)])
    assert res.exit_code == 0, res.output
    return path


def pytest_sessionfinish(session, exitstatus):
    _SESSION["exitstatus"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Exit with pytest's own status, whatever the interpreter's shutdown does.

    Once concrete-python 2.11 has run an encrypted circuit in a process, that process exits 0 whatever
    ``sys.exit`` asked for (tests/test_exit_codes.py reproduces it), so a failing suite would look green.
    After pytest has printed everything, flush and leave with ``os._exit`` (skipping the shutdown
    handlers that swallow the code)."""
    if "exitstatus" in _SESSION:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_SESSION["exitstatus"])
