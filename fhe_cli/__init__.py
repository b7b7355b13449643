"""The ``fhe`` command line, the top floor: each command parses its options, makes one call of
:mod:`fhe.api` (``fhe report``: :mod:`circuits`) and prints. One module per command family, none
over 300 lines.

Library errors become click errors in one place (:func:`fhe_cli._common.library_errors`): a
:class:`~fhe.errors.BadOptionError` exits 2 (usage), any other :class:`~fhe.errors.FheError` exits
1.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

# command name -> (module, function): each module is imported when its command runs, so `fhe serve`
# does not load torch or an FHE library into the service process (`fhe --help` imports them all)
COMMANDS = {
    "train": ("fhe_cli.train", "train"),
    "quantize": ("fhe_cli.quantize", "quantize"),
    "evaluate": ("fhe_cli.quantize", "evaluate"),
    "compile": ("fhe_cli.compile", "compile_cmd"),
    "run": ("fhe_cli.compile", "run_cmd"),
    "compare": ("fhe_cli.compile", "compare"),
    "batch": ("fhe_cli.compile", "batch"),
    "report": ("fhe_cli.report", "report"),
    "serve": ("fhe_cli.serve", "serve"),
    "serve-token": ("fhe_cli.serve", "serve_token"),
    "client": ("fhe_cli.serve", "client_cmd"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """fhe-attention: private inference for small transformers, and what it costs."""


def entry() -> None:
    """The ``fhe`` console script: :func:`main`, leaving with the status it meant.

    After an encrypted Concrete run, the interpreter's normal shutdown turns every exit status into
    0 (tests/test_exit_codes.py), so a failed command would look successful to a script or CI. This
    runs the click group, prints what click or Python would print, then flushes and calls
    ``os._exit``."""
    status = 0
    try:
        main(standalone_mode=True)
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: B036  (KeyboardInterrupt included: report it and fail)
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
