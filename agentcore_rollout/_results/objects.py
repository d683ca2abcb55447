"""Results in S3, the source of truth: whether a request's object exists, and reading one,
refused before it is read into memory when over the size limit, checked (`verify`) off the
event loop when large. A failure S3 may not repeat is `Transient`: the caller tries again."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from .._redact import get_logger
from ..config import EngineConfig
from ..contract import ContractError, RolloutResult
from .verify import checked_object

log = get_logger("agentcore_rollout.buffer")

_CHECK_IN_THREAD_BYTES = 256 * 1024  # larger objects are checked off the event loop
_MISSING = ("NoSuchKey", "404")
_DOWNLOADS = 16  # concurrent GetObjects: over a batch's 10, well within _aws's 64 connections


class Transient(Exception):
    """S3 could not be read right now: try again (the inbox keeps the message that announced
    the object, so it comes back)."""


class ResultObjects:
    """The results bucket of `config`, read at most `_DOWNLOADS` objects at once."""

    def __init__(self, s3: Any, config: EngineConfig) -> None:
        self._s3 = s3
        self._cfg = config
        self._downloads = asyncio.Semaphore(_DOWNLOADS)
        self.downloads = 0

    async def exists(self, key: str) -> bool:
        """Whether an object is at `key` (unchecked). A transient error counts as none."""
        try:
            await self._s3.head_object(Bucket=self._cfg.bucket, Key=key)
        except (ClientError, BotoCoreError, OSError) as e:
            if not isinstance(e, ClientError) or _code(e) not in _MISSING:
                log.warning("lookup of %s failed: %s", key, e)
            return False
        return True

    async def read(
        self, key: str, step: int, request_id: str, sig_key: str
    ) -> RolloutResult | None:
        """The result at `key`, checked as the request's; None if there is none (yet).
        Raises ContractError if it fails a check, Transient if S3 could not be read."""
        body = await self._download(key)
        if body is None:
            return None
        max_bytes = self._cfg.results.max_result_bytes
        check = (key, body, self._cfg.exp_id, step, request_id, sig_key, max_bytes)
        if len(body) > _CHECK_IN_THREAD_BYTES:  # ~10 ms a MB: keep the loop handing off
            return await asyncio.to_thread(checked_object, *check)
        return checked_object(*check)

    async def _download(self, key: str) -> bytes | None:
        async with self._downloads:
            self.downloads += 1
            try:
                resp = await self._s3.get_object(Bucket=self._cfg.bucket, Key=key)
            except ClientError as e:
                if _code(e) in _MISSING:
                    return None
                raise Transient(str(e)) from None
            except (BotoCoreError, OSError) as e:
                raise Transient(str(e)) from None
            size, limit = resp.get("ContentLength") or 0, self._cfg.results.max_result_bytes
            async with resp["Body"] as stream:
                if size > limit:  # refuse before reading it into memory
                    raise ContractError(
                        f"result object is {size} bytes, over the {limit} limit", "too_large"
                    )
                try:
                    return await stream.read()
                except (BotoCoreError, OSError, aiohttp.ClientError) as e:
                    raise Transient(str(e)) from None


def _code(error: ClientError) -> str | None:
    return error.response.get("Error", {}).get("Code")
