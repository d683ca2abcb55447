"""AgentCore's two calls, alone: the engine's CPU per InvokeAgentRuntime and per
StopRuntimeSession, through botocore's client (aiobotocore) and through the engine's
`SignedClient` (botocore's credentials and SigV4 signer, aiohttp).

Why: they are the two calls every rollout makes, and `bench/scale.py` sees them only among
everything else. A server on loopback answers each at once, as the data plane's wire does
(`{"status": "accepted"}`, `{}`), in its own process, so only the client's CPU is measured:
this process's user + system time over `--calls` calls of each kind, 32 in flight.

Prints JSON; writes bench/results/agentcore_calls.json and agentcore_calls.png.

    python bench/agentcore_calls.py [--calls 3000] [--rounds 3] [--out bench/results]
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
IN_FLIGHT = 32

_SERVER = f"""
import sys
from aiohttp import web
async def answer(request):
    await request.read()
    reply = {{"status": "accepted"}} if request.path.endswith("/invocations") else {{}}
    sid = request.headers.get("{SESSION_HEADER}", "")
    return web.json_response(reply, headers={{"{SESSION_HEADER}": sid}})
app = web.Application()
app.router.add_post("/runtimes/{{arn}}/{{op}}", answer)
runner = web.AppRunner(app, access_log=None)
async def main():
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
import asyncio
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
        {"runtime_arn": ARN, "region": "us-east-1", "endpoints": {"agentcore": url}}
    )
    figures: dict[str, float] = {}
    # botocore's client as the engine had it: a fixed User-Agent, one attempt per call
    config = AioConfig(
        user_agent="agentcore-rollout bench",
        max_pool_connections=64,
        retries={"mode": "standard", "total_max_attempts": 1},
    )
    async with (
        AwsClients(cfg) as clients,
        get_session().create_client(
            "bedrock-agentcore", region_name="us-east-1", endpoint_url=url, config=config
        ) as botocore,
    ):
        signed = AgentCoreRuntime(clients.agentcore, ARN)

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
            ("signed_invoke", lambda sid: signed.invoke(sid, PAYLOAD)),
            ("signed_stop", signed.stop),
        ):
            figures[name] = await _cpu_ms_per_call(call, calls)
    return figures


def plot(figures: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(figures)
    ax.bar(names, [figures[n]["median"] for n in names], color=["#999", "#999", "#37c", "#37c"])
    ax.set_ylabel("client CPU ms per call (median of rounds)")
    ax.set_title("AgentCore calls: botocore's client vs the engine's signed HTTP")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/agentcore_calls.py")
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
        "saved_ms_per_rollout": round(
            sum(
                figures[f"botocore_{k}"]["median"] - figures[f"signed_{k}"]["median"]
                for k in ("invoke", "stop")
            ),
            3,
        ),
        "calls": args.calls,
        "in_flight": IN_FLIGHT,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agentcore_calls.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(figures, args.out / "agentcore_calls.png")


if __name__ == "__main__":
    main()
