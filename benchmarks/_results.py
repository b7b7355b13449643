"""One place that writes ``benchmarks/results/<stem>.md`` and ``.json`` (each Markdown file starts
with the command that produced it)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]


def command_line() -> str:
    """The command that reran this script, from the repository's root (no machine's paths)."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path(script.name)
    return "python " + shlex.join([shown.as_posix(), *sys.argv[1:]])  # quoted as typed


def write_results(stem: str, markdown_lines: list[str], data) -> dict[str, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    md, js = RESULTS / f"{stem}.md", RESULTS / f"{stem}.json"
    md.write_text("\n".join(markdown_lines) + "\n")
    js.write_text(json.dumps(data, indent=2, default=float))
    return {"md": md, "json": js}
