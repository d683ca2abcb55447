"""A recording server on loopback that stands in for an AWS endpoint, and the service's check
of a SigV4 signature, for the tests of the engine's signed calls."""

from __future__ import annotations

import hmac
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict

from agentcore_rollout.config import EngineConfig
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS

from .conftest import REGION, RUNTIME_ARN
from .factories import flat_config

AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})"
)


@dataclass
class Received:
    method: str
    raw_path: str
    headers: CIMultiDict[str]  # as received: any case
    body: bytes


Reply = Callable[[Received], web.Response]
CLOSED = "http://127.0.0.1:9"  # nothing listens: for the endpoints a test does not call


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
        endpoints={"s3": CLOSED, "sqs": sqs, "agentcore": agentcore},
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


def signature_holds(
    req: Received, secret: str = LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
) -> bool:
    """Recompute the signature from the request as it arrived, as the service does, with
    botocore's signer."""
    m = AUTH.fullmatch(req.headers["Authorization"])
    assert m is not None, req.headers["Authorization"]
    headers = {name: req.headers[name] for name in m["signed"].split(";")}
    request = AWSRequest(
        req.method, f"http://{req.headers['Host']}{req.raw_path}", data=req.body, headers=headers
    )
    request.context["timestamp"] = req.headers["X-Amz-Date"]
    token = LOCAL_CREDENTIALS["AWS_SESSION_TOKEN"]
    signer = SigV4Auth(Credentials(m["key"], secret, token), m["service"], m["region"])
    expected = signer.signature(
        signer.string_to_sign(request, signer.canonical_request(request)), request
    )
    return hmac.compare_digest(expected, m["signature"])
