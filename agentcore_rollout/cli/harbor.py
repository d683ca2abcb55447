"""Harbor tasks' images, built here for the local stack (`local.mode: container`): one per distinct
environment and agent, and one per separate verifier's environment, each the environment's image
with the wrapper's layer on it (`harbor.images`).

The wrapper and the agent's install are built once each and copied into every environment's
layer; environments build concurrently, one per core. One that fails to build is its tasks'
failure alone: `TaskImages` holds the images that built and why each other one did not."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from ..harbor.agents import NOP, HarborAgent, agent_named
from ..harbor.images import (
    SOURCE,
    agent_image,
    copied_layer_dockerfile,
    environment_image,
    install_dockerfile,
    install_image,
    wrapper_dockerfile,
    wrapper_image,
)
from ..harbor.tasks import HarborTask, Resources
from ..local.containers import ContainerEngine, ImageBuildError, build_image, debian_base

LAYER_LABEL = "agentcore-rollout.harbor-layer"
"""On each task image (and the wrapper's): a digest of what its layer is made of (its
Dockerfile, the images it is built from, this package's source), so an image built from an
older wrapper or environment is built again, not reused."""
_REASON_LINES = 8
"""The builder's last lines a failure's reason carries."""


@dataclass(frozen=True)
class TaskImages:
    """What `task_images` made: environment id -> image for those that built (or were up to
    date), environment id -> why for those that did not (one line naming the environment and
    a task of it, then the builder's last lines)."""

    images: dict[str, str]
    failed: dict[str, str] = field(default_factory=dict)
    resources: dict[str, Resources] = field(default_factory=dict)
    """Each environment's limits and network (built or not), as its tasks ask."""
    layer_seconds: dict[str, float] = field(default_factory=dict)
    """Each layer built now: the seconds its build took (its environment's image apart)."""
    seconds: float = 0.0
    """The whole build's."""

    @property
    def built(self) -> frozenset[str]:
        """The environments whose layer was built now."""
        return frozenset(self.layer_seconds)

    @property
    def cached(self) -> frozenset[str]:
        """The environments whose image was up to date."""
        return frozenset(self.images) - self.built


@dataclass(frozen=True)
class EnvironmentBuild:
    """One environment to build: its id, a task of it (for messages), where its image comes
    from (`docker_image`, else the Dockerfile in `context`), and the agent its layer has."""

    id: str
    task: str
    docker_image: str | None
    context: Path
    timeout: float
    agent: HarborAgent
    what: str = "environment"
    resources: Resources = field(default_factory=Resources)

    @property
    def base(self) -> str:
        return environment_image(self.docker_image, self.id)

    @property
    def image(self) -> str:
        return agent_image(self.id, self.agent.name)


def environments(tasks: Iterable[HarborTask], agent: HarborAgent) -> list[EnvironmentBuild]:
    """Every distinct environment of `tasks`: each task's (with `agent`) and each separate
    verifier's (with no agent: `nop`), in the order first met."""
    found: dict[str, EnvironmentBuild] = {}
    for task in tasks:
        env = EnvironmentBuild(
            task.environment,
            task.name,
            task.docker_image,
            task.dockerfile.parent,
            task.build_timeout,
            agent,
            resources=Resources(task.cpus, task.memory_mb, task.storage_mb, task.network_mode),
        )
        found.setdefault(env.id, env)
        if task.verifier_mode == "separate":
            context = task.verifier_context
            image = task.verifier_docker_image
            if image is None and not (context / "Dockerfile").is_file():
                image = task.docker_image  # the task's environment is the verifier's too
            verifier = EnvironmentBuild(
                task.verifier_environment,
                task.name,
                image,
                context,
                task.build_timeout,
                NOP,
                "verifier's environment",
                task.verifier_resources or Resources(),
            )
            found.setdefault(verifier.id, verifier)
    return list(found.values())


def task_images(
    tasks: Iterable[HarborTask],
    agent: str,
    engine: ContainerEngine,
    *,
    rebuild: bool = False,
    workers: int | None = None,
) -> TaskImages:
    """Every environment's image for `agent` (separate verifiers' with none), built where
    missing or out of date: with `rebuild`, each environment's image is built again too (the
    builder's cache keeps unchanged steps) and the layers on those that changed. Never raises
    for one environment: its failure is in `TaskImages.failed`. `workers` environments build
    at once (default: one per core); a progress bar and a summary line on the console."""
    from .terminal import console, status_bar  # lazily: rich

    started = time.monotonic()
    todo = environments(tasks, agent_named(agent))
    images: dict[str, str] = {}
    failed: dict[str, str] = {}
    built: dict[str, float] = {}
    bar = status_bar("[bold]images", "{task.completed}/{task.total}")
    progress = bar.add_task("images", total=len(todo), status="the wrapper")
    with bar, tempfile.TemporaryDirectory(prefix="agentcore-rollout-harbor-") as tmp:
        # The wrapper and each agent's install, once: an environment needing one that failed
        # fails with it.
        made: dict[str, tuple[str, str | None] | Exception] = {}
        empty = Path(tmp) / "empty"  # a layer's context: it copies from images alone
        empty.mkdir()
        try:
            wrapper: str | Exception = _wrapper(engine, Path(tmp), _source_digest())
        except (ImageBuildError, OSError, subprocess.SubprocessError) as e:
            wrapper = e
        for chosen in {e.agent.name: e.agent for e in todo}.values():
            try:
                if isinstance(wrapper, Exception):
                    raise wrapper
                installed = _installed(chosen, engine, Path(tmp)) if chosen.shared else None
                made[chosen.name] = (wrapper, installed)
            except (ImageBuildError, OSError, subprocess.SubprocessError) as e:
                made[chosen.name] = e

        def one(env: EnvironmentBuild) -> float | None:
            images_of = made[env.agent.name]
            if isinstance(images_of, Exception):
                raise images_of
            return _layer(env, *images_of, engine, rebuild, empty)

        count = max(1, workers or os.cpu_count() or 1)
        with ThreadPoolExecutor(count, thread_name_prefix="harbor-image") as pool:
            futures = {pool.submit(one, env): env for env in todo}
            for future in as_completed(futures):
                env = futures[future]
                try:
                    if (seconds := future.result()) is not None:
                        built[env.id] = seconds
                    images[env.id] = env.image
                except Exception as e:  # any failure is this environment's alone
                    failed[env.id] = _reason(env, e)
                status = f"built {len(built)}  cached {len(images) - len(built)}"
                bar.update(progress, advance=1, status=f"{status}  failed {len(failed)}")
    resources = {env.id: env.resources for env in todo}
    result = TaskImages(images, failed, resources, built, time.monotonic() - started)
    console.print(
        f"images: {len(result.built)} built, {len(result.cached)} cached (up to date), "
        f"{len(failed)} failed, of {len(todo)} environments in {result.seconds:.0f}s",
        style="red" if failed else None,
        markup=False,
    )
    return result


def _reason(env: EnvironmentBuild, error: BaseException) -> str:
    """One line naming the environment and a task of it, then the builder's last lines."""
    why = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    head = f"{env.what} {env.id} (task {env.task}): {why}"
    tail = list(getattr(error, "tail", ()))
    if tail and tail[-1].strip() in why:  # the head says it already
        tail.pop()
    tail = tail[-_REASON_LINES:]
    return "\n".join([head, *(f"  {line}" for line in tail)])


def _wrapper(engine: ContainerEngine, tmp: Path, source: str) -> str:
    """The wrapper's image (`wrapper_dockerfile` on the Debian base), built unless one of the
    same digest (its Dockerfile, its base's id, the package's `source`) is there: its id."""
    image = wrapper_image()
    base = debian_base(engine)
    text = wrapper_dockerfile(base)
    digest = _hash(text, _image_id(base, engine), source)
    if _layer_of(image, engine) != digest:
        context = source_context(tmp / "wrapper")
        dockerfile = tmp / "wrapper.Dockerfile"
        dockerfile.write_text(f"{text}LABEL {LAYER_LABEL}={digest}\n")
        build_image(dockerfile, image, context, engine=engine, log=None)
    return _image_id(image, engine)


def _installed(agent: HarborAgent, engine: ContainerEngine, tmp: Path) -> str:
    """The agent's install image (`install_dockerfile` on the Debian base), built unless one
    of the same digest is there: its id."""
    image = install_image(agent.name)
    base = debian_base(engine)
    text = install_dockerfile(base, agent)
    digest = _hash(text, _image_id(base, engine))
    if _layer_of(image, engine) != digest:
        dockerfile = tmp / f"install-{agent.name}.Dockerfile"
        dockerfile.write_text(f"{text}LABEL {LAYER_LABEL}={digest}\n")
        build_image(dockerfile, image, tmp / "empty", engine=engine, log=None)
    return _image_id(image, engine)


def _layer(
    env: EnvironmentBuild,
    wrapper: str,
    installed: str | None,
    engine: ContainerEngine,
    rebuild: bool,
    empty: Path,
) -> float | None:
    """The environment's image with the layer on it, unless one of the same digest (the
    layer's Dockerfile, naming the wrapper's and the agent's image ids, and the environment's
    image id) is there: the seconds its build took, None if there was one."""
    base = _environment(env, engine, rebuild)
    text = copied_layer_dockerfile(base, env.agent, env.id, wrapper, installed)
    digest = _hash(text, _image_id(base, engine))
    if _layer_of(env.image, engine) == digest:
        return None
    started = time.monotonic()
    dockerfile = empty.parent / f"{env.id}-{env.agent.name}.Dockerfile"
    dockerfile.write_text(f"{text}LABEL {LAYER_LABEL}={digest}\n")
    build_image(dockerfile, env.image, empty, engine=engine, log=None)
    return time.monotonic() - started


def _environment(env: EnvironmentBuild, engine: ContainerEngine, rebuild: bool) -> str:
    """The environment's image, built (or pulled) if missing, built again with `rebuild`."""
    image = env.base
    if env.docker_image is not None:
        if not engine.image_exists(image):
            pulled = engine.run("pull", "-q", image, timeout=env.timeout)
            if pulled.returncode != 0:
                lines = pulled.stderr.strip().splitlines() or ["no output"]
                raise ImageBuildError(f"docker_image {image} not pulled: {lines[-1][:300]}")
    elif rebuild or not engine.image_exists(image):
        build_image(env.context / "Dockerfile", image, env.context, engine=engine, log=None)
    return image


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _image_id(image: str, engine: ContainerEngine) -> str:
    shown = engine.run("image", "inspect", "--format", "{{.Id}}", image)
    if shown.returncode != 0:
        raise ImageBuildError(f"image {image} is not there: {shown.stderr.strip()[:300]}")
    return shown.stdout.strip()


def _layer_of(image: str, engine: ContainerEngine) -> str | None:
    """The image's `LAYER_LABEL` (None if there is no such image)."""
    template = '{{index .Config.Labels "' + LAYER_LABEL + '"}}'
    shown = engine.run("image", "inspect", "--format", template, image)
    return shown.stdout.strip() if shown.returncode == 0 else None


def _source_digest() -> str:
    """Every file of this package's source (`SOURCE`), hashed once per build."""
    root = _root()
    digest = hashlib.sha256()
    for name in SOURCE:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            digest.update(f"\0{f.relative_to(root)}\0".encode() + f.read_bytes())
    return digest.hexdigest()[:16]


def _root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if missing := [name for name in SOURCE if not (root / name).exists()]:
        raise ImageBuildError(
            f"a Harbor task image needs agentcore-rollout's source ({', '.join(missing)} "
            f"missing in {root}): install it from a clone (pip install -e .)"
        )
    return root


def source_context(into: Path) -> Path:
    """A build context (`into`, made here) holding this package's source (`SOURCE`), from the
    checkout it is installed from, never the whole tree (a venv, caches): the wrapper's image
    installs it, locally and for AgentCore (`deploy --tasks`)."""
    root = _root()
    into.mkdir()
    for name in SOURCE:
        if (root / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(root / name, into / name, ignore=ignore)
        else:
            shutil.copy2(root / name, into / name)
    return into
