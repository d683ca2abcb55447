"""`python -m agentcore_rollout.local.policy`: run a PolicyServer until SIGINT/SIGTERM, printing its
URL once listening: the toy, or with `--model DIR` a Hugging Face causal LM (torch imported only
then). The admin token comes from the environment (`TOKEN_ENV`), never the command line, which
`ps` shows to every user and every agent process on the host."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from ...serving.flags import add_flags, from_flags
from ...serving.process import serve_until_signalled
from .server import TOKEN_ENV, PolicyServer


def _no_http2_probes(record: logging.LogRecord) -> bool:
    """sglang-router probes each new worker with an HTTP/2 preface (for gRPC); aiohttp logs
    every probe as a bad request. Harmless, and noise in every local run."""
    return "PRI/Upgrade" not in str(record.exc_info[1] if record.exc_info else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.local.policy")
    parser.add_argument("--params", help=".npz written by TinyPolicy.save (default: from seed)")
    parser.add_argument("--model", help="a Hugging Face model directory to serve (not the toy)")
    parser.add_argument("--threads", type=int, help="--model: torch threads (default: torch's)")
    add_flags(parser, PolicyServer, exclude={"policy", "admin_token"})
    args = parser.parse_args(argv)
    if args.model and args.params:
        parser.error("--params is the toy's; a model's weights are its directory (--model)")
    if args.threads is not None and not args.model:
        parser.error("--threads needs --model (the toy is numpy, single-threaded)")
    logging.getLogger("aiohttp.server").addFilter(_no_http2_probes)
    policy = None
    if args.model:
        from .hf import HFPolicy  # torch and transformers: only for a real model

        try:
            policy = HFPolicy(args.model, threads=args.threads)
        except (ValueError, OSError) as exc:
            parser.error(f"--model: {exc}")
    token = os.environ.get(TOKEN_ENV) or None  # None: admin routes open, as SGLang's default
    server = from_flags(PolicyServer, args, policy=policy, admin_token=token)  # policy None: toy
    if args.params:
        try:
            server.policy.load(args.params)
        except ValueError as exc:
            parser.error(str(exc))
    asyncio.run(serve_until_signalled(server))


if __name__ == "__main__":
    main()
