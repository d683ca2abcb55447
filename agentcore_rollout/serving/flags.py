"""Command-line flags from a config's own fields, so a server's `__main__` declares none by hand:
each parameter with a default of a dataclass or a class is a `--kebab-name` flag typed from its
annotation. A flag not given stays out of the namespace: the default lives only in the config."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Collection
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def add_flags(
    parser: argparse.ArgumentParser,
    config: Callable[..., Any],
    *,
    exclude: Collection[str] = (),
) -> None:
    """A flag per parameter of `config` with a default, but `exclude`; a dataclass field's
    metadata may give its `help` and another `flag` name."""
    init = config if dataclasses.is_dataclass(config) else config.__init__
    hints = typing.get_type_hints(init)
    meta = {f.name: f.metadata for f in dataclasses.fields(config)} if init is config else {}
    for name, param in inspect.signature(config).parameters.items():
        if param.default is param.empty or name in exclude:
            continue
        info = meta.get(name, {})
        parser.add_argument(
            info.get("flag", f"--{name.replace('_', '-')}"),
            dest=name,
            default=argparse.SUPPRESS,
            help=f"{info.get('help', '')} (default: {param.default})".lstrip(),
            **_kind(hints[name]),
        )


def from_flags(config: Callable[..., T], args: argparse.Namespace, /, **given: Any) -> T:
    """`config(**given)` with the flags given on the command line (`given` wins)."""
    names = inspect.signature(config).parameters
    flags = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()}
    return config(**{k: v for k, v in flags.items() if k in names} | given)


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
