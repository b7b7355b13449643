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
