"""What keeps one agent from stalling the others, on the real wire (`gateway._limits`): a body
nested past the limit is a 400 before anything is sampled, in every API, streamed or not; a body
over the size limit is a 413; a huge render does not hold up another session's turns nor
/health; a session's second request is queued, and past its bound refused with a 429;
count_tokens counts against that bound; slow headers and slow bodies are cut off; a turn whose
reply never reached the agent is in the trace marked `delivered: false`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend, _limits, server
from agentcore_rollout.gateway._limits import MAX_DEPTH

from .gateway_support import ScriptedWorker, hf_renderer

pytestmark = pytest.mark.component

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
HELLO = [{"role": "user", "content": "Hello"}]


def deep(levels: int) -> str:
    """A placeholder for an object `levels` deep, which `encode` writes out (json.dumps and
    orjson cannot: they stop at about 1,000 and 254 levels)."""
    return f"@@deep{levels}@@"


def encode(body: Any) -> bytes:
    def nested(match: re.Match[str]) -> str:
        levels = int(match.group(1))
        return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)

    return re.sub(r'"@@deep(\d+)@@"', nested, json.dumps(body)).encode()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for `condition`, polling (it is the gateway's own state, read in process)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the condition never held")


def eos() -> list[int]:
    return [hf_renderer().tokenizer.eos_token_id]


class BigWorker(ScriptedWorker):
    """A ScriptedWorker that takes prompts of millions of ids."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 << 20)
        app.add_routes([web.post("/generate", self._generate)])
        return app


class SlowWorker(ScriptedWorker):
    """A ScriptedWorker whose /generate waits for `release` once `called` is set."""

    def __init__(self, scripts: list[list[int]]) -> None:
        super().__init__(scripts)
        self.called, self.release = asyncio.Event(), asyncio.Event()

    async def _generate(self, request: web.Request) -> web.Response:
        self.called.set()
        await self.release.wait()
        return await super()._generate(request)


@asynccontextmanager
async def stack(
    worker: ScriptedWorker | None = None, **options: Any
) -> AsyncIterator[tuple[ScriptedWorker, Gateway, GatewayAdmin, aiohttp.ClientSession]]:
    async with worker or ScriptedWorker([eos() for _ in range(16)]) as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer(), **options)
        async with (
            gateway,  # entered first: the admin client needs its port
            GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
            aiohttp.ClientSession() as http,
        ):
            yield worker, gateway, admin, http


async def post(
    http: aiohttp.ClientSession, url: str, key: str, body: Any
) -> tuple[int, Any, dict[str, str]]:
    data = body if isinstance(body, bytes) else encode(body)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with http.post(url, data=data, headers=headers) as response:
        text = await response.text()
        return response.status, text, dict(response.headers)


def chat(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "policy", "messages": messages, **fields}


DEEP_FIELDS = {  # (API, field path in the message, request)
    "chat metadata": ("chat", "metadata", chat(HELLO, metadata=deep(1000))),
    "chat user": ("chat", "user", chat(HELLO, user=deep(1000))),
    "chat tool parameters": (
        "chat",
        "tools.0.function.parameters",
        chat(
            HELLO, tools=[{"type": "function", "function": {"name": "f", "parameters": deep(999)}}]
        ),
    ),
    "responses metadata": ("responses", "metadata", {"input": "Hi", "metadata": deep(300)}),
    "responses user": ("responses", "user", {"input": "Hi", "user": deep(1000)}),
    "responses tool parameters": (
        "responses",
        "tools.0.parameters",
        {"input": "Hi", "tools": [{"type": "function", "name": "f", "parameters": deep(1000)}]},
    ),
    "messages tool_use input": (
        "messages",
        "messages.1.content.0.input",
        {
            "max_tokens": 8,
            "messages": [
                *HELLO,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": deep(1000)}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            ],
        },
    ),
    "messages input_schema": (
        "messages",
        "tools.0.input_schema",
        {"max_tokens": 8, "messages": HELLO, "tools": [{"name": "f", "input_schema": deep(1000)}]},
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", sorted(DEEP_FIELDS))
async def test_a_field_nested_past_the_limit_is_a_400_before_anything_is_sampled(
    case: str, stream: bool
) -> None:
    api, where, body = DEEP_FIELDS[case]
    async with stack() as (worker, gateway, admin, http):
        session = await admin.create_session("req-deep")
        url = gateway.url + PATHS[api]
        status, text, headers = await post(http, url, session.api_key, {**body, "stream": stream})
        assert status == 400, text
        assert "\n" not in text.strip() and headers["x-should-retry"] == "false"
        message = json.loads(text)["error"]["message"]
        assert message.startswith(where) and f"deeper than {MAX_DEPTH} levels" in message
        ok, _, _ = await post(
            http, url, session.api_key, {**body, **_shallow(api), "stream": stream}
        )
        trace = await admin.finish_session(session.session_id)
    assert ok == 200  # the same request without the deep field is answered
    assert len(worker.calls) == 1 and trace["num_turns"] == 1  # the refused one: nothing


def _shallow(api: str) -> dict[str, Any]:
    """The fields that replace each deep one with a shallow value."""
    if api == "messages":
        return {"messages": HELLO, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}
    return {"metadata": None, "user": None, "tools": None}


async def test_a_lone_surrogate_is_a_400_before_anything_is_sampled() -> None:
    async with stack() as (worker, gateway, admin, http):
        session = await admin.create_session("req-surrogate")
        raw = b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
        status, text, _ = await post(http, gateway.url + PATHS["chat"], session.api_key, raw)
    assert status == 400 and "not valid JSON" in text and worker.calls == []


async def test_a_body_over_the_limit_is_a_413_declared_or_chunked() -> None:
    async with stack(max_body_bytes=64 * 1024) as (worker, gateway, admin, http):
        session = await admin.create_session("req-big")
        big = chat([{"role": "user", "content": "x" * 100_000}])
        url = gateway.url + PATHS["messages"]
        status, text, headers = await post(http, url, session.api_key, {**big, "max_tokens": 8})
        assert status == 413 and headers["x-should-retry"] == "false"
        assert json.loads(text)["error"]["type"] == "request_too_large"
        assert "max_body_bytes" in text

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read until the limit
            for piece in (json.dumps(big)[i : i + 8192] for i in range(0, 110_000, 8192)):
                yield piece.encode()

        headers = {"Authorization": f"Bearer {session.api_key}"}
        async with http.post(gateway.url + PATHS["chat"], data=chunks(), headers=headers) as r:
            assert r.status == 413, await r.text()
    assert worker.calls == []


async def test_a_huge_render_holds_up_neither_other_sessions_nor_health() -> None:
    """One session's 4 MB prompt renders for about a second: meanwhile another session's turns
    and /health are answered, all before the huge turn is."""
    huge = chat([{"role": "user", "content": "the quick brown fox jumps. " * 150_000}])
    worker = BigWorker([eos() for _ in range(6)])
    async with stack(worker, max_body_bytes=16 << 20) as (_, gateway, admin, http):
        heavy = await admin.create_session("req-heavy")
        light = await admin.create_session("req-light")
        url = gateway.url + PATHS["chat"]
        done: list[str] = []

        async def heavy_turn() -> None:
            assert (await post(http, url, heavy.api_key, huge))[0] == 200
            done.append("heavy")

        task = asyncio.create_task(heavy_turn())
        await until(lambda: gateway.sessions.by_key(heavy.api_key).requests > 0)  # type: ignore[union-attr]
        for i in range(5):
            assert (await post(http, url, light.api_key, chat(HELLO)))[0] == 200
            async with http.get(gateway.url + "/health") as response:
                assert response.status == 200
            done.append(f"light{i}")
        await task
    assert done == [*(f"light{i}" for i in range(5)), "heavy"]


async def test_a_second_request_of_a_session_waits_its_turn_and_past_the_bound_is_a_429() -> None:
    worker = SlowWorker([eos(), eos()])
    async with stack(worker, max_session_requests=2) as (_, gateway, admin, http):
        session = await admin.create_session("req-busy")
        url = gateway.url + PATHS["chat"]
        first = asyncio.create_task(post(http, url, session.api_key, chat(HELLO)))
        await worker.called.wait()  # the first turn is sampling; the second is queued behind it
        second = asyncio.create_task(post(http, url, session.api_key, chat(HELLO)))
        live = gateway.sessions.by_key(session.api_key)
        await until(lambda: live.requests == 2)  # type: ignore[union-attr]
        count = gateway.url + "/v1/messages/count_tokens"
        status, text, headers = await post(http, count, session.api_key, {"messages": HELLO})
        assert status == 429 and "2 requests in flight" in text  # count_tokens counts too
        assert headers.get("x-should-retry") != "false" and "\n" not in text.strip()
        worker.release.set()
        assert [(await t)[0] for t in (first, second)] == [200, 200]
        status, text, _ = await post(http, count, session.api_key, {"messages": HELLO})
        assert status == 200 and json.loads(text)["input_tokens"] > 0
        stats = await admin.stats()
        trace = await admin.finish_session(session.session_id)
    assert trace["num_turns"] == 2 and stats["count_tokens"] == 1


@pytest.fixture
def short_reads(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(server, "READ_TIMEOUT", 0.5)
    monkeypatch.setattr(_limits, "READ_TIMEOUT", 0.5)
    return 0.5


async def test_slow_headers_are_cut_off(short_reads: float) -> None:
    """A client that sends a header byte every 50 ms never finishes its request: the
    connection is closed long before it would have (`READ_TIMEOUT`, shortened here)."""
    async with stack() as (_, gateway, _admin, _http):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
        sent = 0
        for byte in request:
            writer.write(bytes([byte]))
            sent += 1
            await asyncio.sleep(0.05)
            if reader.at_eof() or writer.is_closing():
                break
            try:
                if await asyncio.wait_for(reader.read(1), 0.001) == b"":
                    break
            except TimeoutError:
                pass
        writer.close()
    assert sent < len(request)  # cut off midway, not after all of it was sent


async def test_a_slow_body_is_a_408(short_reads: float) -> None:
    async with stack() as (worker, gateway, admin, _http):
        session = await admin.create_session("req-slow-body")
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {session.api_key}\r\nContent-Length: 100\r\n\r\n"
        )
        writer.write(head.encode() + b'{"messages": ')
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
    assert status_line.split()[1] == b"408" and worker.calls == []


async def test_a_reply_the_agent_never_got_is_marked_undelivered() -> None:
    """The agent goes away while its turn is sampled: the turn is in the trace, marked."""
    worker = SlowWorker([eos(), eos()])
    async with stack(worker) as (_, gateway, admin, http):
        session = await admin.create_session("req-gone")
        body = json.dumps(chat(HELLO)).encode()
        _, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {session.api_key}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await worker.called.wait()
        writer.close()
        await writer.wait_closed()
        await asyncio.sleep(0.05)  # the gateway sees the connection go
        worker.release.set()
        live = gateway.sessions.by_key(session.api_key)
        await until(lambda: not live.in_flight and not live.requests)  # type: ignore[union-attr]
        assert (await post(http, gateway.url + PATHS["chat"], session.api_key, chat(HELLO)))[
            0
        ] == 200
        stats = await admin.stats()
        trace = await admin.finish_session(session.session_id)
    assert [t["delivered"] for t in trace["turns"]] == [False, True]
    assert trace["undelivered_turns"] == 1 and stats["undelivered_turns"] == 1
    assert [s["delivered"] for s in trace["samples"]] == [False, True]
