"""Writes an agent's one result: checked, secrets scrubbed, signed, conditional put, optional
SQS note.

Whatever result it is given, what reaches S3 is a valid result object. One that cannot go on
the wire (a non-finite number, a lone surrogate, nesting deeper than `MAX_DEPTH`, an object
that does not serialize, more bytes than the engine accepts) is replaced by an `agent_error`
result that says why in one line, so the engine learns at once instead of waiting out the
rollout's deadline for an object that never comes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from ..contract import (
    ContractError,
    DirectNotification,
    ErrorInfo,
    RolloutControl,
    RolloutResult,
    check_json,
    encode_result,
    first_error,
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
        """Put the result, or the `agent_error` result replacing it, once. False if one was
        already there (a late write never overwrites the first); raises if S3 cannot be
        written at all, or if not even the replacement can be encoded."""
        try:
            body = _body(result, control)
        except ContractError as e:
            log.warning(  # the reason only: the message may quote the output's keys
                "result request_id=%s cannot be written (%s); writing agent_error instead",
                control.request_id,
                e.reason,
            )
            body = _body(_rejected(result, str(e)), control)
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


def _body(result: RolloutResult, control: RolloutControl) -> bytes:
    """The signed bytes of `result`, secrets scrubbed; ContractError if it cannot go on the
    wire. Checked first, so nothing after it meets a value it would choke on."""
    check_json(result)
    try:
        body = encode_result(sign_result(_scrub(result, control), control.sig_key))
    except ValidationError as e:  # scrubbing broke a field with a pattern
        raise ContractError(f"scrubbed result: {first_error(e)}") from None
    except (ValueError, TypeError, RecursionError) as e:  # e.g. an object json cannot encode
        first_line = next(iter(str(e).splitlines()), "")
        raise ContractError(f"result cannot be encoded: {type(e).__name__}: {first_line}") from None
    if len(body) > control.max_result_bytes:
        raise ContractError(
            f"result is {len(body)} bytes, over the {control.max_result_bytes} limit", "too_large"
        )
    return body


def _rejected(result: RolloutResult, why: str) -> RolloutResult:
    """The `agent_error` result written instead of one that cannot go on the wire."""
    return result.model_copy(
        update={
            "status": "agent_error",
            "stop_reason": "error",
            "rewards": None,
            "trajectory": None,
            "metrics": {},
            "error": ErrorInfo(type="InvalidOutput", message=why),
        }
    )


def _scrub(result: RolloutResult, control: RolloutControl) -> RolloutResult:
    """Replace the per-request secrets wherever user data echoed them, in keys and values."""
    secrets = [control.sig_key]
    if control.llm is not None and control.llm.api_key not in ("", "EMPTY"):
        secrets.append(control.llm.api_key)
    data = result.model_dump(mode="json")
    clean = _replace(data, secrets)
    return result if clean == data else RolloutResult.model_validate(clean)


def _replace(value: Any, secrets: list[str]) -> Any:
    """`value` with each secret redacted; its depth was bounded by `check_json`."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, _REDACTED)
        return value
    if isinstance(value, dict):
        return {_replace(k, secrets): _replace(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, secrets) for v in value]
    return value
