"""`deploy --tasks DIR` and `destroy --manifest FILE`: a folder of Harbor tasks on AgentCore, one
runtime per distinct environment (and per separate verifier's), its image built for linux/arm64
(AgentCore runs arm64 only) and pushed to ECR.

Every image is checked against AgentCore's image size limit before any runtime is created or
changed; the manifest says which runtime serves which tasks, with the `engine.runtimes` snippet.
Every failure is one `InfraError` line. docs/aws.md#harbor-tasks-on-agentcore."""

from __future__ import annotations

import argparse
import base64
import json
import platform
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ..harbor.agents import NOP, agent_named
from ..harbor.images import layer_dockerfile
from ..harbor.tasks import HarborTask, Resources, TaskError, read_tasks
from ..runtimes.agentcore.published import MAX_IMAGE_BYTES
from .errors import UsageError
from .harbor import source_context
from .infra import (
    CONTAINER_URI_RE,
    READY_TIMEOUT_S,
    InfraError,
    RuntimeInfo,
    RuntimeSpec,
    _aws,
    _check_name,
    _check_role_exists,
    aws_client,
    check_runtime_args,
    deploy_runtime,
    destroy_runtime,
    runtime_spec,
)
from .terminal import console

ARM64 = "linux/arm64"
MANIFEST = "harbor-runtimes.json"
PREFIX = "harbor"
MAX_PREFIX = 31  # a runtime name is at most 48 characters: the prefix, "_", a 16-character id
BINFMT = Path("/proc/sys/fs/binfmt_misc")
WORKERS = 8  # runtimes created or updated at once (each waits for READY)
STEP_TIMEOUT_S = 3600.0
"""The agent layer's build, and a push: emulated arm64 builds run several times slower than
native ones. (The environment's own build is bounded by its task's `build_timeout_sec`.)"""
_MANIFEST_TYPES = [
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
]


@dataclass(frozen=True)
class Environment:
    """One distinct task environment: its runtime, its image, the tasks it serves; or
    (`verifier`) a separate verifier's environment, its image with the wrapper and no agent."""

    id: str
    runtime: str
    image: str
    tasks: tuple[HarborTask, ...]
    verifier: bool = False

    @property
    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]


def plan(
    tasks: Sequence[HarborTask], agent: str, repository: str, prefix: str
) -> list[Environment]:
    """One `Environment` per distinct environment id, in the tasks' order."""
    _check_repository(repository)
    if len(prefix) > MAX_PREFIX:
        raise InfraError(f"runtime name prefix {prefix!r} is over {MAX_PREFIX} characters")
    groups: dict[str, list[HarborTask]] = {}
    verifiers: dict[str, list[HarborTask]] = {}
    for task in tasks:
        groups.setdefault(task.environment, []).append(task)
        if task.verifier_mode == "separate":
            verifiers.setdefault(task.verifier_environment, []).append(task)
    envs = [
        Environment(env_id, f"{prefix}_{env_id}", f"{repository}:{env_id}-{agent}", tuple(found))
        for env_id, found in groups.items()
    ] + [
        Environment(
            env_id, f"{prefix}_{env_id}", f"{repository}:{env_id}-{NOP.name}", (*found,), True
        )
        for env_id, found in verifiers.items()
    ]
    for env in envs:
        _check_name(env.runtime)
    return envs


def _resources(env: Environment) -> Resources:
    """What the environment's tasks ask of its containers (one id, one set of limits)."""
    task = env.tasks[0]
    if env.verifier:
        return task.verifier_resources or Resources()
    return Resources(task.cpus, task.memory_mb, task.storage_mb, task.network_mode)


def check_limits(envs: Sequence[Environment], network_mode: str) -> list[str]:
    """What AgentCore cannot do of the tasks' limits, before anything is built: a no-network
    environment on a PUBLIC runtime is refused (`InfraError`, one line: its session would
    reach the internet); on VPC, a warning that the VPC's subnets must have no route out
    (the service cannot tell); `cpus`, `memory_mb`, `storage_mb` a warning (a session's size
    is the service's). The warnings, one line each."""
    sealed = [env for env in envs if _resources(env).network_mode == "no-network"]
    if sealed and network_mode != "VPC":
        named = ", ".join(f"{env.id} (task {env.tasks[0].name})" for env in sealed)
        raise InfraError(
            f"network_mode no-network cannot be kept on a {network_mode} runtime ({named}): "
            "deploy with --network VPC and subnets with no route out (VPC endpoints for S3 "
            "and SQS, and a route to the gateway), or drop those tasks"
        )
    warnings = []
    if sealed:
        warnings.append(
            f"{len(sealed)} no-network environment(s) run in the VPC's subnets: they reach "
            "nothing only if those subnets have no route out (no NAT or internet gateway); "
            "the other environments share that VPC"
        )
    sized = [env for env in envs if any(vars(_resources(env))[k] for k in _SIZES)]
    if sized:
        warnings.append(
            f"cpus, memory_mb and storage_mb of {len(sized)} environment(s) are not applied: "
            "an AgentCore session's size is the service's, whatever the task asks"
        )
    return warnings


_SIZES = ("cpus", "memory_mb", "storage_mb")


def _check_repository(repository: str) -> None:
    found = CONTAINER_URI_RE.fullmatch(repository)
    if found is None or found[2] is None or found[6] is not None or found[7] is not None:
        raise InfraError(
            f"repository {repository!r} is not a private ECR repository URI without a tag "
            "(ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME: the stack's RepositoryUri output)"
        )


# Building and pushing the arm64 images.


def check_arm64_builder(engine: Any, *, machine: str | None = None, binfmt: Path = BINFMT) -> None:
    """Raise `InfraError` (one line) unless `engine` can build linux/arm64 images here: on an
    arm64 machine natively, elsewhere through QEMU's arm64 emulation registered with the
    kernel (binfmt_misc), which both Podman and Docker's buildx use."""
    machine = machine or platform.machine()
    if machine.lower() not in ("aarch64", "arm64"):
        try:
            emulated = (binfmt / "qemu-aarch64").read_text().startswith("enabled")
        except OSError:
            emulated = False
        if not emulated:
            raise InfraError(
                f"{engine.name} cannot build {ARM64} images on this {machine} machine: no arm64 "
                f"emulation registered ({binfmt}/qemu-aarch64); install qemu-user-static and "
                "binfmt-support, or build on an arm64 machine and deploy with --no-build"
            )
    if engine.name == "docker" and _quiet(engine, "buildx", "version") != 0:
        raise InfraError(f"docker buildx is missing: install docker-buildx to build {ARM64} images")


def _quiet(engine: Any, *args: str) -> int:
    try:
        return subprocess.run(engine.argv(*args), env=engine.env, capture_output=True).returncode
    except OSError:
        return 127


def build_and_push(
    envs: Sequence[Environment],
    agent: str,
    engine: Any,
    ecr: Any,
    *,
    machine: str | None = None,
    binfmt: Path = BINFMT,
) -> None:
    """Build each environment's arm64 image (the task's environment, then the agent layer on
    it) and push it to ECR. Refuses first, before anything runs, where arm64 cannot be built."""
    check_arm64_builder(engine, machine=machine, binfmt=binfmt)
    registries = {env.image.split("/", 1)[0] for env in envs}
    for registry in sorted(registries):
        _login(engine, ecr, registry)
    for env in envs:
        base = _environment_image(env, engine)
        with tempfile.TemporaryDirectory(prefix="agentcore-rollout-layer-") as tmp:
            dockerfile = Path(tmp) / "Dockerfile"
            layer_agent = NOP if env.verifier else agent_named(agent)
            dockerfile.write_text(layer_dockerfile(base, layer_agent, env.id))
            context = source_context(Path(tmp) / "context")
            argv = _build_argv(engine, dockerfile, env.image, context)
            _stream(engine, argv, f"build {env.image}", STEP_TIMEOUT_S)
        _stream(engine, engine.argv("push", env.image), f"push {env.image}", STEP_TIMEOUT_S)


def _environment_image(env: Environment, engine: Any) -> str:
    """The task's own image for arm64: its `docker_image`, or its `environment/` built (a
    separate verifier's: its `[verifier.environment] docker_image`, or its build folder)."""
    task = env.tasks[0]
    image = task.verifier_docker_image if env.verifier else task.docker_image
    if image is not None:
        return image  # the layer's FROM pulls it for linux/arm64
    context = task.verifier_context if env.verifier else task.dockerfile.parent
    tag = f"localhost/agentcore-rollout-harbor-env:{env.id}-arm64"  # beside local build's
    argv = _build_argv(engine, context / "Dockerfile", tag, context)
    _stream(engine, argv, f"build the environment of {task.name}", task.build_timeout)
    return tag


def _build_argv(engine: Any, dockerfile: Path, tag: str, context: Path) -> list[str]:
    build = ("buildx", "build", "--load") if engine.name == "docker" else ("build",)
    return engine.argv(*build, "--platform", ARM64, "-f", str(dockerfile), "-t", tag, str(context))


def _login(engine: Any, ecr: Any, registry: str) -> None:
    """`<engine> login` to ECR with a token from GetAuthorizationToken (what `aws ecr
    get-login-password` prints), given on stdin, never on a command line or in output."""
    with _aws("get an ECR login"):
        data = ecr.get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    argv = engine.argv("login", "--username", user, "--password-stdin", registry)
    _stream(engine, argv, f"log in to {registry}", 120, stdin=password)


def _stream(engine: Any, argv: list[str], what: str, timeout: float, stdin: str = "") -> None:
    """Run `argv`, its output going to stderr as it comes; an `InfraError` with its last line
    if it fails or outlives `timeout` seconds."""
    last = "no output"
    try:
        proc = subprocess.Popen(
            argv,
            env=engine.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as e:
        raise InfraError(f"{what}: {engine.name} did not start: {e}") from None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    with proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        for line in proc.stdout:
            sys.stderr.write(line)
            last = line.strip() or last
    timer.cancel()
    if proc.returncode != 0:
        late = f" (killed after {timeout:g}s)" if proc.returncode < 0 else ""
        raise InfraError(f"{what} failed{late}: {last[:300]}")


# The image size check, from the manifest ECR holds.


def image_size(ecr: Any, image: str) -> int:
    """The bytes of `image` in ECR as its manifest gives them (config and layers, as stored:
    compressed); of its linux/arm64 image where it is an index of several."""
    manifest = _manifest(ecr, image, {"imageTag": image.rsplit(":", 1)[1]})
    if "manifests" in manifest:  # an index (buildx pushes one): its arm64 image
        arm = [
            m for m in manifest["manifests"] if m.get("platform", {}).get("architecture") == "arm64"
        ]
        if not arm:
            raise InfraError(f"image {image} has no {ARM64} image: AgentCore runs arm64 only")
        manifest = _manifest(ecr, image, {"imageDigest": arm[0]["digest"]})
    blobs = [manifest.get("config", {}), *manifest.get("layers", [])]
    return sum(int(blob.get("size", 0)) for blob in blobs)


def _manifest(ecr: Any, image: str, image_id: dict[str, str]) -> dict[str, Any]:
    found = CONTAINER_URI_RE.fullmatch(image)
    assert found is not None  # checked by `plan`
    with _aws(f"read image {image}"):
        got = ecr.batch_get_image(
            registryId=found[2],
            repositoryName=found[5],
            imageIds=[image_id],
            acceptedMediaTypes=_MANIFEST_TYPES,
        )
    if not got.get("images"):
        reason = next(iter(got.get("failures", [])), {}).get("failureCode", "ImageNotFound")
        raise InfraError(f"image {image} is not in ECR ({reason}): build and push it first")
    return dict(json.loads(got["images"][0]["imageManifest"]))


def check_sizes(ecr: Any, envs: Sequence[Environment]) -> dict[str, int]:
    """Each environment's image size; one `InfraError` line naming every image over
    AgentCore's limit and the tasks it serves."""
    sizes = {env.id: image_size(ecr, env.image) for env in envs}
    if over := [env for env in envs if sizes[env.id] > MAX_IMAGE_BYTES]:
        named = "; ".join(
            f"{env.image} is {sizes[env.id] / 1e9:.2f} GB (tasks {', '.join(env.task_names)})"
            for env in over
        )
        raise InfraError(f"over AgentCore's {MAX_IMAGE_BYTES / 1e9:g} GB image limit: {named}")
    return sizes


# The runtimes and the manifest.


def deploy_environments(
    envs: Sequence[Environment],
    template: RuntimeSpec,
    *,
    client: Any,
    iam: Any,
    ecr: Any,
    timeout_s: float = READY_TIMEOUT_S,
    poll_s: float = 5.0,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Create or update one runtime per environment, `WORKERS` at once, once every spec, image
    and the role have passed their checks: the manifest's entries of those READY, and one
    line for each that failed."""
    specs = [
        replace(
            template,
            name=env.runtime,
            container_uri=env.image,
            description=f"agentcore-rollout Harbor environment {env.id}",
        )
        for env in envs
    ]
    for spec in specs:
        spec.validate()
    sizes = check_sizes(ecr, envs)
    _check_role_exists(iam, template.role_arn)
    with ThreadPoolExecutor(max_workers=max(1, min(WORKERS, len(specs)))) as pool:
        futures = [
            pool.submit(
                deploy_runtime,
                spec,
                client=client,
                check_role=False,
                timeout_s=timeout_s,
                poll_s=poll_s,
            )
            for spec in specs
        ]
    made, failed = [], []
    for env, future in zip(envs, futures, strict=True):
        try:
            made.append(_entry(env, future.result(), sizes[env.id]))
        except InfraError as e:
            failed.append(str(e))
    return made, failed


def _entry(env: Environment, info: RuntimeInfo, size: int) -> dict[str, Any]:
    return {
        "environment": env.id,
        "runtime": info.name,
        "arn": info.arn,
        "image": env.image,
        "image_bytes": size,
        "tasks": env.task_names,
        "serves": "verifier" if env.verifier else "agent",
    }


def runtimes_config(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The `engine.runtimes` that sends each task's requests to its environment's runtime."""
    return {
        "engine": {
            "runtimes": [{"arn": e["arn"], "environment": e["environment"]} for e in entries]
        }
    }


def write_manifest(path: Path, entries: Sequence[dict[str, Any]], **about: Any) -> Path:
    """The manifest (JSON) at `path`, and its `engine.runtimes` snippet beside it (.yaml)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**about, "environments": list(entries)}, indent=2) + "\n")
    snippet = path.with_suffix(".yaml")
    snippet.write_text(yaml.safe_dump(runtimes_config(entries), sort_keys=False))
    return snippet


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """The manifest's environments, or a one-line `InfraError`."""
    try:
        entries = json.loads(path.read_text())["environments"]
        names = [str(e["runtime"]) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InfraError(f"{path}: not a manifest of `deploy --tasks` ({e})") from None
    for name in names:
        _check_name(name)
    return list(entries)


def destroy_manifest(path: Path, *, client: Any, poll_s: float = 5.0) -> list[str]:
    """Delete every runtime the manifest lists (those already gone are skipped); their names."""
    return [
        entry["runtime"]
        for entry in read_manifest(path)
        if destroy_runtime(entry["runtime"], client=client, missing_ok=True, poll_s=poll_s)
    ]


# The commands.


def harbor_command(args: argparse.Namespace) -> int:
    """`deploy --tasks` and `destroy --manifest`: one line on stderr; the snippet on stdout."""
    check_runtime_args(args)
    client = aws_client("bedrock-agentcore-control", args.region, args.endpoint_url)
    if args.command == "destroy":
        gone = destroy_manifest(Path(args.manifest), client=client)
        console.print(f"deleted {len(gone)} runtimes of {args.manifest}")
        return 0
    try:
        agent = agent_named(args.agent).name
        tasks = read_tasks(Path(args.tasks))
    except (TaskError, ValueError) as e:
        raise UsageError(str(e)) from None
    envs = plan(tasks, agent, args.repository, args.name or PREFIX)
    for warning in check_limits(envs, args.network):
        console.print(f"warning: {warning}", style="yellow", markup=False)
    region = client.meta.region_name
    iam, ecr = (aws_client(name, region, args.endpoint_url) for name in ("iam", "ecr"))
    if not args.no_build:
        from ..local.containers import container_engine

        build_and_push(envs, agent, container_engine(args.container_engine), ecr)
    with console.status(f"deploying {len(envs)} runtimes for {len(tasks)} tasks"):
        made, failed = deploy_environments(
            envs, runtime_spec(args), client=client, iam=iam, ecr=ecr, timeout_s=args.timeout
        )
    manifest = Path(args.manifest)
    snippet = write_manifest(manifest, made, agent=agent, region=region, tasks=str(args.tasks))
    if failed:
        raise InfraError(
            f"{len(failed)} of {len(envs)} runtimes failed ({manifest} lists the "
            f"{len(made)} made; destroy --manifest removes them): {failed[0]}"
        )
    console.print(f"{len(made)} runtimes for {len(tasks)} tasks: {manifest}, {snippet}")
    print(yaml.safe_dump(runtimes_config(made), sort_keys=False), end="", flush=True)
    return 0
