"""The relay Docker's containers reach the host's loopback services through (`local/relay.py`),
on real sockets: 127.0.0.2 stands for the Docker network's gateway address."""

from __future__ import annotations

import os
import socket

import aiohttp
import pytest
from aiohttp import web

from agentcore_rollout.local.relay import LoopbackRelay

pytestmark = pytest.mark.component


@pytest.fixture
async def upstream() -> int:
    """An HTTP service on the host's loopback that echoes what it is sent."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), headers={"X-Peer": request.remote or ""})

    app = web.Application(client_max_size=2**24)
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


async def test_a_peer_of_the_network_reaches_the_service_byte_for_byte(upstream):
    relay = LoopbackRelay("127.0.0.2", "127.0.0.0/8", [upstream])
    await relay.start()
    body = os.urandom(3 << 20)  # several reads and drains each way
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # kept-alive connections carry on through the relay
                async with http.post(f"http://127.0.0.2:{upstream}/echo", data=body) as resp:
                    assert resp.status == 200
                    assert await resp.read() == body
                    assert resp.headers["X-Peer"] == "127.0.0.1"  # the service sees loopback
    finally:
        await relay.stop()


async def test_a_peer_from_elsewhere_is_closed_unread(upstream):
    relay = LoopbackRelay("127.0.0.2", "10.0.0.0/8", [upstream])
    await relay.start()
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.post(f"http://127.0.0.2:{upstream}/echo", data=b"x") as resp:
                    await resp.read()
    finally:
        await relay.stop()


async def test_two_relays_of_one_port_share_it_and_either_may_stop_first(upstream):
    """Two emulators relaying the same service (SO_REUSEPORT): the one left still serves."""
    first = LoopbackRelay("127.0.0.2", "127.0.0.0/8", [upstream])
    second = LoopbackRelay("127.0.0.2", "127.0.0.0/8", [upstream])
    await first.start()
    await second.start()
    await first.stop()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.2:{upstream}/echo", data=b"x") as resp,
        ):
            assert await resp.read() == b"x"
    finally:
        await second.stop()


async def test_a_port_taken_by_another_program_is_one_clear_error(upstream):
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", upstream))
        taken.listen()
        with pytest.raises(RuntimeError, match=r"cannot relay loopback to 127\.0\.0\.2: .*"):
            await LoopbackRelay("127.0.0.2", "127.0.0.0/8", [upstream]).start()


async def test_a_freebind_relay_listens_before_its_address_exists(upstream):
    """The internal network's relay: Podman puts the bridge's gateway on the host only while a
    container is on it, so the relay binds it beforehand (IP_FREEBIND); a plain one cannot."""
    absent = "203.0.113.254"  # TEST-NET-3, on no interface here
    with pytest.raises(RuntimeError, match=r"cannot relay loopback to 203\.0\.113\.254"):
        await LoopbackRelay(absent, f"{absent}/32", [upstream]).start()
    relay = LoopbackRelay(absent, "10.0.0.0/8", [upstream], freebind=True)
    await relay.start()
    try:
        assert [s.sockets[0].getsockname() for s in relay._servers] == [(absent, upstream)]
    finally:
        await relay.stop()
