"""What every API module shares: the message callback type and its silent default, option fields
(a configuration field that also declares its command-line option) and their enums."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from enum import Enum

from fhe.errors import BadOptionError
from models.config import coerce_enums as _coerce_enums

Echo = Callable[[str], None]


def silent(_: str) -> None:
    pass


def option_field(default, help: str = "", **extra):
    """A dataclass field with the help text of its CLI option and, in ``extra``: ``choices``,
    ``min`` (numbers), ``option`` (another option name), ``pair`` (an on/off pair for a bool that
    defaults to False), ``json`` (a JSON object), ``cli=False`` (no option).
    :func:`fhe_cli._common.options_from` generates the options from these."""
    return field(default=default, metadata={"help": help, **extra})


def coerce_enums(config, **kinds: type[Enum]) -> None:
    """:func:`models.config.coerce_enums` for the options of a command: an unknown value is a
    :class:`BadOptionError` (a usage error) naming the field and the choices."""
    try:
        _coerce_enums(config, **kinds)
    except ValueError as exc:
        raise BadOptionError(str(exc)) from None
