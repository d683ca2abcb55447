"""LocalStack's lifecycle: its blocking work (children starting and stopping, boto3
provisioning) never runs on the event loop, and a start that fails leaves nothing running."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

import agentcore_rollout.local.stack as stack_module
from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.stack import LocalStack
from agentcore_rollout.serving.process import ServiceProcess

from .factories import flat_config

pytestmark = pytest.mark.e2e


def on_the_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_failed_start_stops_every_child_and_never_blocks_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocking: list[str] = []  # blocking calls made on the event loop's thread
    started: dict[str, int] = {}

    def watch(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if on_the_loop():
                blocking.append(name)
            return call(*args, **kwargs)

        return run

    def start(self: ServiceProcess, timeout: float = 60.0) -> str:
        url = real_start(self, timeout)
        assert self.pid is not None
        started[self.name] = self.pid
        return url

    real_start = ServiceProcess.start
    monkeypatch.setattr(ServiceProcess, "start", watch("start", start))
    monkeypatch.setattr(ServiceProcess, "stop", watch("stop", ServiceProcess.stop))
    provision = watch("provision", stack_module.provision_results_channel)
    monkeypatch.setattr(stack_module, "provision_results_channel", provision)
    # Past the app's own check (which would find it first, before anything starts).
    monkeypatch.setattr(LocalStack, "_check_app", lambda self: None)

    # The emulator cannot load this app, while the gateway, started alongside it, can start.
    config = LocalConfig(
        app="tests.no_such_agent:app",
        mode="in_process",
        policy_workers=1,
        bucket="failed",
        queue="failed",
    )
    stack = LocalStack(config)
    with pytest.raises(RuntimeError, match="runtime emulator did not start"):
        async with stack:
            pytest.fail("the stack started")
    assert blocking == []
    assert sorted(started) == ["gateway 0", "moto", "policy worker 0"]
    assert stack.channel is not None  # provisioning, concurrent with the failure, was awaited
    assert [name for name, pid in started.items() if alive(pid)] == []


async def test_an_in_process_agent_that_prints_megabytes_ends_ok(capfd) -> None:
    """Its prints go to the emulator's stdout; read past the URL line, they reach the stack's
    stderr, where they cannot fill a pipe and stall every session (64 KB did, before)."""
    config = LocalConfig(
        app="tests.agents.basic:app",
        mode="in_process",
        gateway=False,
        policy_workers=1,
        bucket="chatty",
        queue="chatty",
    )
    requests = [
        RolloutRequest({"a": i, "b": 1, "mode": "chatty", "lines": 2048}, f"q{i}", 0)
        for i in range(4)
    ]  # 2 MB each
    async with LocalStack(config) as stack:
        engine_config = stack.engine_config(flat_config(rollout_timeout=60.0))
        async with RolloutEngine(engine_config) as engine:
            batch = await engine.rollout(requests)
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 4, [o.error for o in batch]
    assert capfd.readouterr().err.count("x" * 1023) == 4 * 2048


async def test_the_workers_admin_routes_take_the_stacks_token_alone() -> None:
    """An agent may sample, through the gateway, but without the stack's token it cannot load
    weights, abort everything or read every session's samples on a worker."""
    config = LocalConfig(
        app="examples.math_agent.app:app",
        mode="in_process",
        policy_workers=1,
        record_samples=True,
        bucket="lanes",
        queue="lanes",
    )
    async with LocalStack(config) as stack, aiohttp.ClientSession() as http:
        async with RolloutEngine(stack.engine_config(flat_config(rollout_timeout=60.0))) as engine:
            batch = await engine.rollout(
                [RolloutRequest({"question": "What is 2 + 3?", "answer": 5}, "q", 0)]
            )
        worker = stack.workers[0].url
        takeover = {"model_path": "/etc/passwd", "weight_version": "evil"}
        refused = [
            (await http.post(f"{worker}/update_weights_from_disk", json=takeover)).status,
            (await http.post(f"{worker}/abort_request", json={"abort_all": True})).status,
            (await http.get(f"{worker}/debug/samples")).status,
        ]
        async with http.get(f"{worker}/debug/samples", headers=stack.policy_headers) as resp:
            assert resp.status == 200
            samples = (await resp.json())["samples"]
        async with http.get(f"{worker}/params/version") as resp:
            version = (await resp.json())["weight_version"]
    assert batch.outcomes[0].outcome is Outcome.OK, batch.outcomes[0].error
    assert refused == [401, 401, 401] and version == "0" and samples
