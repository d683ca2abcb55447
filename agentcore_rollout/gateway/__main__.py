"""`python -m agentcore_rollout.gateway`: run a Gateway until SIGINT/SIGTERM (flags: `--help`,
docs/gateway.md#running-it-on-its-own).

The admin token comes from the environment, never the command line, which `ps` shows to every
user. Once listening it prints one line, the agents' URL then the admin URL, which a parent (the
local stack, a benchmark) waits for."""

from __future__ import annotations

import argparse
import asyncio
import os

from ..serving.flags import add_flags, from_flags
from ..serving.process import serve_until_signalled
from .backends import Backend, OpenAIBackend, SGLangBackend
from .parsers import FAMILIES, family
from .render import Renderer, load_renderer
from .server import Gateway

TOKEN_ENV = "AGENTCORE_GATEWAY_ADMIN_TOKEN"
UPSTREAM_KEY_ENV = "AGENTCORE_GATEWAY_UPSTREAM_API_KEY"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.gateway")
    parser.add_argument("--backend", choices=("sglang", "openai"), default="sglang")
    parser.add_argument("--backend-url", required=True, help="SGLang worker/router, or .../v1")
    parser.add_argument(
        "--renderer", help="a tokenizer directory or module:attribute (sglang: required)"
    )
    parser.add_argument(
        "--parser",
        help="the model family whose tool calls and reasoning to parse (default: detected "
        f"from the chat template, else hermes): one of {', '.join(sorted(FAMILIES))}",
    )
    parser.add_argument("--upstream-model", help="openai backend: model name sent upstream")
    add_flags(parser, Gateway, exclude={"renderer", "admin_token"})
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV)
    if not token:
        parser.error(f"set {TOKEN_ENV} to the admin token (at least 16 characters)")
    renderer: Renderer | None = None
    if args.parser is not None:
        try:
            family(args.parser)
        except ValueError as exc:
            parser.error(f"--parser: {exc}")
        if not args.renderer:
            parser.error("--parser needs --renderer (the openai backend parses upstream)")
    if args.renderer:
        try:
            renderer = load_renderer(args.renderer, parser=args.parser)
        except ValueError as exc:
            parser.error(f"--renderer: {exc}")
    backend: Backend
    if args.backend == "sglang":  # the gateway refuses it without a renderer
        backend = SGLangBackend(args.backend_url)
    else:
        upstream_key = os.environ.get(UPSTREAM_KEY_ENV)
        backend = OpenAIBackend(args.backend_url, api_key=upstream_key, model=args.upstream_model)
    try:
        gateway = from_flags(Gateway, args, backend=backend, renderer=renderer, admin_token=token)
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(serve_until_signalled(gateway))


if __name__ == "__main__":
    main()
