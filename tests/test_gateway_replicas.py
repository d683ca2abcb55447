"""Gateway replicas (`local.gateway_replicas`, `engine.gateway.replicas`), through the real wire:
the embedded stack's emulator sessions, S3 and SQS, two gateway processes sharing one admin
token in front of one policy worker.

- the engine spreads a batch's sessions over both replicas, and every turn of a session lands on
  the replica it was opened on (each replica rendered exactly the turns of the traces it gave);
- a session's key means nothing to the other replica: a wrong hop would fail, not be proxied;
- a replica killed mid-run ends its running sessions `invalid_result` (their traces are lost,
  never `ok` without tokens), later sessions go to the survivor and end `ok`, and with every
  replica down a request ends `submit_failed` in one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentcore_rollout import RolloutEngine, RolloutRequest, RolloutStart
from agentcore_rollout._engine.gateway_replicas import GatewayReplicas
from agentcore_rollout.cli.config import load_config
from agentcore_rollout.cli.errors import UsageError
from agentcore_rollout.cli.journal import JOURNAL, Journal, Lines, left_open
from agentcore_rollout.config import GatewayConfig, GatewayReplica
from agentcore_rollout.gateway import Gateway, GatewayAdmin, GatewayError, SGLangBackend
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.policy import CharRenderer
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config
from .test_reclaim import start_first_life

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent

# An engine that journals each start on stdout (as `run` does in journal.jsonl), then is killed.
FIRST_LIFE = """
import asyncio, json, sys
from agentcore_rollout import EngineConfig, RolloutEngine, RolloutRequest

def journal(start):
    fields = {k: v for k, v in vars(start).items() if k not in ("request", "step")}
    print(json.dumps({"request_id": start.request.request_id, **fields}), flush=True)

async def main():
    config = EngineConfig.model_validate_json(open(sys.argv[1]).read())
    requests = [RolloutRequest(**r) for r in json.load(open(sys.argv[2]))]
    async with RolloutEngine(config) as engine:
        await asyncio.gather(*(engine.submit(r, on_start=journal) for r in requests))

asyncio.run(main())
"""


def _without_id(line: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k != "request_id"}


def _local(name: str, **fields: object) -> LocalConfig:
    return LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        gateway_replicas=2,
        bucket=name,
        queue=name,
        **fields,
    )


def _request(name: str, hold: float = 0.0) -> RolloutRequest:
    return RolloutRequest(
        {"question": "What is 2 + 5?", "hold": hold}, input_id=name, request_id=f"req-{name}"
    )


async def _stats(url: str, token: str) -> dict[str, int]:
    async with GatewayAdmin(url, token) as admin:
        stats = await admin.stats()
    return {"sessions": stats["sessions"], "turns": stats["turns"]}


async def test_sessions_spread_over_replicas_and_every_turn_lands_on_its_own() -> None:
    async with LocalStack(_local("replicas-spread")) as stack:
        config = stack.engine_config(flat_config(start_rate=50.0, wait_time=1))
        assert config.gateway is not None and config.gateway.url is None
        urls = [replica.url for replica in config.gateway.replicas]
        token = config.gateway.admin_token
        assert len(set(urls)) == 2
        async with RolloutEngine(config) as engine:
            batch = await engine.rollout([_request(f"spread-{i}", hold=0.5) for i in range(8)])
        rendered = {url: (await _stats(url, token))["turns"] for url in urls}

        # A session's key is its replica's: the other one refuses it (no proxy hop behind it).
        async with GatewayAdmin(urls[0], token) as first, aiohttp.ClientSession() as http:
            session = await first.create_session("req-wrong-hop")
            body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": f"Bearer {session.api_key}"}
            async with http.post(
                f"{stack.gateways[1].url}/v1/chat/completions", json=body, headers=headers
            ) as wrong:
                assert wrong.status == 401
            async with http.post(
                f"{stack.gateways[0].url}/v1/chat/completions", json=body, headers=headers
            ) as right:
                assert right.status == 200

    outcomes = batch.outcomes
    assert [o.outcome for o in outcomes] == ["ok"] * 8, [o.error for o in outcomes]
    per_replica = Counter(o.gateway_url for o in outcomes)
    assert set(per_replica) == set(urls) and min(per_replica.values()) >= 2, per_replica
    traced: Counter[str] = Counter()
    for outcome in outcomes:
        assert outcome.trace is not None and outcome.trace["num_turns"] == 1
        assert outcome.trace["session_id"] == outcome.gateway_session_id
        traced[outcome.gateway_url or ""] += outcome.trace["num_turns"]
    assert rendered == dict(traced)  # each replica rendered exactly its sessions' turns


async def test_a_dead_replica_loses_its_sessions_and_the_survivor_takes_the_rest() -> None:
    # Sessions take a second to start and hold two after their turn, so the kill below lands
    # while every session of the first wave is open and none has delivered yet.
    async with LocalStack(_local("replicas-kill", cold_start=1.0)) as stack:
        config = stack.engine_config(flat_config(start_rate=50.0, wait_time=1, backoff_max=60.0))
        assert config.gateway is not None
        urls = [replica.url for replica in config.gateway.replicas]
        token = config.gateway.admin_token
        async with RolloutEngine(config) as engine:
            first = [engine.submit(_request(f"first-{i}", hold=2.0)) for i in range(6)]
            give_up = time.monotonic() + 60
            while sum([(await _stats(url, token))["sessions"] for url in urls]) < 6:
                assert time.monotonic() < give_up, "the first wave's sessions did not open"
                await asyncio.sleep(0.05)
            dead, survivor = stack.gateways[1], urls[0]
            assert dead.pid is not None
            os.kill(dead.pid, signal.SIGKILL)
            first_outcomes = await asyncio.gather(*first)
            later = (await engine.rollout([_request(f"later-{i}") for i in range(4)])).outcomes

            os.kill(stack.gateways[0].pid or 0, signal.SIGKILL)
            [none_left] = (await engine.rollout([_request("none-left")])).outcomes

    lost = [o for o in first_outcomes if o.gateway_url == dead.urls[1]]
    kept = [o for o in first_outcomes if o.gateway_url == survivor]
    assert len(lost) == 3 and len(kept) == 3  # least loaded first: one each in turn
    assert [o.outcome for o in lost] == ["invalid_result"] * 3
    for outcome in lost:
        assert outcome.trace is None and outcome.result is None
        assert f"gateway replica {dead.urls[1]} lost its trace" in (outcome.error or "")
        assert outcome.to_dict()["gateway_url"] == dead.urls[1]  # rollouts.jsonl names it
    assert [o.outcome for o in kept] == ["ok"] * 3, [o.error for o in kept]
    assert all(o.trace is not None and o.trace["num_turns"] == 1 for o in kept)
    assert [(o.outcome, o.gateway_url) for o in later] == [("ok", survivor)] * 4, [
        o.error for o in later
    ]
    assert none_left.outcome == "submit_failed"
    assert (none_left.error or "").startswith("gateway: no gateway replica answered")
    assert "\n" not in (none_left.error or "")


async def test_a_resumed_request_is_finished_on_the_replica_its_start_journaled(tmp_path) -> None:
    """An engine SIGKILLed with sessions on both replicas, written and running; a new engine
    resumes each from its journaled start and collects each trace from its own replica."""
    requests = [_request(f"resume-{i}", hold=0.0 if i < 2 else 4.0) for i in range(4)]
    async with LocalStack(_local("replicas-resume")) as stack:
        config = stack.engine_config(
            flat_config(exp_id="replicas", run_secret="r" * 32, start_rate=50.0, wait_time=1)
        )
        # The first engine never delivers anything: it listens on a queue no bucket notifies.
        first = await start_first_life(FIRST_LIFE, stack, config, requests, tmp_path)
        assert first.stdout is not None
        async with asyncio.timeout(60):
            started = [json.loads(await first.stdout.readline()) for _ in requests]
            s3 = stack.moto.client("s3")
            while s3.list_objects_v2(Bucket=config.bucket).get("KeyCount", 0) < 2:
                assert first.returncode is None, "the first engine died"
                await asyncio.sleep(0.1)  # the quick two wrote; the held two are running
        first.kill()
        await first.wait()

        journaled = {line["request_id"]: line for line in started}
        async with RolloutEngine(config) as second:
            outcomes = await asyncio.gather(
                *(
                    second.resume(RolloutStart(r, 0, **_without_id(journaled[r.request_id])))
                    for r in requests
                )
            )

    urls = [replica.url for replica in config.gateway.replicas]
    assert Counter(line["gateway_url"] for line in started) == Counter(urls * 2)
    assert [o.outcome for o in outcomes] == ["ok"] * 4, [o.error for o in outcomes]
    for outcome in outcomes:
        start = journaled[outcome.request.request_id]
        # collected, or waited for from its journaled start: not run again
        assert outcome.started_at in (None, start["started_at"])
        assert outcome.gateway_url == start["gateway_url"]
        assert outcome.trace is not None and outcome.trace["num_turns"] == 1
        assert outcome.trace["session_id"] == start["gateway_session_id"]


async def test_a_replica_that_is_down_is_skipped_then_probed_again_after_retry_after() -> None:
    token = "t" * 24
    backend = SGLangBackend("http://127.0.0.1:9")  # never called: no turn is taken here

    def gateway(port: int = 0) -> Gateway:
        return Gateway(backend, CharRenderer(), admin_token=token, admin_port=port)

    async with gateway() as gone:
        down, port = gone.admin_url, gone.admin.port  # the engine calls admin listeners
    async with gateway() as up:  # `down`'s port now has nothing listening
        replicas = GatewayReplicas(
            [GatewayReplica(url=down), GatewayReplica(url=up.admin_url)], token, retry_after=0.5
        )
        # Both empty: the lowest index is tried first, refuses, is marked down; `up` takes it.
        assert (await replicas.open("req-1"))[0] == up.admin_url
        async with gateway(port) as back:  # the replica restarts where it was
            # Marked down: skipped without a try, though it answers and holds fewer sessions.
            assert (await replicas.open("req-2"))[0] == up.admin_url
            await asyncio.sleep(0.6)  # its retry_after passed: the next open probes it
            opened = [(await replicas.open(f"req-{i}"))[0] for i in range(3, 7)]
            assert opened == [down] * 3 + [up.admin_url]  # least loaded first; a tie: lowest index
            assert (back.stats()["sessions"], up.stats()["sessions"]) == (3, 3)
            found = await replicas.session_of("req-4")  # every replica asked
            assert found is not None and found[0] == down
            assert (await replicas.finish(down, found[1].session_id))["request_id"] == "req-4"
            assert back.stats()["sessions"] == 2
        # Down for good: a finish there fails and marks it down, its 2 sessions still counted.
        with pytest.raises(GatewayError) as lost:
            await replicas.finish(down, "any-session")
        assert lost.value.status == 0
        async with gateway(port):  # back at once: skipped until its retry_after passes
            assert (await replicas.open("req-7"))[0] == up.admin_url  # 2 there, 4 here
            await asyncio.sleep(0.6)
            opened = [(await replicas.open(f"req-{i}"))[0] for i in range(8, 12)]
            assert opened == [down] * 3 + [up.admin_url]  # from 2 to 5 against 4: it kept its count
    # Every replica down: one line.
    with pytest.raises(GatewayError, match=r"^no gateway replica answered"):
        await replicas.open("req-none")
    await replicas.close()


def test_replicas_from_the_environment_are_admin_urls_separated_by_commas(tmp_path) -> None:
    environ = {
        "AGENTCORE_ROLLOUT_GATEWAY__REPLICAS": "http://127.0.0.1:8001, http://127.0.0.1:8002",
        "AGENTCORE_ROLLOUT_GATEWAY__ADMIN_TOKEN": "t" * 16,
    }
    gateway = load_config(None, env_file=None, environ=environ).engine.gateway
    assert gateway is not None
    assert [(r.url, r.public_url) for r in gateway.all_replicas] == [
        ("http://127.0.0.1:8001", None),  # agents: the URL each session's answer gives
        ("http://127.0.0.1:8002", None),
    ]
    with pytest.raises(ValueError, match="set url \\(one gateway\\) or replicas, not both"):
        GatewayConfig(url="http://a", replicas="http://b", admin_token="t" * 16)


def test_the_journal_keeps_each_session_s_replica_for_resume(tmp_path) -> None:
    lines = Lines(tmp_path / JOURNAL, lambda path, error: pytest.fail(str(error)))
    journal = Journal(lines)
    requests = [_request("on-b"), _request("never-started"), _request("unnamed")]
    journal.submitted(requests, step=0)
    start = RolloutStart(requests[0], 0, "s" * 33, 1.0, 2.0, "gs-1", "http://b:2", "arn#DEFAULT")
    journal.started(start)
    assert [j.start for j in left_open(tmp_path).jobs] == [start, None, None]
    lines.write(  # a `started` line that does not name its replica: refused in one line
        {
            "kind": "started",
            "request_id": "req-unnamed",
            "session_id": "u" * 33,
            "deadline": 2.0,
            "started_at": 1.0,
            "gateway_session_id": "gs-2",
            "endpoint": "arn#DEFAULT",
        }
    )
    lines.close()
    with pytest.raises(UsageError) as refused:
        left_open(tmp_path)
    assert str(refused.value) == (
        f"--resume {tmp_path}: {JOURNAL}:5: not a journal line (no 'gateway_url')"
    )
