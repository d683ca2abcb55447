"""GatewayReplicas: the engine's gateway replicas, each session on one, no proxy in between.

A session's state (its key, its renders, its trace) lives in the process that opened it, so every
turn must land there: rather than a sticky proxy (a hop per turn, one process every turn
crosses), the engine opens each session on a replica it picks and hands the agent that replica's
URL. What a lost replica costs: docs/failures.md#the-gateway-loses-a-trace."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .._redact import get_logger
from ..config import GatewayReplica
from .gateway_admin import GatewayAdmin, GatewayError, GatewaySession, HeldSession

log = get_logger("agentcore_rollout.gateway")


class GatewayReplicas:
    """One `GatewayAdmin` per replica, named by its admin URL (what the journal records)."""

    def __init__(
        self, replicas: list[GatewayReplica], admin_token: str, *, retry_after: float
    ) -> None:
        self._token = admin_token
        self._retry_after = retry_after
        self._replicas = {r.url.rstrip("/"): r for r in replicas}
        self._admins = {url: GatewayAdmin(url, admin_token) for url in self._replicas}
        self._open: dict[str, set[str]] = {url: set() for url in self._replicas}
        self._opening = dict.fromkeys(self._replicas, 0)  # creates in flight count as load
        self._down_until: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"GatewayReplicas({list(self._replicas)!r}, admin_token='***')"

    @property
    def urls(self) -> list[str]:
        return list(self._replicas)

    def agent_url(self, url: str, session: GatewaySession) -> str:
        """What agents of `session`, on replica `url`, call: the replica's `public_url` if the
        config gives one, else the agents' URL the replica answered with."""
        replica = self._replicas.get(url)
        public = replica.public_url if replica is not None else None
        return (public or session.url or url).rstrip("/")

    async def open(self, request_id: str, **settings: Any) -> tuple[str, GatewaySession]:
        """A new session on the least-loaded replica that answers: (its URL, the session).
        A replica that cannot be reached is marked down and the next is tried; when none can
        be, GatewayError says so in one line. An error the gateway answered with is raised."""
        now = time.monotonic()
        order = sorted(
            (url for url in self._replicas if self._down_until.get(url, 0.0) <= now),
            key=lambda url: len(self._open[url]) + self._opening[url],  # ties: the lowest index
        )
        failures: list[str] = []
        for url in order:
            self._opening[url] += 1
            try:
                session = await self._admins[url].create_session(request_id, **settings)
            except GatewayError as e:
                if e.status != 0:
                    raise
                self.mark_down(url, e)
                failures.append(str(e))
                continue
            finally:
                self._opening[url] -= 1
            self._down_until.pop(url, None)
            self._open[url].add(session.session_id)
            return url, session
        down = len(self._replicas) - len(failures)
        raise GatewayError(
            f"no gateway replica answered ({len(failures)} unreachable now, {down} marked down "
            f"within the last {self._retry_after:g}s)" + (f": {failures[-1]}" if failures else "")
        )

    def adopt(self, url: str, session_id: str) -> None:
        """Count a session an earlier engine opened on `url`, now this engine's to close."""
        self._open.setdefault(url, set()).add(session_id)

    async def finish(self, url: str, session_id: str) -> dict[str, Any]:
        """The session's trace. Unreachable: the replica is marked down, GatewayError raised."""
        self._open.get(url, set()).discard(session_id)
        try:
            return await self._admin(url).finish_session(session_id)
        except GatewayError as e:
            if e.status == 0:
                self.mark_down(url, e)
            raise

    async def drop(self, url: str, session_id: str) -> dict[str, int] | None:
        """Close the session without its trace: its tokens so far, None if gone already (a
        replica that restarted holds nothing of it). Unreachable: marked down, raised."""
        self._open.get(url, set()).discard(session_id)
        try:
            return await self._admin(url).drop_session(session_id)
        except GatewayError as e:
            if e.status == 0:
                self.mark_down(url, e)
            raise

    async def session_of(self, request_id: str) -> tuple[str, HeldSession] | None:
        """The live session some replica holds for `request_id`: every replica is asked (a
        session is on one of them); unreachable ones are logged and skipped."""
        urls = list(self._replicas)
        found = await asyncio.gather(
            *(self._admins[url].session_of(request_id) for url in urls), return_exceptions=True
        )
        for url, held in zip(urls, found, strict=True):
            if isinstance(held, GatewayError):
                log.warning("gateway session of request_id=%s: %s", request_id, held)
            elif isinstance(held, BaseException):
                raise held
            elif held is not None:
                return url, held
        return None

    def mark_down(self, url: str, error: GatewayError) -> None:
        """No new session on `url` for `retry_after` seconds."""
        if url in self._replicas and url not in self._down_until:
            log.warning(
                "gateway replica %s is down, retried in %gs: %s", url, self._retry_after, error
            )
        self._down_until[url] = time.monotonic() + self._retry_after

    async def close(self) -> None:
        await asyncio.gather(*(admin.close() for admin in self._admins.values()))

    def _admin(self, url: str) -> GatewayAdmin:
        """The client for `url`; one not configured (a journal of another config) gets one."""
        if url not in self._admins:
            self._admins[url] = GatewayAdmin(url, self._token)
        return self._admins[url]
