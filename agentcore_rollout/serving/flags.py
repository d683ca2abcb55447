"""Command-line flags from a config's own fields, so a server's `__main__` declares none by hand
and a parent writes them from the same fields (`to_flags`): each field of a pydantic model, or
each parameter with a default of a class, is a `--kebab-name` flag typed from its annotation.
A flag not given stays out of the namespace: the default lives only in the config."""

from __future__ import annotations

import argparse
import inspect
import types
import typing
from collections.abc import Callable, Collection, Iterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo

T = TypeVar("T")


def add_flags(
    parser: argparse.ArgumentParser, config: Callable[..., Any], *, exclude: Collection[str] = ()
) -> None:
    """A flag per field of `config` (a model's field or a parameter with a default), but
    `exclude`; a model's field's description is its help, its `json_schema_extra` may give
    another `flag` name."""
    for name, flag, default, hint, help in _parameters(config):
        if name not in exclude:
            text = f"{help} (default: {default})".lstrip()
            parser.add_argument(
                flag, dest=name, default=argparse.SUPPRESS, help=text, **_kind(hint)
            )


def from_flags(config: Callable[..., T], args: argparse.Namespace, /, **given: Any) -> T:
    """`config(**given)` with the flags given on the command line (`given` wins)."""
    names = inspect.signature(config).parameters
    flags = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()}
    return config(**{k: v for k, v in flags.items() if k in names} | given)


def to_flags(config: BaseModel, fields: type[BaseModel]) -> list[str]:
    """The command line that gives `fields`' fields (a model `config` is an instance of) the
    values `config` holds, as `add_flags` reads it back: None as `off`, a tuple repeated."""
    argv: list[str] = []
    for name, info in fields.model_fields.items():
        flag, value = _flag(name, info), getattr(config, name)
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, tuple):
            argv += [arg for item in value for arg in (flag, str(item))]
        else:
            argv += [flag, "off" if value is None else str(value)]
    return argv


def _parameters(config: Callable[..., Any]) -> Iterator[tuple[str, str, Any, Any, str]]:
    """(name, flag, default, type, help) of each of `config`'s fields that has a default."""
    if isinstance(config, type) and issubclass(config, BaseModel):
        for name, info in config.model_fields.items():
            if not info.is_required():
                default = info.get_default(call_default_factory=True)
                yield name, _flag(name, info), default, info.annotation, info.description or ""
        return
    hints = typing.get_type_hints(config.__init__)
    for name, param in inspect.signature(config).parameters.items():
        if param.default is not param.empty:
            yield name, f"--{name.replace('_', '-')}", param.default, hints[name], ""


def _flag(name: str, info: FieldInfo) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("flag", f"--{name.replace('_', '-')}"))


def _kind(hint: Any) -> dict[str, Any]:
    """argparse's arguments for a flag of type `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        return {"choices": args}
    if origin is tuple:  # tuple[str, ...]: the flag repeats
        return {"action": "append", "type": args[0]}
    if origin is types.UnionType and type(None) in args:  # `off` (or `none`) is None
        (inner,) = (a for a in args if a is not type(None))
        return {"type": lambda text: None if text.lower() in ("none", "off") else inner(text)}
    return {"type": hint}
