"""A recording server on loopback that stands in for an AWS endpoint, for the tests of the
engine's AWS calls at the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from agentcore_rollout.config import EngineConfig

from .conftest import REGION, RUNTIME_ARN
from .factories import flat_config


@dataclass
class Received:
    method: str
    raw_path: str
    headers: CIMultiDict[str]  # as received: any case
    body: bytes


Reply = Callable[[Received], web.Response]
CLOSED = "http://127.0.0.1:9"  # nothing listens: for the services a test does not call


def engine_at(
    *, agentcore: str = CLOSED, sqs: str = CLOSED, queue_url: str = f"{CLOSED}/q"
) -> EngineConfig:
    """An engine's config whose AgentCore and SQS calls go to these URLs."""
    return flat_config(
        exp_id="exp1",
        region=REGION,
        bucket="results",
        queue_url=queue_url,
        runtime_arn=RUNTIME_ARN,
        service_urls={"s3": CLOSED, "sqs": sqs, "agentcore": agentcore},
    )


@asynccontextmanager
async def recording_server(
    default: Reply,
) -> AsyncIterator[tuple[str, list[Received], list[Reply]]]:
    """(url, what it received, the replies to give: `default` when none is queued)."""
    received: list[Received] = []
    replies: list[Reply] = []

    async def handle(request: web.Request) -> web.Response:
        got = Received(
            request.method, request.raw_path, request.headers.copy(), await request.read()
        )
        received.append(got)
        return (replies.pop(0) if replies else default)(got)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", received, replies
    finally:
        await runner.cleanup()
