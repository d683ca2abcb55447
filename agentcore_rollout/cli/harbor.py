"""Harbor tasks' images, built here for the local stack (`local.mode: container`): one per
distinct environment (`tasks.environment_id`) and agent, each the environment's image (its
`environment/Dockerfile` built, on the Debian substitute base where its FROM cannot be pulled,
or its `docker_image` pulled) with the wrapper's layer on it (`harbor/images.py`)."""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from ..harbor.agents import HarborAgent, agent_named
from ..harbor.images import SOURCE, agent_image, environment_image, layer_dockerfile
from ..harbor.tasks import HarborTask
from ..local.containers import ContainerEngine, ImageBuildError, build_image

LAYER_LABEL = "agentcore-rollout.harbor-layer"
"""On each task image: a digest of its layer (its Dockerfile, this package's source), so an
image built from an older wrapper is built again, not reused."""


def task_images(
    tasks: Iterable[HarborTask], agent: str, engine: ContainerEngine, *, rebuild: bool = False
) -> dict[str, str]:
    """Environment id -> the image its tasks run with `agent`, built where it is missing or
    its layer is out of date (every one, with `rebuild`). One line per image on stderr."""
    chosen = agent_named(agent)
    images: dict[str, str] = {}
    for task in tasks:
        if task.environment not in images:
            images[task.environment] = _task_image(task, chosen, engine, rebuild)
    return images


def _task_image(
    task: HarborTask, agent: HarborAgent, engine: ContainerEngine, rebuild: bool
) -> str:
    """The task's image, unless one of the same layer (its Dockerfile and this package's
    source, `LAYER_LABEL`) is there already."""
    image = agent_image(task.environment, agent.name)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentcore-rollout-harbor-") as tmp:
        context = source_context(Path(tmp) / "context")
        base = environment_image(task.docker_image, task.environment)
        text = layer_dockerfile(base, agent, task.environment)
        digest = _digest(context, text)
        if not rebuild and _layer_of(image, engine) == digest:
            print(f"{image}: up to date (task {task.name}'s environment)", file=sys.stderr)
            return image
        _environment(task, engine, rebuild)
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(f"{text}LABEL {LAYER_LABEL}={digest}\n")
        build_image(dockerfile, image, context, engine=engine)
    seconds = time.monotonic() - started
    print(f"{image}: built in {seconds:.0f}s on {base} (task {task.name})", file=sys.stderr)
    return image


def _digest(context: Path, dockerfile: str) -> str:
    """What the layer is made of: its Dockerfile and every file of its context."""
    digest = hashlib.sha256(dockerfile.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(f"\0{path.relative_to(context)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def _layer_of(image: str, engine: ContainerEngine) -> str | None:
    """The image's `LAYER_LABEL` (None if there is no such image)."""
    template = '{{index .Config.Labels "' + LAYER_LABEL + '"}}'
    shown = engine.run("image", "inspect", "--format", template, image)
    return shown.stdout.strip() if shown.returncode == 0 else None


def _environment(task: HarborTask, engine: ContainerEngine, rebuild: bool) -> str:
    """The task's environment image, built (or pulled) if missing."""
    image = environment_image(task.docker_image, task.environment)
    if task.docker_image is not None:
        if not engine.image_exists(image):
            pulled = engine.run("pull", "-q", image, timeout=task.build_timeout)
            if pulled.returncode != 0:
                why = (pulled.stderr.strip().splitlines() or ["no output"])[-1][:300]
                raise ImageBuildError(f"task {task.name}: docker_image {image} not pulled: {why}")
    elif rebuild or not engine.image_exists(image):
        build_image(task.dockerfile, image, task.dockerfile.parent, engine=engine)
    return image


def source_context(into: Path) -> Path:
    """A build context (`into`, made here) holding this package's source (`SOURCE`), from the
    checkout it is installed from, never the whole tree (a venv, caches): the layer installs
    the wrapper from it, locally and for AgentCore (`deploy --tasks`)."""
    root = Path(__file__).resolve().parents[2]
    if missing := [name for name in SOURCE if not (root / name).exists()]:
        raise ImageBuildError(
            f"a Harbor task image needs agentcore-rollout's source ({', '.join(missing)} "
            f"missing in {root}): install it from a clone (pip install -e .)"
        )
    into.mkdir()
    for name in SOURCE:
        if (root / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(root / name, into / name, ignore=ignore)
        else:
            shutil.copy2(root / name, into / name)
    return into
