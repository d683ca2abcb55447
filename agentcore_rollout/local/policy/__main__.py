"""`python -m agentcore_rollout.local.policy`: run a PolicyServer until SIGINT/SIGTERM, printing
its URL once listening (`serving.process.serve_until_signalled`)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from ...serving.flags import add_flags, from_flags
from ...serving.process import serve_until_signalled
from .server import PolicyServer


class _NoHttp2Probes(logging.Filter):
    """sglang-router probes each new worker with an HTTP/2 preface (for gRPC); aiohttp logs
    every probe as a bad request. Harmless, and noise in every local run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PRI/Upgrade" not in str(record.exc_info[1] if record.exc_info else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.local.policy")
    parser.add_argument("--params", help=".npz written by TinyPolicy.save (default: from seed)")
    add_flags(parser, PolicyServer, exclude={"policy"})
    args = parser.parse_args(argv)
    logging.getLogger("aiohttp.server").addFilter(_NoHttp2Probes())
    server = from_flags(PolicyServer, args)  # its policy from the seed
    if args.params:
        try:
            server.policy.load(args.params)
        except ValueError as exc:
            parser.error(str(exc))
    asyncio.run(serve_until_signalled(server))


if __name__ == "__main__":
    main()
