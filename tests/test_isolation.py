"""The `isolated` marker (tests/conftest.py): such a test runs in its own pytest process."""

import os

import pytest
from conftest import CHILD_ENV


@pytest.mark.isolated
def test_an_isolated_test_runs_in_a_child_process():
    assert os.environ.get(CHILD_ENV) == "1"


def test_other_tests_run_in_the_session_process():
    assert not os.environ.get(CHILD_ENV)
