"""The options of ``fhe compile`` and ``fhe compare`` (both schemes): generated from
:class:`fhe.api.CompileOptions`, where each is declared once with its default and help."""

from __future__ import annotations

from fhe.api.compilation import SCHEMES, CompileOptions
from fhe_cli._common import options_from

fhe_options = options_from(CompileOptions)

__all__ = ["SCHEMES", "fhe_options"]
