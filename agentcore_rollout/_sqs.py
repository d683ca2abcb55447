"""SQS's three calls on the results path (ReceiveMessage, DeleteMessageBatch,
ChangeMessageVisibilityBatch) as signed requests in SQS's JSON protocol: the same keyword
arguments and answers as aiobotocore's client, so the buffer takes either.

Why: the engine makes about half of one of these calls per rollout, and through botocore's
pipeline each cost 0.9-1.0 ms of its CPU, signed 0.35 (`bench/calls.py`); profiled, they were
the largest share of the engine's CPU in `bench/scale.py`. Retries are botocore's standard mode
in small: transient answers (5xx, throttling) and broken connections are tried again, with
jittered back-off, up to `max_attempts` in all.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from botocore.exceptions import ClientError

from ._limits import backoff_delay

if TYPE_CHECKING:
    from ._aws import SignedClient

_HEADERS = {  # what botocore sends for SQS's JSON protocol (awsQueryCompatible)
    "Content-Type": "application/x-amz-json-1.0",
    "x-amzn-query-mode": "true",
}


class QueueClient:
    """The results queue's data-plane calls over a `SignedClient` for SQS."""

    def __init__(self, client: SignedClient, max_attempts: int = 5) -> None:
        self._client = client
        self._attempts = max_attempts

    async def receive_message(self, **params: Any) -> dict[str, Any]:
        return await self._call("ReceiveMessage", params)

    async def delete_message_batch(self, **params: Any) -> dict[str, Any]:
        return await self._call("DeleteMessageBatch", params)

    async def change_message_visibility_batch(self, **params: Any) -> dict[str, Any]:
        return await self._call("ChangeMessageVisibilityBatch", params)

    async def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(params).encode()
        headers = _HEADERS | {"X-Amz-Target": f"AmazonSQS.{operation}"}
        attempt = 0
        while True:
            last = attempt + 1 >= self._attempts
            try:
                status, reply_headers, reply = await self._client.post(
                    operation, "/", body, headers
                )
            except (aiohttp.ClientError, OSError, TimeoutError):
                if last:
                    raise
            else:
                if status < 300:
                    return json.loads(reply) if reply else {}
                error = _client_error(operation, status, reply_headers, reply)
                if last or not _transient(status, error):
                    raise error
            await asyncio.sleep(backoff_delay(attempt, 0.05, 5.0))
            attempt += 1


def _client_error(
    operation: str, status: int, headers: Mapping[str, str], body: bytes
) -> ClientError:
    """botocore's `ClientError`, read as its JSON parser reads SQS's errors: the code from the
    body's `__type` (else the status), replaced by the query-protocol code that
    `x-amzn-query-error` names; a 5xx that is empty or HTML is the status and its phrase."""
    error = {"Code": str(status), "Message": http.client.responses.get(status, "")}
    generic = status >= 500 and (not body.strip() or body.strip().startswith(b"<html>"))
    if not generic:
        try:
            reply = json.loads(body) if body else {}
        except ValueError:
            reply = {"message": body.decode(errors="replace")}
        if not isinstance(reply, dict):
            reply = {}
        code = str(reply.get("__type") or status).split(":", 1)[0].rsplit("#", 1)[-1]
        error = {"Message": str(reply.get("message", reply.get("Message", ""))), "Code": code}
        query_code, _, kind = headers.get("x-amzn-query-error", "").partition(";")
        if query_code and kind:
            error |= {"QueryErrorCode": code, "Type": kind, "Code": query_code}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


def _transient(status: int, error: ClientError) -> bool:
    return status >= 500 or status == 429 or "Throttl" in error.response["Error"]["Code"]
