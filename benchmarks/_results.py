"""One place that writes ``benchmarks/results/<stem>.md`` and ``.json`` (each Markdown file starts
with the command that produced it)."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Hashable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]


def command_line() -> str:
    """The command that reran this script, from the repository's root (no machine's paths)."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path(script.name)
    return "python " + shlex.join([shown.as_posix(), *sys.argv[1:]])  # quoted as typed


def merged_with_saved(
    stem: str, rows: list[dict], key: Callable[[dict], Hashable], load: str, command: str
) -> tuple[list[dict], str, str]:
    """A partial rerun against ``results/<stem>.json``: the saved rows, each replaced by the fresh
    row with its ``key`` (fresh rows with new keys appended), and the saved load and command
    followed by this run's."""
    old = json.loads((RESULTS / f"{stem}.json").read_text())
    fresh = {key(r): r for r in rows}
    merged = [fresh.pop(key(r), r) for r in old["rows"]] + list(fresh.values())
    return merged, f"{old['load']}, then {load}", f"{old['command']}; then {command}"


def write_results(stem: str, markdown_lines: list[str], data) -> dict[str, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    md, js = RESULTS / f"{stem}.md", RESULTS / f"{stem}.json"
    md.write_text("\n".join(markdown_lines) + "\n")
    js.write_text(json.dumps(data, indent=2, default=float))
    return {"md": md, "json": js}
