"""The hosted gateway as N Ray actors (`custom.agentcore.gateway.replicas`): each replica a real
Gateway in its own Ray worker process, sampling through the server manager veRL hands the agent
loop (here `verl_support.PolicyServerManager`, veRL's `TokenOutput` over a local policy worker),
behind one admin token; started by the engine service, killed when it closes."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

import aiohttp
import openai
import pytest
import ray
from ray.exceptions import RayActorError

from agentcore_rollout.gateway import GatewayAdmin
from agentcore_rollout.integrations.verl import replicas
from agentcore_rollout.integrations.verl.agent_loop import (
    SERVICE_NAME,
    EngineService,
    HostedGateway,
    close_services,
)
from agentcore_rollout.local.policy import PolicyServer
from agentcore_rollout.local.stack import LocalStack

from .factories import recorded_samples
from .test_verl_agent_loop import _agent_loop, _engine_yaml, _held_stack
from .verl_support import PolicyServerManager

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
RENDERER = "agentcore_rollout.local.policy.render:CharRenderer"


def _two_free_ports() -> int:
    """P such that P and P + 1 are free now (outside the ephemeral range other tests draw from)."""
    for _ in range(200):
        port = random.randrange(20_000, 30_000)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


async def _turn(replica, token: str, request_id: str) -> tuple[dict, str]:
    """One agent turn on `replica` through its agents' API (the URL its admin API answers the
    session with); the session's trace, and that URL."""
    async with GatewayAdmin(replica.url, token) as admin:
        session = await admin.create_session(request_id, sampling={"temperature": 1.0})
        client = openai.AsyncOpenAI(
            base_url=f"{session.url}/v1", api_key=session.api_key, max_retries=0
        )
        try:
            await client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "What is 5 + 7?"}],
                max_tokens=6,
            )
        finally:
            await client.close()
        return await admin.finish_session(session.session_id), session.url


async def test_replicas_are_zero_cpu_actors_each_sampling_through_veRLs_server_manager(
    monkeypatch,
):
    """In a Ray cluster with no CPU to give (as when veRL's plan has taken them all), the
    service starts two replicas on ports P and P + 1, named by their public URLs; each answers
    its admin API with the one shared token and samples through veRL's server manager, its trace
    exactly what the worker sampled; after close, the actors are gone."""
    # a replica Ray cannot place fails the test rather than hang it; two actors importing veRL
    # and torch take ~30 s on a quiet 2-core machine, several times that on a loaded one
    monkeypatch.setattr(replicas, "START_TIMEOUT", 240.0)
    port = _two_free_ports()
    public = ("https://gw-0.example.test", "https://gw-1.example.test")
    ray.init(num_cpus=0, include_dashboard=False, log_to_driver=False)
    try:
        async with PolicyServer(record=True) as worker:
            hosted = HostedGateway(
                PolicyServerManager(worker.url, global_steps=3),
                RENDERER,
                port=port,
                public_url=public,
                replicas=2,
            )
            service = EngineService("unused.yaml", hosted)
            config = await service._host(hosted)
            started = service._gateway.actors
            try:
                turns = [
                    await _turn(replica, config.admin_token, f"r{i}")
                    for i, replica in enumerate(config.replicas)
                ]
                traces = [trace for trace, _ in turns]
                stats = [await _stats(r.url, config.admin_token) for r in config.replicas]
                async with aiohttp.ClientSession() as http:
                    wrong = [
                        (await http.get(f"{r.url}/admin/stats", headers=_bearer("x" * 32))).status
                        for r in config.replicas
                    ]
                async with aiohttp.ClientSession() as http:
                    samples = (await (await http.get(f"{worker.url}/debug/samples")).json())[
                        "samples"
                    ]
            finally:
                await service.close()
            assert service._gateway is None
            for actor in started:
                await _wait_dead(actor)
            for replica in config.replicas:
                await _wait_refused(replica.url)
    finally:
        ray.shutdown()
    assert [agents for _, agents in turns] == [  # the agents' listeners; admin ones apart
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{port + 1}",
    ]
    assert all(r.url.startswith("http://127.0.0.1:") for r in config.replicas)
    assert [r.public_url for r in config.replicas] == list(public)
    assert [s["turns"] for s in stats] == [1, 1] and wrong == [401, 401]
    by_output = {tuple(s["output_ids"]): s for s in samples}
    assert len(samples) == 2
    for trace in traces:
        [sample] = trace["samples"]
        worker_sample = by_output[tuple(sample["response_ids"])]
        assert sample["prompt_ids"] == worker_sample["input_ids"]
        assert sample["logprobs"] == worker_sample["output_logprobs"]
        assert sample["weight_versions"] == ["3"]  # one run: every token sampled by version 3


def _bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def _stats(url: str, token: str) -> dict:
    async with GatewayAdmin(url, token) as admin:
        return await admin.stats()


@pytest.mark.parametrize(
    ("replica_count", "port", "public_url", "error"),
    [
        (0, 0, None, "gateway.replicas: an integer >= 1; got 0"),
        (2, 0, "https://gw.example.test", "a list of one per replica for several"),
        (1, 0, ("https://a", "https://b"), "one URL for one replica"),
        (3, 9000, ("https://a", "https://b"), "2 URLs for 3 replicas; give one each"),
        (2, 0, ("https://a", "https://b"), "a list needs a fixed port"),
    ],
)
def test_replica_settings_are_checked_in_one_line(replica_count, port, public_url, error):
    gateway = {"replicas": replica_count, "port": port, "public_url": public_url}
    with pytest.raises(ValueError, match=error) as caught:
        HostedGateway(
            None,
            RENDERER,
            port=port,
            public_url=public_url,
            replicas=gateway["replicas"],
        )
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("actor_rollout_ref.rollout.custom.agentcore.gateway.")


async def test_replicas_outside_Ray_are_refused_in_one_line():
    hosted = HostedGateway(None, RENDERER, replicas=2)
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="gateway replicas are Ray actors: initialize Ray"):
        await EngineService("unused.yaml", hosted)._host(hosted)


async def _wait_dead(actor: object) -> None:
    """Until a call on `actor` fails as on a killed one (`ray.kill` returns before the actor
    dies: a call made at once may still run)."""
    for _ in range(120):  # a minute
        try:
            await actor.stop.remote()  # type: ignore[attr-defined]
        except RayActorError:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{actor} still answers a minute after it was killed")


async def _wait_refused(url: str) -> None:
    """Until nothing listens at `url` (a killed actor's socket closes as its process ends)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):  # a minute: a killed worker process may take a while to end
            try:
                await http.get(f"{url}/admin/stats")
            except aiohttp.ClientConnectionError:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} still answers")


async def test_agent_loops_under_ray_spread_sessions_over_two_gateway_actors(tmp_path, monkeypatch):
    """veRL's agent loops under Ray with `gateway.replicas: 2`: the engine actor starts two
    gateway actors sampling through the loop's server manager; a batch opens sessions on both,
    every row is exactly what the worker sampled, and the actors end with the engine actor."""
    monkeypatch.chdir(ROOT)
    question = {"question": "What is 2 + 5?"}
    async with LocalStack(_held_stack("verl-replicas")) as stack:
        engine_yaml = _engine_yaml(stack, tmp_path, "replicas", warm=None)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            loop = _agent_loop(
                engine_yaml,
                n=2,
                server_manager=PolicyServerManager(stack.workers[0].url, global_steps=1),
                gateway={"renderer": RENDERER, "replicas": 2},
            )
            groups = await asyncio.gather(
                *(
                    loop.run({}, uid=f"g{i}", session_id=k, global_steps=1, extra_info=question)
                    for i in range(3)
                    for k in range(2)
                )
            )
            service = ray.get_actor(SERVICE_NAME)
            config = await service.__ray_call__.remote(lambda s: s._gateway.config)
            stats = [await _stats(r.url, config.admin_token) for r in config.replicas]
            del service
            await close_services()  # the engine actor's last handle: it ends, its replicas too
            for replica in config.replicas:
                await _wait_refused(replica.url)
        finally:
            await close_services()
            ray.shutdown()
        sampled = await recorded_samples(stack)
    assert len(config.replicas) == 2
    assert all(s["turns"] >= 1 for s in stats), stats  # sessions opened on both
    assert sum(s["turns"] for s in stats) == len(sampled) == 6
    by_output = {tuple(s["output_ids"]): s for s in sampled}
    for [row] in groups:
        tokens = [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]
        assert row.response_logprobs == by_output[tuple(tokens)]["output_logprobs"]
        assert row.extra_fields["min_global_steps"] == 1
