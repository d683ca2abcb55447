"""sglang-router 0.3.2 as a managed subprocess: loopback only, workers come and go, clear errors,
no orphan processes."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import aiohttp
import pytest

import agentcore_rollout.gateway.router as router_module
from agentcore_rollout.gateway import RouterError, SGLangRouter
from agentcore_rollout.gateway.router import free_ports
from agentcore_rollout.local.policy import PolicyServer

pytestmark = pytest.mark.component


def listening(pid: int) -> dict[int, str]:
    """{port: local address} of the TCP sockets process `pid` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address, port = local.split(":")
                found[int(port, 16)] = address
    return found


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def generate(url: str) -> dict:
    body = {
        "input_ids": [2, 10, 4],
        "sampling_params": {"max_new_tokens": 2},
        "return_logprob": True,
    }
    async with aiohttp.ClientSession() as http, http.post(f"{url}/generate", json=body) as r:
        assert r.status == 200
        return await r.json()


async def test_router_binds_loopback_manages_workers_and_leaves_no_process() -> None:
    async with (
        PolicyServer(seed=0, record=True, worker_id="a") as a,
        PolicyServer(seed=1, record=True, worker_id="b") as b,
    ):
        router = SGLangRouter([a.url])
        await router.start()
        pid = router.pid
        assert pid is not None
        try:
            ports = listening(pid)
            assert ports[router.port] == "0100007F"  # 127.0.0.1
            assert ports[router.prometheus_port] == "0100007F"
            assert set(ports.values()) == {"0100007F"}, ports
            await router.add_worker(b.url)
            assert sorted(w["url"] for w in await router.workers()) == sorted([a.url, b.url])
            for _ in range(4):
                assert len((await generate(router.url))["meta_info"]["output_token_logprobs"]) > 0
            await router.remove_worker(a.url)
            assert [w["url"] for w in await router.workers()] == [b.url]
            with pytest.raises(RouterError, match="not registered"):
                await router.remove_worker(a.url)
            dead = f"http://127.0.0.1:{free_ports(1)[0]}"
            with pytest.raises(RouterError, match=f"worker {dead} not healthy"):
                await router.add_worker(dead, timeout=0.5)
        finally:
            await router.stop()
        assert gone(pid)
        await router.stop()  # idempotent


async def test_a_router_that_cannot_start_raises_with_its_log() -> None:
    router = SGLangRouter(extra_args=["--policy", "no-such-policy"], startup_timeout=20)
    with pytest.raises(RouterError, match="exited with code"):
        await router.start()
    assert router.pid is None


async def test_a_router_that_never_gets_healthy_times_out_and_is_killed() -> None:
    router = SGLangRouter(startup_timeout=0.0)
    with pytest.raises(RouterError, match="not healthy"):
        await router.start()
    assert router.pid is None


async def test_stop_kills_a_router_that_ignores_sigterm(tmp_path: Path) -> None:
    router = SGLangRouter(stop_timeout=0.2, log_path=tmp_path / "router.log")
    await router.start()
    pid = router.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    await router.stop()
    assert gone(pid)
    assert (tmp_path / "router.log").exists()  # a caller's log file is kept


@pytest.mark.e2e  # waits out real bounds: make test, not make check
async def test_a_chosen_port_taken_before_the_router_binds_it_is_replaced(monkeypatch) -> None:
    """The router cannot bind port 0, so its ports are picked first; another process can take
    one in between (seen in CI: 'Address already in use'). The router starts on others."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real, picks = router_module.free_ports, []

    def first_taken(n: int) -> list[int]:
        ports = real(n)
        picks.append(ports)
        return [taken.getsockname()[1], *ports[1:]] if len(picks) == 1 else ports

    monkeypatch.setattr(router_module, "free_ports", first_taken)
    try:
        async with PolicyServer(seed=0) as worker, SGLangRouter([worker.url]) as router:
            assert len(picks) == 2 and router.port == picks[1][0]
            assert (await generate(router.url))["meta_info"]
    finally:
        taken.close()
