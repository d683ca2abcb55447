"""`python -m agentcore_rollout.local.policy`: run a PolicyServer until SIGINT/SIGTERM.

Prints the server's URL on one line once it is listening, so a parent process (the local stack,
a test) can wait for that line instead of polling the port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from ...serving.process import exit_with_parent, serve_until_signalled
from .model import TinyPolicy
from .server import DEFAULT_CONTEXT_LENGTH, MODEL_NAME, PolicyServer


class _NoHttp2Probes(logging.Filter):
    """sglang-router probes each new worker with an HTTP/2 preface (for gRPC); aiohttp logs
    every probe as a bad request. Harmless, and noise in every local run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PRI/Upgrade" not in str(record.exc_info[1] if record.exc_info else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentcore_rollout.local.policy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--params", help=".npz written by TinyPolicy.save (default: from seed)")
    parser.add_argument("--seed", type=int, default=0, help="parameter and sampler seed")
    parser.add_argument("--record", action="store_true", help="keep samples for /debug/samples")
    parser.add_argument("--record-limit", type=int, default=10_000)
    parser.add_argument("--worker-id", help="recorded with each sample (default host:port)")
    parser.add_argument("--model-name", default=MODEL_NAME)
    parser.add_argument("--context-length", type=int, default=DEFAULT_CONTEXT_LENGTH)
    args = parser.parse_args(argv)
    exit_with_parent()
    logging.getLogger("aiohttp.server").addFilter(_NoHttp2Probes())
    policy = TinyPolicy(args.seed)
    if args.params:
        try:
            policy.load(args.params)
        except ValueError as exc:
            parser.error(str(exc))
    server = PolicyServer(
        policy,
        host=args.host,
        port=args.port,
        seed=args.seed,
        record=args.record,
        record_limit=args.record_limit,
        worker_id=args.worker_id,
        model_name=args.model_name,
        context_length=args.context_length,
    )
    asyncio.run(serve_until_signalled(server))


if __name__ == "__main__":
    main()
