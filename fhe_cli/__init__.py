"""The ``fhe`` command line, the top floor: each command parses its options, makes one call of
:mod:`fhe.api` (``fhe report``: :mod:`circuits`) and prints. One module per command family, none
over 300 lines.

Library errors become click errors in one place (:func:`fhe_cli._common.library_errors`): a
:class:`~fhe.errors.BadOptionError` exits 2 (usage), any other :class:`~fhe.errors.FheError` exits
1.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from fhe_cli.compile import batch, compare, compile_cmd, run_cmd
from fhe_cli.quantize import evaluate, quantize
from fhe_cli.report import report
from fhe_cli.serve import client_cmd, serve, serve_token
from fhe_cli.train import train


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """fhe-attention: private inference for small transformers, and what it costs."""


for _command in (
    train,
    quantize,
    evaluate,
    compile_cmd,
    run_cmd,
    compare,
    batch,
    report,
    serve,
    serve_token,
    client_cmd,
):
    main.add_command(_command)


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
