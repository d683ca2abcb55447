"""Writes an agent's one result: checked, refused if it holds a secret, signed, a conditional put,
an optional SQS note.

What reaches S3 is always a valid result object: one that cannot go on the wire, or that holds
the signing key or the LLM key in any form `_leaked` finds, is replaced by an `agent_error`
result saying why in one line, so the engine learns at once instead of waiting out the deadline."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from ..contract import (
    ContractError,
    ErrorInfo,
    Outcome,
    RolloutControl,
    RolloutResult,
    check_json,
    direct_notification,
    encode_result,
    sign_result,
)

log = logging.getLogger("agentcore_rollout.agent")

_RUN = 16
"""How many consecutive characters of a secret make a leak: honest text shares a run this long
with a random hex key by chance once in 16**16 places, and any piece of the key this long,
or smaller pieces side by side, is caught."""
_NOT_ALNUM = bytes(c for c in range(128) if not chr(c).isalnum())  # ASCII, so bytes: fast


class ResultWriter:
    """One S3 (and SQS) client per agent process; endpoints come from the standard AWS
    environment (`AWS_ENDPOINT_URL_S3`, ...), so the same code runs on AWS and locally."""

    def __init__(self, attempts: int = 5) -> None:
        self._attempts = attempts
        self._clients: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    def _in_this_loop(self) -> None:
        """Clients keep connections alive in the event loop they were made in; made in another
        one (an app served again in a new loop, as tests do), they are left to it."""
        if (loop := asyncio.get_running_loop()) is not self._loop:
            self._loop, self._clients, self._lock = loop, {}, asyncio.Lock()

    async def _client(self, service: str) -> Any:
        self._in_this_loop()
        async with self._lock:
            if service not in self._clients:
                config = AioConfig(retries={"mode": "standard", "max_attempts": self._attempts})
                ctx = get_session().create_client(service, config=config)
                self._clients[service] = await ctx.__aenter__()
            return self._clients[service]

    async def close(self) -> None:
        self._in_this_loop()
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
            why = str(e)
            if _leaked([why], control):  # e.g. a NaN under a key that holds the signing key
                why = f"result cannot be written ({e.reason}); the reason quotes a secret"
            body = _body(_rejected(result, why), control)
        s3 = await self._client("s3")
        try:
            where = {"Bucket": control.result.bucket, "Key": control.result.key}
            await s3.put_object(**where, Body=body, ContentType="application/json", IfNoneMatch="*")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                log.info("result already written request_id=%s", control.request_id)
                return False
            raise
        if control.result.queue_url:
            await self._notify(control, body)
        return True

    async def _notify(self, control: RolloutControl, body: bytes) -> None:
        """Only after the put: the engine may deliver what this message carries at once, and
        S3 must already hold it (a restarted engine reads its results there)."""
        note = direct_notification(control.result, control.exp_id, control.request_id, body)
        try:
            sqs = await self._client("sqs")
            await sqs.send_message(QueueUrl=control.result.queue_url, MessageBody=note)
        except (ClientError, BotoCoreError, OSError) as e:
            # The object is written: the bucket's notification, or the engine's S3 lookup,
            # still brings it.
            log.warning("direct notification failed request_id=%s: %s", control.request_id, e)


def _body(result: RolloutResult, control: RolloutControl) -> bytes:
    """The signed bytes of `result`; ContractError if it cannot go on the wire or holds a
    secret. Checked first, so nothing after it meets a value it would choke on."""
    check_json(result)
    try:
        leaked = _leaked(_strings(result.model_dump(mode="json")), control)
        body = encode_result(sign_result(result, control.sig_key))
    except (ValueError, TypeError, RecursionError) as e:  # e.g. an object json cannot encode
        first_line = next(iter(str(e).splitlines()), "")
        raise ContractError(f"result cannot be encoded: {type(e).__name__}: {first_line}") from None
    if leaked:
        raise ContractError(f"result holds the {leaked} (in any case, split or reversed)", "secret")
    if len(body) > control.max_result_bytes:
        raise ContractError(
            f"result is {len(body)} bytes, over the {control.max_result_bytes} limit", "too_large"
        )
    return body


def _rejected(result: RolloutResult, why: str) -> RolloutResult:
    """The `agent_error` result written instead of one that cannot go on the wire."""
    error = ErrorInfo(type="InvalidOutput", message=why)
    cleared = {"rewards": None, "trajectory": None, "metrics": {}, "error": error}
    return result.model_copy(
        update={"status": Outcome.AGENT_ERROR, "stop_reason": "error", **cleared}
    )


def _leaked(strings: Iterable[str], control: RolloutControl) -> str | None:
    """Which secret `strings` hold, if any: joined in order, case-folded and stripped of ASCII
    punctuation and spaces, they hold `_RUN` consecutive characters of the signing key or the
    LLM key (all of it if shorter), forwards or backwards. Refused rather than redacted: no
    search finds every form (base64, say); the SDK's real guard is never handing the signing
    key to the rollout function."""
    text = _alnum("".join(strings))
    api_key = control.llm.api_key if control.llm else ""
    for name, secret in {"signing key": control.sig_key, "LLM api_key": api_key}.items():
        s = _alnum(secret)
        if len(s) < 8:  # a placeholder such as EMPTY, not a secret
            continue
        n = min(_RUN, len(s))
        for form in (s, s[::-1]):
            # Each run of n holds one of the 8-long blocks at 0, 8, 16...: a cheap first look.
            blocks = (form[i : i + 8] in text for i in range(0, len(form) - 7, 8))
            if any(blocks) and any(form[i : i + n] in text for i in range(len(form) - n + 1)):
                return name
    return None


def _alnum(text: str) -> bytes:
    return text.casefold().encode(errors="surrogatepass").translate(None, _NOT_ALNUM)


def _strings(value: Any) -> Iterator[str]:
    """Every key and string of a dumped result, in order; `check_json` bounded its depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
