"""Writes an agent's one result: signed, secrets scrubbed, conditional put, optional SQS note."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from ..contract import (
    DirectNotification,
    RolloutControl,
    RolloutResult,
    encode_result,
    sign_result,
)

log = logging.getLogger("agentcore_rollout.agent")

_REDACTED = "[redacted]"


class ResultWriter:
    """One S3 (and SQS) client per agent process; endpoints come from the standard AWS
    environment (`AWS_ENDPOINT_URL_S3`, ...), so the same code runs on AWS and locally."""

    def __init__(self, attempts: int = 5) -> None:
        self._attempts = attempts
        self._clients: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def _client(self, service: str) -> Any:
        async with self._lock:
            if service not in self._clients:
                config = AioConfig(retries={"mode": "standard", "max_attempts": self._attempts})
                ctx = get_session().create_client(service, config=config)
                self._clients[service] = await ctx.__aenter__()
            return self._clients[service]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.__aexit__(None, None, None)
        self._clients.clear()

    async def write(self, result: RolloutResult, control: RolloutControl) -> bool:
        """Put the result once. False if one was already there (a late write never
        overwrites the first); raises if S3 cannot be written at all."""
        body = encode_result(sign_result(_scrub(result, control), control.sig_key))
        s3 = await self._client("s3")
        try:
            await s3.put_object(
                Bucket=control.result.bucket,
                Key=control.result.key,
                Body=body,
                ContentType="application/json",
                IfNoneMatch="*",
            )
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                log.info("result already written request_id=%s", control.request_id)
                return False
            raise
        if control.result.queue_url:
            await self._notify(control)
        return True

    async def _notify(self, control: RolloutControl) -> None:
        note = DirectNotification(
            bucket=control.result.bucket,
            key=control.result.key,
            exp_id=control.exp_id,
            request_id=control.request_id,
        )
        try:
            sqs = await self._client("sqs")
            await sqs.send_message(
                QueueUrl=control.result.queue_url, MessageBody=note.model_dump_json()
            )
        except (ClientError, BotoCoreError, OSError) as e:
            # The object is written; the engine's S3 lookup still finds it.
            log.warning("direct notification failed request_id=%s: %s", control.request_id, e)


def _scrub(result: RolloutResult, control: RolloutControl) -> RolloutResult:
    """Replace the per-request secrets wherever user data echoed them."""
    secrets = [control.sig_key]
    if control.llm is not None and control.llm.api_key not in ("", "EMPTY"):
        secrets.append(control.llm.api_key)
    text = json.dumps(result.model_dump(mode="json"))
    if not any(s in text for s in secrets):
        return result
    for s in secrets:
        text = text.replace(s, _REDACTED)
    return RolloutResult.model_validate(json.loads(text))
