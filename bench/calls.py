"""The engine's calls per rollout, alone: its CPU per InvokeAgentRuntime, StopRuntimeSession,
SQS ReceiveMessage (ten messages) and DeleteMessageBatch (ten entries), through botocore's
clients (aiobotocore) and through the engine's own (`SignedClient`, `QueueClient`: botocore's
credentials, the engine's SigV4 signer, aiohttp).

Why: these are the calls every rollout makes (two AgentCore calls, and about a third of a
receive and a fifth of a delete: `bench/scale.py`'s `api_calls_per_rollout`), and
`bench/scale.py` sees them only among everything else. A server on loopback answers each at
once, as the service's wire does, keeping connections alive as AWS does, in its own process,
so only the client's CPU is measured: this process's user + system time over `--calls` calls
of each kind, 32 in flight.

Prints JSON; writes bench/results/calls.json and calls.png.

    python bench/calls.py [--calls 3000] [--rounds 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiobotocore.config import AioConfig  # noqa: E402
from aiobotocore.session import get_session  # noqa: E402

from agentcore_rollout._agentcore import SESSION_HEADER, AgentCoreRuntime  # noqa: E402
from agentcore_rollout._aws import AwsClients  # noqa: E402
from agentcore_rollout.config import EngineConfig  # noqa: E402
from agentcore_rollout.local.moto import LOCAL_CREDENTIALS  # noqa: E402

ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/bench_agent-abc123"
PAYLOAD = json.dumps({"prompt": "x" * 400, "_rollout": {"control": "y" * 600}}).encode()
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/results"
RECEIPT = "AQEB" + "r" * 300  # SQS's receipt handles are a few hundred characters
IN_FLIGHT = 32
PER_ROLLOUT = {"invoke": 1.0, "stop": 1.0, "receive": 0.33, "delete": 0.2}  # bench/scale.py

_SERVER = f"""
import asyncio, json
from aiohttp import web
MESSAGE = {{
    "MessageId": "9a1b", "ReceiptHandle": {RECEIPT!r}, "MD5OfBody": "0" * 32,
    "Body": json.dumps({{"kind": "rollout_result", "bucket": "b", "key": "k" * 60,
                        "result": {{"rewards": 1.0, "trajectory": "t" * 900}}}}),
    "Attributes": {{"ApproximateReceiveCount": "1"}},
}}
async def agentcore(request):
    await request.read()
    reply = {{"status": "accepted"}} if request.path.endswith("/invocations") else {{}}
    sid = request.headers.get("{SESSION_HEADER}", "")
    return web.json_response(reply, headers={{"{SESSION_HEADER}": sid}})
async def sqs(request):
    body = await request.json()
    if request.headers["X-Amz-Target"].endswith("ReceiveMessage"):
        return web.json_response({{"Messages": [MESSAGE] * 10}})
    return web.json_response({{"Successful": [{{"Id": e["Id"]}} for e in body["Entries"]]}})
app = web.Application()
app.router.add_post("/runtimes/{{arn}}/{{op}}", agentcore)
app.router.add_post("/", sqs)
runner = web.AppRunner(app, access_log=None)
async def main():
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _cpu_ms_per_call(call: Callable[[str], Awaitable[object]], calls: int) -> float:
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with slots:
            await call(f"bench-session-{i:030d}")

    await asyncio.gather(*(one(i) for i in range(200)))  # warm: connections, caches
    began = os.times()
    await asyncio.gather(*(one(i) for i in range(calls)))
    ended = os.times()
    return (ended.user - began.user + ended.system - began.system) * 1000 / calls


async def measure(url: str, calls: int) -> dict[str, float]:
    cfg = EngineConfig.model_validate(
        {
            "runtime_arn": ARN,
            "region": "us-east-1",
            "endpoints": {"agentcore": url, "sqs": url, "s3": url},
        }
    )
    figures: dict[str, float] = {}

    # botocore's clients as the engine had them: a fixed User-Agent; one attempt per
    # AgentCore call, SQS with standard retries (none happen here)
    def config(attempts: int) -> AioConfig:
        retries = {"mode": "standard", "total_max_attempts": attempts}
        return AioConfig(
            user_agent="agentcore-rollout bench", max_pool_connections=64, retries=retries
        )

    session = get_session()
    async with (
        AwsClients(cfg) as clients,
        session.create_client(
            "bedrock-agentcore", region_name="us-east-1", endpoint_url=url, config=config(1)
        ) as botocore,
        session.create_client(
            "sqs", region_name="us-east-1", endpoint_url=url, config=config(5)
        ) as botocore_sqs,
    ):
        signed = AgentCoreRuntime(clients.agentcore, ARN)
        queue = clients.queue
        assert queue is not None
        receive = {
            "QueueUrl": QUEUE,
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": 20,
            "VisibilityTimeout": 60,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        delete = {
            "QueueUrl": QUEUE,
            "Entries": [{"Id": str(i), "ReceiptHandle": RECEIPT} for i in range(10)],
        }

        async def botocore_invoke(sid: str) -> None:
            resp = await botocore.invoke_agent_runtime(
                agentRuntimeArn=ARN,
                qualifier="DEFAULT",
                runtimeSessionId=sid,
                payload=PAYLOAD,
                contentType="application/json",
                accept="application/json",
            )
            async with resp["response"] as stream:
                await stream.read()

        async def botocore_stop(sid: str) -> None:
            await botocore.stop_runtime_session(
                agentRuntimeArn=ARN, qualifier="DEFAULT", runtimeSessionId=sid
            )

        for name, call in (
            ("botocore_invoke", botocore_invoke),
            ("botocore_stop", botocore_stop),
            ("botocore_receive", lambda _: botocore_sqs.receive_message(**receive)),
            ("botocore_delete", lambda _: botocore_sqs.delete_message_batch(**delete)),
            ("signed_invoke", lambda sid: signed.invoke(sid, PAYLOAD)),
            ("signed_stop", signed.stop),
            ("signed_receive", lambda _: queue.receive_message(**receive)),
            ("signed_delete", lambda _: queue.delete_message_batch(**delete)),
        ):
            figures[name] = await _cpu_ms_per_call(call, calls)
    return figures


def plot(figures: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = list(figures)
    colors = ["#999" if n.startswith("botocore") else "#37c" for n in names]
    ax.bar(names, [figures[n]["median"] for n in names], color=colors)
    ax.set_ylabel("client CPU ms per call (median of rounds)")
    ax.set_title("The calls of a rollout: botocore's clients vs the engine's own")
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/calls.py")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    os.environ.update(LOCAL_CREDENTIALS)
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        rounds = [asyncio.run(measure(url, args.calls)) for _ in range(args.rounds)]
    finally:
        server.terminate()
        server.wait()
    figures = {
        name: {
            "median": round(statistics.median(r[name] for r in rounds), 3),
            "rounds": [round(r[name], 3) for r in rounds],
        }
        for name in rounds[0]
    }
    result = {
        "cpu_ms_per_call": figures,
        "calls_per_rollout": PER_ROLLOUT,
        "ms_per_rollout": {
            client: round(
                sum(figures[f"{client}_{k}"]["median"] * n for k, n in PER_ROLLOUT.items()), 3
            )
            for client in ("botocore", "signed")
        },
        "calls": args.calls,
        "in_flight": IN_FLIGHT,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calls.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(figures, args.out / "calls.png")


if __name__ == "__main__":
    main()
