"""`RolloutEngine.reclaim`: an engine SIGKILLed with sessions written and running, then a new
engine of the same experiment takes its requests over with no journal, as a trainer that
re-issues its prompts after a restart does. Through the real wire (the embedded stack: emulator
sessions, S3 and SQS, the token-capture gateway, a policy worker):

- a result already in S3 is delivered with its trace, its agent not run again;
- a session still running is waited for, and delivered with its trace;
- a request the gateway holds no session for, or one whose session never took a turn (it may
  never have started), is left to run anew, and that untouched gateway session is dropped.

The policy worker records every sample; the held agent samples once a run, so the count of
samples is the count of agent runs across both engines."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agentcore_rollout import EngineConfig, RolloutEngine, RolloutRequest
from agentcore_rollout.gateway import GatewayAdmin
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS
from agentcore_rollout.local.stack import LocalStack

from .factories import flat_config, recorded_samples

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent

FIRST_LIFE = """
import asyncio, json, sys
from agentcore_rollout import EngineConfig, RolloutEngine, RolloutRequest

async def main():
    config = EngineConfig.model_validate_json(open(sys.argv[1]).read())
    requests = [RolloutRequest(**r) for r in json.load(open(sys.argv[2]))]
    async with RolloutEngine(config) as engine:
        handles = [engine.submit(r) for r in requests]
        print("submitted", flush=True)
        await asyncio.gather(*handles)

asyncio.run(main())
"""


async def start_first_life(
    script: str,
    stack: LocalStack,
    config: EngineConfig,
    requests: list[RolloutRequest],
    folder: Path,
) -> asyncio.subprocess.Process:
    """An engine of `config` in its own process (killed by the test) running `script` over
    `requests`, listening on a queue no bucket notifies: its agents' results reach S3 while it
    never learns of them, as a crash between an agent's write and its delivery would."""
    silent = stack.moto.client("sqs").create_queue(QueueName=f"{config.exp_id}-silent")
    (folder / "first.json").write_text(
        config.model_copy(update={"queue_url": silent["QueueUrl"]}).model_dump_json()
    )
    (folder / "requests.json").write_text(json.dumps([vars(r) for r in requests]))
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        str(folder / "first.json"),
        str(folder / "requests.json"),
        cwd=ROOT,
        env={**os.environ, **LOCAL_CREDENTIALS, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def _request(name: str, hold: float) -> RolloutRequest:
    return RolloutRequest(
        {"question": "What is 2 + 5?", "hold": hold}, input_id=name, request_id=f"req-{name}"
    )


async def test_a_new_engine_reclaims_written_and_running_sessions_with_their_traces(tmp_path):
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        record_samples=True,
        bucket="reclaim",
        queue="reclaim",
    )
    written = [_request(f"written-{i}", 0.0) for i in range(2)]
    running = [_request(f"running-{i}", 6.0) for i in range(2)]
    async with LocalStack(local) as stack:
        config = stack.engine_config(
            flat_config(exp_id="reclaim", run_secret="r" * 32, start_rate=50.0, wait_time=1)
        )
        # The kill finds the quick ones written and undelivered, their gateway sessions open.
        first = await start_first_life(FIRST_LIFE, stack, config, written + running, tmp_path)
        s3 = stack.moto.client("s3")
        give_up = time.monotonic() + 60
        # Kill once both quick agents wrote and all four took their turn.
        while _stored(s3, config.bucket) < 2 or len(await recorded_samples(stack)) < 4:
            assert first.returncode is None, (await first.communicate())[1][-2000:]
            assert time.monotonic() < give_up, "the first engine's sessions did not run in time"
            await asyncio.sleep(0.1)
        first.kill()  # SIGKILL: no delivery, no stop, no gateway session finished or dropped
        await first.wait()
        assert _stored(s3, config.bucket) == 2  # the held ones are still running

        async with GatewayAdmin(config.gateway.url, config.gateway.admin_token) as admin:
            untouched = await admin.create_session("req-untouched")  # opened, never used
            async with RolloutEngine(config) as second:
                handles = [await second.reclaim(r, step=0) for r in written + running]
                assert all(h is not None for h in handles)
                assert await second.reclaim(_request("never-seen", 0.0), step=0) is None
                assert await second.reclaim(_request("untouched", 0.0), step=0) is None
                outcomes = await asyncio.gather(*handles)
            assert await admin.session_of("req-untouched") is None  # dropped
            assert await admin.drop_session(untouched.session_id) is None
        sampled = await recorded_samples(stack)

    assert [o.outcome for o in outcomes] == ["ok"] * 4, [o.error for o in outcomes]
    assert [o.reward for o in outcomes] == [0.0] * 4  # the held agent's reward: sample index 0
    assert [o.started_at for o in outcomes] == [None] * 4  # collected or waited for, not run
    # No agent ran twice: four runs in all, one sample each.
    assert len(sampled) == 4
    # Each trace is the earlier session's, exactly what the worker sampled for it.
    traced = Counter()
    for outcome in outcomes:
        assert outcome.trace is not None
        assert outcome.trace["request_id"] == outcome.request.request_id
        [sample] = outcome.trace["samples"]
        mask = sample["loss_mask"]
        ids = [t for t, m in zip(sample["response_ids"], mask, strict=True) if m]
        logprobs = [p for p, m in zip(sample["logprobs"], mask, strict=True) if m]
        traced[(tuple(sample["prompt_ids"]), tuple(ids), tuple(logprobs))] += 1
    assert traced == Counter(
        (tuple(s["input_ids"]), tuple(s["output_ids"]), tuple(s["output_logprobs"]))
        for s in sampled
    )


def _stored(s3, bucket: str) -> int:
    return s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0)


async def test_a_resumed_result_whose_start_was_never_journaled_keeps_its_trace(tmp_path):
    """`run --resume` after a kill with invocations in flight: their `started` lines were
    never written, so `resume` gets no gateway session; it finds it by request id, and the
    result is `ok` with its trace. A result whose session is gone ends `invalid_result`."""
    local = LocalConfig(
        app="tests.agents.held:app",
        mode="in_process",
        policy_workers=1,
        record_samples=True,
        bucket="unjournaled",
        queue="unjournaled",
    )
    requests = [_request(f"unjournaled-{i}", 0.0) for i in range(3)]
    async with LocalStack(local) as stack:
        config = stack.engine_config(
            flat_config(exp_id="unjournaled", run_secret="u" * 32, start_rate=50.0, wait_time=1)
        )
        first = await start_first_life(FIRST_LIFE, stack, config, requests, tmp_path)
        s3 = stack.moto.client("s3")
        give_up = time.monotonic() + 60
        while _stored(s3, config.bucket) < 3:
            assert first.returncode is None, (await first.communicate())[1][-2000:]
            assert time.monotonic() < give_up, "the first engine's agents did not write in time"
            await asyncio.sleep(0.1)
        first.kill()
        await first.wait()
        async with GatewayAdmin(config.gateway.url, config.gateway.admin_token) as admin:
            gone = await admin.session_of(requests[2].request_id)
            assert gone is not None
            await admin.drop_session(gone.session_id)  # as a gateway restarted since would
        async with RolloutEngine(config) as second:
            outcomes = await asyncio.gather(*(second.resume(r, step=0) for r in requests))
        sampled = await recorded_samples(stack)

    assert [o.outcome for o in outcomes] == ["ok", "ok", "invalid_result"], [
        o.error for o in outcomes
    ]
    assert outcomes[2].error == "trace lost: no gateway session holds this request's turns"
    assert len(sampled) == 3  # collected from S3: no agent ran again
    records = Counter((tuple(s["input_ids"]), tuple(s["output_ids"])) for s in sampled)
    for outcome in outcomes[:2]:  # each trace is one of the samples the worker drew
        assert outcome.trace is not None and outcome.gateway_url is not None
        [sample] = outcome.trace["samples"]
        mask = sample["loss_mask"]
        ids = tuple(t for t, m in zip(sample["response_ids"], mask, strict=True) if m)
        assert records[(tuple(sample["prompt_ids"]), ids)] >= 1
