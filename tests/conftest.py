import os
import random
import resource
import subprocess
import sys
import time

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


# ---------------------------------------------------------------- isolated tests
# TenSEAL's SEAL keeps every buffer it ever allocated in a process-wide memory pool and never
# returns it to the system (a freed N = 32768 context leaves its gigabytes behind), so one process
# running all the CKKS tests in turn ends at the sum of their pools. A test marked `isolated`
# runs alone in a fresh interpreter (`python -m pytest NODEID`): its memory goes back when it
# ends. The marker is a no-op inside that child.
CHILD_ENV = "FHE_TESTS_ISOLATED_CHILD"
_PEAKS: dict[str, int] = {}  # isolated test -> its process's peak RSS (bytes)


def _run_isolated(item) -> tuple[str, str, float]:
    """(outcome, output, seconds) of ``item`` run by pytest in a child process."""
    base = item.config._tmp_path_factory.getbasetemp() / f"isolated-{len(_PEAKS)}"
    cmd = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-m", "", "-p", "no:cacheprovider",
           "--basetemp", str(base)]  # fmt: skip
    env = {**os.environ, CHILD_ENV: "1"}
    start = time.perf_counter()
    child = subprocess.Popen(
        cmd, cwd=item.config.rootpath, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    output = child.stdout.read().decode(errors="replace") if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    _PEAKS[item.nodeid] = usage.ru_maxrss * 1024
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    if child.returncode == 0 and " passed" in summary:
        outcome = "passed"
    elif child.returncode == 0 and " skipped" in summary:
        outcome = "skipped"
    else:
        outcome = "failed"
    return outcome, output, time.perf_counter() - start


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("isolated") is None or os.environ.get(CHILD_ENV):
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    outcome, output, seconds = _run_isolated(item)
    keywords = {k: 1 for k in item.keywords}
    for when in ("setup", "call", "teardown"):
        if when == "call" and outcome == "failed":
            longrepr = f"failed in its isolated process (`python -m pytest {item.nodeid}`):\n"
            longrepr += output[-8000:]
            rep_outcome = "failed"
        elif when == "setup" and outcome == "skipped":
            longrepr = (str(item.path), item.location[1] or 0, output[-500:])
            rep_outcome = "skipped"
        else:
            longrepr, rep_outcome = None, "passed"
        rep = pytest.TestReport(
            item.nodeid, item.location, keywords, rep_outcome, longrepr, when, (),
            seconds if when == "call" else 0.0,
        )  # fmt: skip
        ihook.pytest_runtest_logreport(report=rep)
        if when == "setup" and outcome == "skipped":
            break
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_terminal_summary(terminalreporter):
    """The suite's peak memory, per process (issue 27 asks <= 8 GB for any run in `make test`)."""
    if os.environ.get(CHILD_ENV):
        return
    gib = 1024**3
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / gib
    line = f"peak RSS: pytest process {own:.1f} GiB"
    if _PEAKS:
        worst = max(_PEAKS, key=_PEAKS.__getitem__)
        line += f"; largest isolated test {_PEAKS[worst] / gib:.1f} GiB ({worst})"
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / gib
    line += f"; largest child process {children:.1f} GiB"
    terminalreporter.write_line(line)


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
