"""How fast are the local policy servers? Prints JSON, writes bench/results/policy.json and .png.

Two engines behind the same PolicyServer endpoints:

1. `hf`: a Hugging Face causal LM on CPU (`local.policy.hf.HFPolicy`, continuous batching):
   decode throughput (sampled tokens per second of wall time, prefill included) at 1, 8 and 32
   concurrent /generate requests of 64 new tokens each (temperature 1, eos ignored, so every
   request runs its full length), the model's load time and the time of a
   /update_weights_from_disk of the same directory. For a tiny random Llama (2 layers, hidden
   64, the test fixture tokenizer) and for SmolLM2-135M-Instruct: `--model DIR` (a converted
   safetensors dir), else `local.models.ready_model`'s cached conversion (made if missing).
2. `toy`: the char policy, in process and over HTTP (chat completions), as before.

The server runs in this process (its event loop here, its scheduler thread beside it); the
client is aiohttp on the same loop. Usage: `python bench/policy.py [--model DIR] [--tokens N]`;
`--smoke` (CI's): the tiny Llama alone (SmolLM2 runs the same engine, and a prefill of 32
sequences on it takes seconds), 4 new tokens a request, one round, 40 toy requests, into
out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.local.policy import PolicyServer, SamplingParams, TinyPolicy  # noqa: E402
from bench import _smoke  # noqa: E402

FIXTURE_TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer"
MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]
CONCURRENCY = (1, 8, 32)


# -- Hugging Face engine ---------------------------------------------------------------------------


def tiny_model(path: Path) -> Path:
    """The tests' tiny random Llama (tests/test_hf_policy.py) over the fixture tokenizer."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=702,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    for file in FIXTURE_TOKENIZER.iterdir():
        shutil.copy(file, path / file.name)
    return path


def smollm2_dir(flag: str | None) -> Path:
    """`--model DIR`, else SmolLM2 converted into the user's model cache (once: 15-40 s)."""
    from agentcore_rollout.local.models import ready_model

    return Path(flag) if flag else ready_model("smollm2-135m-instruct")


async def hf_bench(
    model_dir: Path, new_tokens: int, rounds: int, threads: int | None
) -> dict[str, Any]:
    from agentcore_rollout.local.policy.hf import HFPolicy

    started = time.perf_counter()
    policy = HFPolicy(model_dir, threads=threads)
    load_s = time.perf_counter() - started
    prompt = policy.tokenizer.apply_chat_template(MESSAGES)
    out: dict[str, Any] = {"model": model_dir.name, "load_s": load_s}
    async with PolicyServer(policy) as server, aiohttp.ClientSession() as http:

        async def one(i: int) -> int:
            sampling = {"max_new_tokens": new_tokens, "ignore_eos": True, "seed": i}
            body = {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True}
            async with http.post(f"{server.url}/generate", json=body) as response:
                answer = await response.json()
            return len(answer["output_ids"])

        await one(0)  # warm-up: first-call allocations
        for c in CONCURRENCY:
            runs = []
            for r in range(rounds):
                steps, t0, cpu0 = policy.decode_steps, time.perf_counter(), time.process_time()
                tokens = sum(await asyncio.gather(*(one(r * c + i) for i in range(c))))
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                runs.append((tokens / elapsed, policy.decode_steps - steps, elapsed, tokens / cpu))
            best = max(runs)
            out[f"concurrent_{c}"] = {
                "tokens_per_s": best[0],
                "tokens_per_s_runs": [round(r[0], 1) for r in runs],
                "decode_steps": best[1],
                "seconds": best[2],
                # Load-independent: tokens per second of this process's CPU time (all threads).
                "tokens_per_cpu_s": best[3],
                "load_avg_1m": os.getloadavg()[0],
            }
        t0 = time.perf_counter()
        body = {"model_path": str(model_dir)}
        async with http.post(f"{server.url}/update_weights_from_disk", json=body) as response:
            assert response.status == 200, await response.text()
        out["weight_update_s"] = time.perf_counter() - t0
    out["prompt_tokens"] = len(prompt)
    out["new_tokens"] = new_tokens
    return out


# -- toy -------------------------------------------------------------------------------------------


def toy_in_process(n: int) -> dict[str, float]:
    policy, rng = TinyPolicy(0), np.random.default_rng(0)
    prompt = policy.tokenizer.apply_chat_template(MESSAGES)
    sp = SamplingParams(max_new_tokens=64, ignore_eos=True)
    started = time.perf_counter()
    for _ in range(n):
        policy.generate(prompt, sp, rng)
    return {"tokens_per_s": n * 64 / (time.perf_counter() - started)}


async def toy_over_http(n: int, concurrency: int) -> dict[str, float]:
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


# -- report ----------------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, data in results["hf"].items():
        ys = [data[f"concurrent_{c}"]["tokens_per_s"] for c in CONCURRENCY]
        line = ax.plot(CONCURRENCY, ys, marker="o", label=f"{name} (load {data['load_s']:.1f} s)")
        cpu = [data[f"concurrent_{c}"]["tokens_per_cpu_s"] for c in CONCURRENCY]
        ax.plot(CONCURRENCY, cpu, linestyle=":", color=line[0].get_color(), label="  per CPU s")
    ax.axhline(100, color="grey", linestyle="--", linewidth=1, label="target at 8 (SmolLM2)")
    ax.set(xscale="log", yscale="log", xlabel="concurrent sequences", ylabel="tokens / s")
    ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    ax.set_title("HF policy server on CPU: decode throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a converted SmolLM2 (or any HF causal LM) model dir")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--rounds", type=int, default=2, help="runs per concurrency (best kept)")
    parser.add_argument("--requests", type=int, default=2000, help="toy: HTTP requests")
    parser.add_argument("--no-tiny", action="store_true", help="skip the tiny random Llama")
    parser.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2")
    parser.add_argument("--threads", type=int, help="torch threads of the engine (default: 1)")
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    parser.add_argument("--note", default="", help="added to setup (e.g. other load running)")
    args = _smoke.parse(parser, tokens=4, rounds=1, requests=40, no_tiny=False, no_smollm2=True)
    if args.smoke and importlib.util.find_spec("torch") is None:
        _smoke.skip("torch is not installed (make models)")
    hf: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_tiny:
            hf["tiny-llama"] = asyncio.run(
                hf_bench(tiny_model(Path(tmp)), args.tokens, args.rounds, args.threads)
            )
    if not args.no_smollm2:
        smollm2 = smollm2_dir(args.model)
        hf[smollm2.name] = asyncio.run(hf_bench(smollm2, args.tokens, args.rounds, args.threads))
    import torch

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    results = {
        "setup": (
            f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), torch "
            f"{torch.__version__} float32, {args.threads or 1} engine "
            f"threads; server and client in one process; {args.tokens} new tokens per "
            f"request, best of {args.rounds} rounds; load average at the end {load} (1, 5, "
            f"15 min; other processes share the cores). {args.note}"
        ).strip(),
        "hf": hf,
        "toy": {
            "in_process": toy_in_process(args.requests // 10),
            "http_chat": asyncio.run(toy_over_http(args.requests, 32)),
        },
    }
    print(json.dumps(results, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "policy.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "policy.png")


if __name__ == "__main__":
    main()
