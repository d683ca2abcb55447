"""Serve a RolloutApp: `python -m agentcore_rollout.agent.serve module:app [--port 8080]`.

In a container, pass `--host 0.0.0.0` (AgentCore connects on port 8080). A parent that binds
the socket itself passes it with `--fd`, so no port can be taken in between.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import uvicorn

from .app import RolloutApp


def load_app(spec: str) -> RolloutApp:
    """Import `module:attr` and check it is a RolloutApp."""
    module_name, _, attr = spec.partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attr or "app")
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"cannot load agent app {spec!r}: {e}") from None
    if not isinstance(app, RolloutApp):
        raise SystemExit(f"{spec!r} is a {type(app).__name__}, not a RolloutApp")
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.agent.serve")
    parser.add_argument("app", help="module:attribute of a RolloutApp")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--fd", type=int, default=None, help="serve on this bound socket")
    args = parser.parse_args(argv)
    if args.fd is not None:  # given a socket by its parent: do not outlive it
        from ..serving.process import exit_with_parent

        exit_with_parent()
    app = load_app(args.app)
    bind = {"fd": args.fd} if args.fd is not None else {"host": args.host, "port": args.port}
    uvicorn.run(app, log_level="warning", access_log=False, **bind)


if __name__ == "__main__":
    sys.exit(main())
