"""Gateway overhead: added latency per agent turn, gateway vs calling the policy server directly.

Prints JSON and writes bench/results/gateway.json and gateway.png. The toy policy server and the
gateway (char renderer, SGLang backend) each run in their own process on loopback; this process
drives N concurrent sessions of T growing multi-turn conversations through aiohttp:

  direct    POST policy /v1/chat/completions         (the policy renders and samples)
  gateway   POST gateway /v1/chat/completions         (the gateway renders, calls policy
            /generate with ids + log-probs, parses, records the turn)

Each (session, turn) sends the same per-request seed on both paths, so both sample the same
tokens and do the same work on the policy side; the difference is the gateway's cost. Arms
alternate in rounds to cancel drift. `finish_ms` is the time to close a session and download its
trace. Absolute numbers are a 2-core machine's; the point is the gateway's share.

    python bench/gateway.py [--sessions 1 16 64] [--turns 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout._process import ServiceProcess  # noqa: E402
from agentcore_rollout.gateway import GatewayAdmin  # noqa: E402
from agentcore_rollout.gateway.__main__ import TOKEN_ENV  # noqa: E402

SAMPLING = {"temperature": 1.0, "max_tokens": 8}


def conversation(session: int, turn: int, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*history, {"role": "user", "content": f"What is {session % 10} + {turn}?"}]


async def drive(
    http: aiohttp.ClientSession, url: str, keys: list[str | None], turns: int
) -> list[float]:
    """Run one conversation per key concurrently; per-turn latencies in ms."""
    latencies: list[float] = []

    async def one(session: int, key: str | None) -> None:
        history: list[dict[str, Any]] = []
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        for turn in range(turns):
            messages = conversation(session, turn, history)
            body = {"model": "policy", "messages": messages, "seed": session * 1000 + turn}
            body |= SAMPLING
            started = time.perf_counter()
            async with http.post(url, json=body, headers=headers) as response:
                data = await response.json()
            latencies.append((time.perf_counter() - started) * 1000)
            assert response.status == 200, data
            history = [
                *messages,
                {"role": "assistant", "content": data["choices"][0]["message"]["content"]},
            ]

    await asyncio.gather(*(one(i, key) for i, key in enumerate(keys)))
    return latencies


def pct(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
    }


async def run(sessions: list[int], turns: int, rounds: int) -> dict[str, Any]:
    token = secrets.token_urlsafe(32)
    policy = ServiceProcess("policy", "agentcore_rollout.local.policy", "--seed", "0")
    policy.start()
    gateway = ServiceProcess(
        "gateway",
        "agentcore_rollout.gateway",
        "--backend-url",
        policy.url,
        "--renderer",
        "agentcore_rollout.local.policy.render:CharRenderer",
        env={TOKEN_ENV: token},
    )
    try:
        gateway.start()
        results: dict[str, Any] = {}
        limits = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(connector=limits) as http,
            GatewayAdmin(gateway.url, token) as admin,
        ):
            await drive(http, f"{policy.url}/v1/chat/completions", [None] * 4, 2)  # warm up
            for n in sessions:
                direct: list[float] = []
                through: list[float] = []
                finish: list[float] = []
                wall = {"direct": 0.0, "gateway": 0.0}
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    direct += await drive(
                        http, f"{policy.url}/v1/chat/completions", [None] * n, turns
                    )
                    wall["direct"] += time.perf_counter() - t0
                    created = [
                        await admin.create_session(f"bench-{i}", sampling=SAMPLING)
                        for i in range(n)
                    ]
                    t0 = time.perf_counter()
                    keys: list[str | None] = [s.api_key for s in created]
                    through += await drive(http, f"{gateway.url}/v1/chat/completions", keys, turns)
                    wall["gateway"] += time.perf_counter() - t0
                    for s in created:
                        t1 = time.perf_counter()
                        trace = await admin.finish_session(s.session_id)
                        finish.append((time.perf_counter() - t1) * 1000)
                        assert trace["num_turns"] == turns and trace["num_samples"] >= 1
                d, g = pct(direct), pct(through)
                results[str(n)] = {
                    "turns": len(through),
                    "direct_ms": d,
                    "gateway_ms": g,
                    "added_ms": {k: round(g[k] - d[k], 3) for k in d},
                    "direct_turns_per_s": round(len(direct) / wall["direct"], 1),
                    "gateway_turns_per_s": round(len(through) / wall["gateway"], 1),
                    "finish_ms": pct(finish),
                }
    finally:
        gateway.stop()
        policy.stop()
    return {
        "setup": "policy server and gateway in separate processes on 127.0.0.1, aiohttp client, "
        f"{turns} turns per session, {rounds} alternating rounds, max_tokens 8",
        "concurrent_sessions": results,
    }


def plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = figures["concurrent_sessions"]
    groups = list(data)
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, n in zip(axes[0], groups, strict=True):
        x = np.arange(2)
        for i, (arm, label) in enumerate((("direct_ms", "direct"), ("gateway_ms", "gateway"))):
            values = [data[n][arm]["p50"], data[n][arm]["p99"]]
            bars = ax.bar(x + (i - 0.5) * 0.38, values, 0.38, label=label)
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(x, ["p50", "p99"])
        added = data[n]["added_ms"]
        sessions = f"{n} session" + ("" if n == "1" else "s")
        title = f"{sessions}: +{added['p50']:.1f} ms p50, +{added['p99']:.1f} ms p99"
        ax.set(ylabel="ms per turn", title=title)
        ax.legend()
    fig.suptitle("Latency per agent turn: policy server direct vs through the gateway")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    figures = asyncio.run(run(args.sessions, args.turns, args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(figures, args.out / "gateway.png")
    (args.out / "gateway.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
