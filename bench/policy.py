"""How fast is the toy policy server? Prints one JSON object.

The local stack puts this server on the rollout hot path (every agent turn is a request), so its
throughput bounds how many concurrent local sessions a laptop can drive before the policy, not the
engine, is the bottleneck. Usage: `python bench/policy.py [--requests N] [--concurrency C]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import numpy as np

from agentcore_rollout.local.policy import PolicyServer, SamplingParams, TinyPolicy

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]


def in_process(n: int) -> dict[str, float]:
    policy, rng = TinyPolicy(0), np.random.default_rng(0)
    prompt = policy.tokenizer.apply_chat_template(MESSAGES)
    sp = SamplingParams(max_new_tokens=64, ignore_eos=True)
    started = time.perf_counter()
    for _ in range(n):
        policy.generate(prompt, sp, rng)
    elapsed = time.perf_counter() - started
    return {"tokens_per_s": n * 64 / elapsed}


async def over_http(n: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    body = {"messages": MESSAGES, "logprobs": True, "max_tokens": 32}
    async with PolicyServer() as server, aiohttp.ClientSession() as http:
        url = server.url + "/v1/chat/completions"

        async def worker(count: int) -> None:
            for _ in range(count):
                t0 = time.perf_counter()
                async with http.post(url, json=body) as response:
                    await response.read()
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        share = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
        await asyncio.gather(*(worker(k) for k in share))
        elapsed = time.perf_counter() - started
    ms = np.array(latencies) * 1000
    return {
        "requests_per_s": n / elapsed,
        "latency_ms_p50": float(np.percentile(ms, 50)),
        "latency_ms_p99": float(np.percentile(ms, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    result = {
        "in_process": in_process(args.requests // 10),
        "http_chat": asyncio.run(over_http(args.requests, args.concurrency)),
        "requests": args.requests,
        "concurrency": args.concurrency,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
