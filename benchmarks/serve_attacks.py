"""The attacks on `fhe serve`, as a table: what was tried, what the service answered, whether it
stayed up, whether anything was lost or answered wrong.

Each row is one test marked ``@pytest.mark.attack`` (tests/test_serve_attacks.py,
tests/test_deploy.py), run here against real `fhe serve` processes on loopback. The test asserts
the answers, that the server is still alive and that no answer is wrong; the table says what the
marker declares and what the run gave (a failed test would be a "yes" in the last columns).

    python benchmarks/serve_attacks.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import ROOT, command_line, write_results  # noqa: E402

FILES = ("tests/test_serve_attacks.py", "tests/test_deploy.py")


class Collector:
    """A pytest plugin: each attack test's marker and outcome, written as the table when the session
    finishes (tests/conftest.py then leaves with pytest's status, see its pytest_unconfigure)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.start = time.perf_counter()

    def pytest_collection_modifyitems(self, items) -> None:
        keep = [item for item in items if item.get_closest_marker("attack")]
        items[:] = keep
        for item in keep:
            mark = item.get_closest_marker("attack").kwargs
            self.rows[item.nodeid] = {"test": item.name, **mark, "outcome": "not run", "s": 0.0}

    def pytest_runtest_logreport(self, report) -> None:
        row = self.rows.get(report.nodeid)
        if row is None:
            return
        row["s"] += report.duration
        if report.failed or (report.when == "call" and report.passed):
            row["outcome"] = "passed" if report.passed else f"failed ({report.when})"

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        write_table(list(self.rows.values()), time.perf_counter() - self.start, int(exitstatus))


def write_table(rows: list[dict], wall: float, status: int) -> None:
    lines = [
        "# `fhe serve` attacked",
        "",
        f"`{command_line()}`",
        "",
        f"{len(rows)} attacks, each a test run against real `fhe serve` processes on loopback "
        f"({wall:.0f} s; {os.cpu_count()} cores, shared, 1-minute load {os.getloadavg()[0]:.1f} "
        "at the end). A passed test has asserted every answer below, that the server is still "
        "up, and that no answer is wrong.",
        "",
        "| attack | answer | server died | wrong answer or data lost | what is checked kept | "
        "test | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bad = "no" if r["outcome"] == "passed" else f"see test ({r['outcome']})"
        lines.append(
            f"| {r['what']} | {r['answer']} | {bad} | {bad} | {r['kept']} | `{r['test']}` | "
            f"{r['s']:.0f} |"
        )
    write_results("serve_attacks", lines, {"rows": rows, "pytest_status": status})
    print("\n".join(lines), flush=True)


def main() -> None:
    sys.exit(
        pytest.main(
            ["-q", "-p", "no:cacheprovider", "-m", "attack", *(str(ROOT / f) for f in FILES)],
            plugins=[Collector()],
        )
    )


if __name__ == "__main__":
    main()
