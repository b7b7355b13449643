"""What every ``fhe`` command module shares: library errors turned into click's, JSON in and out,
and options made from a frozen configuration dataclass (its defaults and help text declared once, in
the dataclass)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from pathlib import Path

import click


def library_errors(fn):
    """Run a command body, turning the library's errors into click's (usage: exit 2, failure: exit
    1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from fhe.errors import BadOptionError, FheError

        try:
            return fn(*args, **kwargs)
        except BadOptionError as exc:
            raise click.UsageError(str(exc)) from exc
        except (FheError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def echo_err(message: str) -> None:
    click.echo(message, err=True)


def json_object(param, value: str | None) -> dict:
    """A JSON object option ({} when not given); anything else is a usage error."""
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param=param) from exc
    if not isinstance(parsed, dict):
        raise click.BadParameter("expected a JSON object ({...})", param=param)
    return parsed


def write_json(path: Path | None, payload: dict) -> None:
    if path:
        path.write_text(json.dumps(payload, indent=2))


def _click_type(hint, low) -> tuple[object, bool]:
    """(click type, is a flag) for a type hint (``X | None`` allowed); numbers >= ``low``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    if hint is bool:
        return None, True
    if hint is int:
        return click.IntRange(min=low), False
    if hint is float:
        return click.FloatRange(min=low), False
    if hint is Path:
        return click.Path(path_type=Path), False
    if isinstance(hint, type) and issubclass(hint, enum.Enum):  # the dataclass makes the member
        return click.Choice([m.value for m in hint]), False
    return str, False


def options_from(config_type):
    """A decorator adding one ``--field-name`` option per field of ``config_type``, its default and
    help from the dataclass; an Enum field's choices are its values. Field metadata
    (:func:`fhe.api._common.option_field`) may add ``help``, ``min`` (numbers), ``choices``,
    ``option`` (another option name; the command still receives the field's name), ``pair`` (an
    on/off pair for a bool that defaults to False), ``json`` (a JSON object, {} when not given) and
    ``cli=False`` (no option). A bool that defaults to False is a flag, one that defaults to True an
    on/off pair. The command receives the options as keyword arguments; :func:`config_from`
    rebuilds the configuration."""
    hints = typing.get_type_hints(config_type)

    def decorate(fn):
        for f in reversed(dataclasses.fields(config_type)):
            if f.metadata.get("cli", True):
                fn = _option(f, hints[f.name])(fn)
        return fn

    return decorate


def _option(f: dataclasses.Field, hint):
    meta = f.metadata
    name = meta.get("option", "--" + f.name.replace("_", "-"))
    help_text = meta.get("help", "")
    if meta.get("json"):
        return click.option(
            name,
            f.name,
            default=None,
            help=help_text,
            callback=lambda ctx, param, value: json_object(param, value),
        )
    kind, flag = _click_type(hint, meta.get("min", 0))
    if flag and f.default is False and not meta.get("pair"):
        return click.option(name, f.name, is_flag=True, help=help_text)
    if flag:
        return click.option(
            f"{name}/--no-{name[2:]}",
            f.name,
            default=f.default,
            help=help_text,
            show_default=True,
        )
    if "choices" in meta:
        kind = click.Choice([str(c) for c in meta["choices"]])
    default = f.default.value if isinstance(f.default, enum.Enum) else f.default
    return click.option(
        name,
        f.name,
        type=kind,
        default=default,
        help=help_text,
        show_default=default is not None,
    )


def config_from(config_type, kwargs: dict):
    """The ``config_type`` instance made of the options :func:`options_from` added (removed from
    ``kwargs``)."""
    names = [f.name for f in dataclasses.fields(config_type) if f.metadata.get("cli", True)]
    return config_type(**{name: kwargs.pop(name) for name in names})
