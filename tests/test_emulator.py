"""The AgentCore Runtime emulator through the unmodified aiobotocore client: wire protocol,
error types, idle timeout, max lifetime."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

from agentcore_rollout.contract import CONTROL_KEY

from .conftest import RUNTIME_ARN


def _payload(channel, rid: str, sid: str, deadline: float, **user) -> bytes:
    control = {
        "exp_id": "exp1",
        "step": 0,
        "request_id": rid,
        "input_id": "g",
        "sample_index": 0,
        "session_id": sid,
        "result": {"bucket": channel.bucket, "key": f"rollouts/exp1/00000000/{rid}.json"},
        "deadline": deadline,
        "sig_key": "k" * 32,
    }
    return json.dumps({"a": 1, "b": 2, **user, CONTROL_KEY: control}).encode()


@pytest.fixture
async def client(emulator):
    emu = await emulator(idle_timeout=0.5, max_lifetime=2.0)
    cfg = Config(retries={"total_max_attempts": 1})
    async with get_session().create_client(
        "bedrock-agentcore", region_name="us-east-1", endpoint_url=emu.url, config=cfg
    ) as c:
        yield emu, c


async def test_invoke_reply_headers_and_errors(client, channel):
    emu, c = client
    sid = "s" * 40
    resp = await c.invoke_agent_runtime(
        agentRuntimeArn=RUNTIME_ARN,
        runtimeSessionId=sid,
        payload=_payload(channel, "r1", sid, time.time() + 30),
    )
    assert resp["runtimeSessionId"] == sid
    assert json.loads(await resp["response"].read()) == {"status": "accepted", "request_id": "r1"}
    again = await c.invoke_agent_runtime(
        agentRuntimeArn=RUNTIME_ARN,
        runtimeSessionId=sid,
        payload=_payload(channel, "r1", sid, time.time() + 30),
    )
    assert json.loads(await again["response"].read())["duplicate"] is True  # a retried invoke
    with pytest.raises(ClientError) as bad:
        await c.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN, runtimeSessionId="t" * 40, payload=b'{"no": 1}'
        )
    assert bad.value.response["Error"]["Code"] == "RuntimeClientError"
    assert "_rollout" in bad.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as missing:
        await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId="u" * 40)
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    await c.stop_runtime_session(agentRuntimeArn=RUNTIME_ARN, runtimeSessionId=sid)
    assert emu.stopped == [sid]


async def test_idle_timeout_and_max_lifetime_end_sessions(client, channel):
    emu, c = client
    idle, busy = "i" * 40, "b" * 40
    for sid, mode in ((idle, "ok"), (busy, "hang")):
        await c.invoke_agent_runtime(
            agentRuntimeArn=RUNTIME_ARN,
            runtimeSessionId=sid,
            payload=_payload(channel, sid[:8], sid, time.time() + 60, mode=mode),
        )
    await asyncio.sleep(1.2)
    assert emu.expired == [idle]  # the busy one is kept alive past the idle timeout
    await asyncio.sleep(1.5)
    assert emu.expired == [idle, busy]  # but not past its max lifetime
    assert emu.live.value == 0
