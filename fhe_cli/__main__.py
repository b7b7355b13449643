"""``python -m fhe_cli``: the ``fhe`` command."""

from fhe_cli import entry

entry()
