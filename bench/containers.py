"""Session start time, container against process: what the emulator spends on a new session's
agent before its first invocation is forwarded (spawned, then answering `GET /ping`), and on
removing it at the session's end.

Both executors run the example math agent: a process serving `examples.math_agent.app:app` on
the host, and a container of its image (built here if missing) in each container engine that
works here, Podman and Docker. Sessions start one after another, so the figure is one start's
latency, not a throughput. Prints JSON; writes bench/results/containers.json and containers.png.

    python bench/containers.py [--sessions 8] [--smoke]

`--smoke` (CI's): 1 session each, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from agentcore_rollout.local.agents import ContainerAgent, ProcessAgent  # noqa: E402
from agentcore_rollout.local.config import EmulatorConfig  # noqa: E402
from agentcore_rollout.local.containers import (  # noqa: E402
    AGENT_IMAGE,
    ContainerEngine,
    ContainerRuntimeError,
    container_engine,
    ensure_image,
)
from bench import _smoke  # noqa: E402

APP = "examples.math_agent.app:app"


async def one_session(
    engine: ContainerEngine | None, http: aiohttp.ClientSession
) -> tuple[float, float]:
    """(seconds to a healthy agent, seconds to remove it): a container of `engine`, or a
    process where it is None."""
    began = time.perf_counter()
    if engine is not None:
        config = EmulatorConfig(mode="container", image=AGENT_IMAGE)
        label = f"{os.getpid()}-bench"
        agent: ProcessAgent = await ContainerAgent.spawn_container(
            config, engine, label, "bench", config.image
        )
    else:
        config = EmulatorConfig(app=APP, env={"PYTHONPATH": str(ROOT)})
        agent = await ProcessAgent.spawn(config, "bench")
    await agent.wait_ready(http, timeout=120)
    ready = time.perf_counter()
    await agent.terminate()
    return ready - began, time.perf_counter() - ready


def engines() -> dict[str, ContainerEngine]:
    """Each container engine that works here, its image built if missing."""
    found = {}
    for name in ("podman", "docker"):
        try:
            found[name] = container_engine(name)
        except ContainerRuntimeError as e:
            print(f"{name}: skipped ({e})", file=sys.stderr)
            continue
        ensure_image(ROOT / "examples/math_agent/Dockerfile", AGENT_IMAGE, found[name])
    return found


async def measure(
    sessions: int, kinds: dict[str, ContainerEngine | None]
) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {}
    async with aiohttp.ClientSession() as http:
        for kind, engine in kinds.items():
            await one_session(engine, http)  # warm: the page cache, the engine's storage
            runs = [await one_session(engine, http) for _ in range(sessions)]
            figures[kind] = {"start_s": [r[0] for r in runs], "stop_s": [r[1] for r in runs]}
    return figures


def summary(
    figures: dict[str, dict[str, list[float]]], sessions: int, found: dict[str, ContainerEngine]
) -> dict[str, object]:
    def stats(xs: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(xs), 3),
            "min": round(min(xs), 3),
            "max": round(max(xs), 3),
        }

    out: dict[str, object] = {
        "sessions_each": sessions,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "engines": {n: e.run("--version").stdout.strip() for n, e in found.items()},
        },
    }
    for kind, fig in figures.items():
        out[kind] = {"start_s": stats(fig["start_s"]), "stop_s": stats(fig["stop_s"])}
    process = statistics.median(figures["process"]["start_s"])
    out["container_over_process_start"] = {
        name: round(statistics.median(figures[name]["start_s"]) / process, 2) for name in found
    }
    return out


def plot(figures: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    kinds = list(figures)
    ax.boxplot([figures[k]["start_s"] for k in kinds], tick_labels=kinds)
    ax.set_ylabel("seconds to a healthy agent")
    ax.set_title("session start: process vs containers (math agent)")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, sessions=1)
    os.chdir(ROOT)
    found = engines()
    if not found and args.smoke:
        _smoke.skip("no container engine works here (make containers)")
    if not found:
        raise SystemExit("no container engine works here: make containers")
    figures = asyncio.run(measure(args.sessions, {"process": None, **found}))
    result = summary(figures, args.sessions, found)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(figures, args.out / "containers.png")
    (args.out / "containers.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
