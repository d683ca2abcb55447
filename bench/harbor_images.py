"""Harbor task images at dataset scale: what `task_images` (`local build` of a task folder)
spends per environment once the wrapper is built.

N small environments are generated (each `FROM python:3.11-slim`, built on the Debian
substitute base, writing a file of its own), with the `oracle` agent:
- first: one environment with no wrapper image yet (the wrapper's image built, its steps
  from the builder's cache where an earlier build left them, then the environment and its
  layer);
- serial: a few more, one at a time (each layer's seconds alone on the machine);
- dataset: `--envs` more at once (one per core, as `local build` runs them): the total, and
  each layer's seconds under that load;
- cached: the dataset's build again (every layer up to date);
- old layer (skipped with `--smoke`): one environment with `layer_dockerfile`, the layer that
  pip-installs the wrapper on each environment, as every environment's layer was built before;
- cold wrapper (skipped with `--smoke`): the wrapper's image with no builder cache.
Prints JSON; writes bench/results/harbor_images.json and harbor_images.png.

    python bench/harbor_images.py [--envs 30] [--smoke]

`--smoke` (CI's): the first environment (the wrapper's image kept if up to date) and a dataset
of one, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.cli.harbor import source_context, task_images  # noqa: E402
from agentcore_rollout.harbor.agents import ORACLE  # noqa: E402
from agentcore_rollout.harbor.images import (  # noqa: E402
    agent_image,
    environment_image,
    layer_dockerfile,
    wrapper_dockerfile,
    wrapper_image,
)
from agentcore_rollout.harbor.tasks import HarborTask, read_tasks  # noqa: E402
from agentcore_rollout.local.containers import (  # noqa: E402
    ContainerEngine,
    ContainerRuntimeError,
    build_image,
    container_engine,
    debian_base,
)
from bench import _smoke  # noqa: E402

AGENT = "oracle"


def make_tasks(into: Path, count: int, run: str) -> list[HarborTask]:
    """`count` tasks, each its own environment (a file of its own in /app)."""
    for i in range(count):
        task = into / f"env-{i:03d}"
        (task / "environment").mkdir(parents=True)
        (task / "environment" / "Dockerfile").write_text(
            f"FROM python:3.11-slim\nWORKDIR /app\nRUN echo {run}-{i} > /app/env-{i}.txt\n"
        )
        (task / "instruction.md").write_text(f"bench environment {i}\n")
        (task / "task.toml").write_text("[agent]\ntimeout_sec = 60\n")
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return read_tasks(into)


def remove(engine: ContainerEngine, tasks: list[HarborTask]) -> None:
    layers = [agent_image(t.environment, AGENT) for t in tasks]
    engine.run("rmi", "-f", *layers, timeout=300)
    engine.run("rmi", "-f", *(environment_image(None, t.environment) for t in tasks), timeout=300)


def old_layer(engine: ContainerEngine, task: HarborTask, tmp: Path) -> float:
    """Seconds of the layer that pip-installs the wrapper on the environment (`deploy`'s)."""
    base = environment_image(None, task.environment)
    dockerfile = tmp / "old.Dockerfile"
    dockerfile.write_text(layer_dockerfile(base, ORACLE, task.environment))
    context = source_context(tmp / "old-context")
    image = f"localhost/agentcore-rollout-bench-old-layer:{task.environment}"
    began = time.monotonic()
    build_image(dockerfile, image, context, engine=engine, log=None)
    seconds = time.monotonic() - began
    engine.run("rmi", "-f", image)
    return seconds


def cold_wrapper(engine: ContainerEngine, tmp: Path) -> float:
    """Seconds of the wrapper's image built from nothing (no builder cache): what the first
    environment of a machine, or of a changed source, adds once."""
    dockerfile = tmp / "wrapper.Dockerfile"
    dockerfile.write_text(wrapper_dockerfile(debian_base(engine)))
    context = source_context(tmp / "wrapper-context")
    image = "localhost/agentcore-rollout-bench-wrapper:cold"
    began = time.monotonic()
    built = engine.run(
        "build", "--no-cache", "-f", str(dockerfile), "-t", image, str(context), timeout=1800
    )
    seconds = time.monotonic() - began
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    engine.run("rmi", "-f", image)
    return seconds


def stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {
        "median": round(statistics.median(xs), 1),
        "min": round(min(xs), 1),
        "max": round(max(xs), 1),
    }


def measure(engine: ContainerEngine, envs: int, serial: int, smoke: bool) -> dict[str, object]:
    run = uuid.uuid4().hex[:8]  # environments of their own: none is cached from before
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-harbor-images-") as tmp:
        tasks = make_tasks(Path(tmp) / "tasks", 1 + serial + envs, run)
        first, alone, dataset = tasks[:1], tasks[1 : 1 + serial], tasks[1 + serial :]
        try:
            if not smoke:  # a smoke run takes the wrapper CI's Harbor steps left, if up to date
                engine.run("rmi", "-f", wrapper_image())
            made = task_images(first, AGENT, engine, workers=1)
            out["first_env_with_wrapper_s"] = round(made.seconds, 1)
            out["first_env_layer_s"] = round(*made.layer_seconds.values(), 1)
            each = []
            for task in alone:
                made = task_images([task], AGENT, engine, workers=1)
                each.append(made.seconds)
                out.setdefault("serial_layer_s", []).append(  # type: ignore[union-attr]
                    round(*made.layer_seconds.values(), 1)
                )
            out["serial_env_total_s"] = stats(each)
            made = task_images(dataset, AGENT, engine)
            assert not made.failed, made.failed
            out["dataset"] = {
                "environments": len(dataset),
                "workers": os.cpu_count(),
                "total_s": round(made.seconds, 1),
                "per_env_s": round(made.seconds / len(dataset), 1),
                "layer_s": stats(list(made.layer_seconds.values())),
            }
            again = task_images(dataset, AGENT, engine, rebuild=True)
            out["dataset_cached"] = {
                "total_s": round(again.seconds, 1),
                "cached": len(again.cached),
                "built": len(again.built),
            }
            if not smoke:
                out["old_pip_layer_s"] = round(old_layer(engine, first[0], Path(tmp)), 1)
                out["wrapper_cold_s"] = round(cold_wrapper(engine, Path(tmp)), 1)
        finally:
            remove(engine, tasks)
    return out


def plot(result: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dataset = result["dataset"]
    assert isinstance(dataset, dict)
    bars = {"first env\n(+ wrapper)": result["first_env_with_wrapper_s"]}
    if "serial_layer_s" in result:
        bars["later env\n(layer, alone)"] = statistics.median(result["serial_layer_s"])
    bars["later env\n(layer, 2 at once)"] = dataset["layer_s"]["median"]
    if "old_pip_layer_s" in result:
        bars["pip layer\n(before)"] = result["old_pip_layer_s"]
        bars["wrapper,\nno cache"] = result["wrapper_cold_s"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8), width_ratios=(3, 1.3))
    ax.bar(list(bars), list(bars.values()), color="tab:blue")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("one environment's image")
    cached = result["dataset_cached"]
    assert isinstance(cached, dict)
    n = dataset["environments"]
    bx.bar([f"{n} envs\nbuilt", f"{n} envs\ncached"], [dataset["total_s"], cached["total_s"]])
    bx.set_ylabel("seconds")
    bx.set_title(f"local build of {n} environments")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=30)
    parser.add_argument("--serial", type=int, default=3)
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, envs=1, serial=0)
    try:
        engine = container_engine("auto")
    except ContainerRuntimeError as e:
        if args.smoke:
            _smoke.skip(f"no container engine works here (make containers): {e}")
        raise
    load_before = os.getloadavg()[0]
    result = measure(engine, args.envs, args.serial, args.smoke)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "engine": engine.run("--version").stdout.strip(),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "harbor_images.png")
    (args.out / "harbor_images.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
