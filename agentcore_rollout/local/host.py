"""Serve any app of the AgentCore container contract (`POST /invocations`, `GET /ping`), given as
`module:attr`: `python -m agentcore_rollout.local.host module:app --fd N`.

The emulator binds the socket and passes it (`--fd`), so no port can be taken in between, and the
agent exits with the emulator."""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from typing import Any


class AppLoadError(Exception):
    """`module:attr` cannot be imported or is not an ASGI app."""


def load_asgi_app(spec: str) -> Any:
    """Import `module:attr` (attr defaults to `app`) and check it is callable as ASGI.

    No class is required: the service runs whatever serves the contract, so the emulator does.
    """
    module_name, _, attr = spec.partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attr or "app")
    except (ImportError, AttributeError) as e:
        raise AppLoadError(f"cannot load agent app {spec!r}: {e}") from None
    call = app if inspect.isfunction(app) else getattr(app, "__call__", None)  # noqa: B004
    if call is None or isinstance(app, type) or not inspect.iscoroutinefunction(call):
        raise AppLoadError(f"{spec!r} is a {type(app).__name__}, not an ASGI app")
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from ..serving.process import exit_with_parent

    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.local.host")
    parser.add_argument("app", help="module:attribute of an ASGI app (e.g. a BedrockAgentCoreApp)")
    parser.add_argument("--fd", type=int, help="serve on this bound socket")
    parser.add_argument("--check", action="store_true", help="load the app, serve nothing")
    args = parser.parse_args(argv)
    if args.fd is None and not args.check:
        parser.error("--fd is required")
    exit_with_parent()
    try:
        app = load_asgi_app(args.app)
    except AppLoadError as e:
        raise SystemExit(str(e)) from None
    if args.check:
        return
    uvicorn.run(app, fd=args.fd, log_level="warning", access_log=False)


if __name__ == "__main__":
    sys.exit(main())
