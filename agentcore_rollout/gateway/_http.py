"""What the gateway's routes share, the agents' and the admin's: a refusal the error middleware
answers in the shape of the API called (`GatewayHTTPError`), JSON replies (orjson when
installed), and the bearer token a request presents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from . import _fastjson


class GatewayHTTPError(Exception):
    """A request refused: status, one-line message, OpenAI error code."""

    def __init__(self, status: int, message: str, *, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    body = _fastjson.dumps(data)
    return web.Response(body=body, status=status, headers=headers, content_type="application/json")


def bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None
