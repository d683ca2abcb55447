"""Harbor task folders, read as Harbor documents them: `instruction.md`, `task.toml`,
`environment/` (a Dockerfile and its context), `tests/test.sh` and an optional
`solution/solve.sh`.

`task.toml` is read with `tomllib`: Harbor's own task model (the `harbor` package) needs
Python 3.12 and is not on PyPI under that name, so its fields are read here, by Harbor's names
and defaults (`[agent] timeout_sec`, `[verifier] timeout_sec` and `env`, `[environment]
build_timeout_sec`, `docker_image`, `cpus`, `memory_mb` or `memory = "4G"`); keys it does not
use are ignored, as Harbor ignores them.

A task becomes one dataset row (`task_payload`): its instruction, timeouts, environment id,
and its tests and solution as files, which the agent wrapper writes into the session only
when it needs them (the tests after the agent has finished), so nothing of them is in the
environment while the agent works. Tasks whose environments are the same (byte for byte, or
the same `docker_image`) share one image and one runtime (`environment_id`)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import VERIFIER_KEY

DEFAULT_TIMEOUT = 600.0  # Harbor's default for the agent, the verifier and the build, seconds
MAX_FILES_BYTES = 8 * 1024 * 1024
"""A task's tests and solution travel in its payload (AgentCore takes 100 MB; a result is
limited to 8 MiB by default): more than this is refused as a bad task."""


class TaskError(ValueError):
    """Bad tasks: one line per task, each naming its folder and what is wrong."""


@dataclass(frozen=True)
class Artifact:
    """A path the agent's environment hands to a separate verifier's (`artifacts`): put at
    `destination` (default: the same path) there; `exclude`: tar patterns left out."""

    source: str
    destination: str | None = None
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarborTask:
    """One task folder, read and checked."""

    name: str
    path: Path
    instruction: str
    agent_timeout: float = DEFAULT_TIMEOUT
    verifier_timeout: float = DEFAULT_TIMEOUT
    build_timeout: float = DEFAULT_TIMEOUT
    docker_image: str | None = None
    """A prebuilt image the task runs in, instead of building `environment/`."""
    cpus: float | None = None
    memory_mb: int | None = None
    verifier_env: dict[str, str] = field(default_factory=dict)
    solution_env: dict[str, str] = field(default_factory=dict)
    environment: str = ""
    """Its environment's id (`environment_id`): one image and one runtime per distinct id."""
    verifier_mode: str = "shared"
    """`shared`: the tests run in the agent's session once it is gone; `separate`: in a
    session of the verifier's own environment, which receives `artifacts`."""
    verifier_docker_image: str | None = None
    verifier_environment: str = ""
    """The verifier's environment id when `separate` ("" when shared)."""
    artifacts: tuple[Artifact, ...] = ()

    @property
    def dockerfile(self) -> Path:
        return self.path / "environment" / "Dockerfile"

    @property
    def verifier_context(self) -> Path:
        """The folder the separate verifier's image is built from: `tests/` when it holds a
        Dockerfile (the tests are then in the image, as Harbor bundles them), else the
        task's `environment/`."""
        tests = self.path / "tests"
        return tests if (tests / "Dockerfile").is_file() else self.path / "environment"


def read_tasks(path: Path) -> list[HarborTask]:
    """The tasks at `path`: a folder of task folders, one task folder, or a JSONL file whose
    rows name task folders (`{"harbor_task": "relative/or/absolute/dir"}`). Every bad task is
    named in one `TaskError`, one line each, before anything starts."""
    tasks, bad = [], []
    for folder in _task_folders(path):
        try:
            tasks.append(read_task(folder))
        except TaskError as e:
            bad.append(str(e))
    if bad:
        raise TaskError("\n".join(bad))
    if not tasks:
        raise TaskError(f"{path}: no Harbor task folders (each needs instruction.md)")
    names = [t.name for t in tasks]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise TaskError(f"{path}: task names must be unique, {', '.join(twice)} repeat")
    return tasks


def is_task_source(path: Path) -> bool:
    """`path` names Harbor tasks (a folder, or a JSONL of `harbor_task` rows), not a JSONL of
    payloads."""
    if path.is_dir():
        return True
    try:
        with path.open("rb") as lines:
            first = next((line for line in lines if line.strip()), b"")
        return "harbor_task" in json.loads(first)
    except (OSError, ValueError, TypeError):
        return False


def read_task(folder: Path) -> HarborTask:
    """One task folder, or a `TaskError` saying (in one line) what is wrong with it."""
    where = str(folder)
    if not folder.is_dir():
        raise TaskError(f"{where}: not a folder")
    instruction = _text(folder / "instruction.md", where)
    if not instruction.strip():
        raise TaskError(f"{where}: instruction.md is empty")
    if not (folder / "tests" / "test.sh").is_file():
        raise TaskError(f"{where}: no tests/test.sh (the verifier)")
    try:
        config = tomllib.loads(_text(folder / "task.toml", where))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{where}: task.toml is not valid TOML ({e})") from None
    try:
        task = _from_config(folder, instruction, config)
    except (TypeError, ValueError) as e:
        raise TaskError(f"{where}: task.toml: {e}") from None
    if task.docker_image is None and not task.dockerfile.is_file():
        raise TaskError(f"{where}: no environment/Dockerfile and no [environment] docker_image")
    size = sum(
        len(f["data"]) * 3 // 4 for f in _files(folder / "tests") + _files(folder / "solution")
    )
    if size > MAX_FILES_BYTES:
        raise TaskError(f"{where}: tests and solution are over {MAX_FILES_BYTES >> 20} MiB")
    return task


def environment_id(task: HarborTask) -> str:
    """What the task's environment is, as a short id: its `docker_image`, or a hash of every
    file under `environment/` (path, mode, bytes). Tasks with one id share one image."""
    digest = hashlib.sha256()
    if task.docker_image is not None:
        digest.update(b"image\0" + task.docker_image.encode())
    else:
        for f in _files(task.path / "environment"):
            digest.update(f"{f['path']}\0{f['mode']}\0".encode() + f["data"].encode() + b"\0")
    return digest.hexdigest()[:16]


def task_payload(task: HarborTask, *, solution: bool = False) -> dict[str, Any]:
    """The dataset row of one task. The agent's session gets the instruction, its limits and,
    with `solution` (the `oracle` agent alone), the solution; the tests are only in the
    verifier's payload (`contract.VERIFIER_KEY`), which the engine invokes once the agent's
    session ended: in that session again (shared), or in a session of the verifier's own
    environment (separate), which receives the task's `artifacts`."""
    verifier: dict[str, Any] = {
        "id": task.name,
        "phase": "verify",
        "verifier_timeout": task.verifier_timeout,
        "verifier_env": task.verifier_env,
        "tests": _files(task.path / "tests"),
    }
    row: dict[str, Any] = {
        "id": task.name,
        "environment": task.environment,
        "instruction": task.instruction,
        "agent_timeout": task.agent_timeout,
        "verifier_timeout": task.verifier_timeout,  # the time the agent leaves for it
        "verifier_mode": task.verifier_mode,
        "solution_env": task.solution_env if solution else {},
        "solution": _files(task.path / "solution") if solution else [],
    }
    if task.verifier_mode == "separate":
        handed = [
            {"source": a.source, "destination": a.destination, "exclude": list(a.exclude)}
            for a in task.artifacts
        ]
        row["artifacts"] = verifier["artifacts"] = handed
        verifier["environment"] = task.verifier_environment
    return row | {VERIFIER_KEY: verifier}


def write_files(files: list[dict[str, Any]], into: Path) -> None:
    """Write `files` (as `task_payload` carries them) under `into`, modes kept."""
    for f in files:
        target = into / f["path"]
        if into.resolve() not in target.resolve().parents:
            raise ValueError(f"file path {f['path']!r} leaves {into}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(f["data"]))
        target.chmod(f["mode"])


def _from_config(folder: Path, instruction: str, config: dict[str, Any]) -> HarborTask:
    agent, verifier = config.get("agent", {}), config.get("verifier", {})
    env, solution = config.get("environment", {}), config.get("solution", {})
    image = env.get("docker_image")
    task = HarborTask(
        name=folder.name,
        path=folder,
        instruction=instruction,
        agent_timeout=_seconds(agent, "agent"),
        verifier_timeout=_seconds(verifier, "verifier"),
        build_timeout=_seconds(env, "environment", "build_timeout_sec"),
        docker_image=str(image) if image else None,
        cpus=float(env["cpus"]) if "cpus" in env else None,
        memory_mb=_memory_mb(env),
        verifier_env=_env(verifier, "verifier"),
        solution_env=_env(solution, "solution"),
        verifier_mode=_verifier_mode(verifier),
        verifier_docker_image=_verifier_image(verifier),
        artifacts=_artifacts(config.get("artifacts", [])),
    )
    task = HarborTask(**{**vars(task), "environment": environment_id(task)})
    if task.verifier_mode == "separate":
        task = HarborTask(**{**vars(task), "verifier_environment": verifier_environment_id(task)})
    return task


def _verifier_mode(verifier: dict[str, Any]) -> str:
    """As Harbor's `verifier_mode.py` resolves it: explicit, else `separate` when a
    `[verifier.environment]` is given, else `shared`."""
    mode = verifier.get("environment_mode")
    if mode is None:
        return "separate" if "environment" in verifier else "shared"
    if mode not in ("shared", "separate"):
        raise ValueError(f"[verifier] environment_mode must be shared or separate, not {mode!r}")
    if mode == "shared" and "environment" in verifier:
        raise ValueError("[verifier] environment_mode = 'shared' with a [verifier.environment]")
    return str(mode)


def _verifier_image(verifier: dict[str, Any]) -> str | None:
    image = (verifier.get("environment") or {}).get("docker_image")
    return str(image) if image else None


def _artifacts(entries: Any) -> tuple[Artifact, ...]:
    if not isinstance(entries, list):
        raise ValueError("artifacts must be a list of paths or {source, destination, exclude}")
    found = []
    for entry in entries:
        if isinstance(entry, str):
            entry = {"source": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            raise ValueError(f"artifacts entry {entry!r}: a path or a table with a source")
        if ".." in Path(entry["source"]).parts:
            raise ValueError(f"artifacts entry {entry['source']!r}: no '..' in a source")
        exclude = entry.get("exclude", [])
        found.append(Artifact(entry["source"], entry.get("destination"), tuple(exclude)))
    return tuple(found)


def verifier_environment_id(task: HarborTask) -> str:
    """The separate verifier's environment as a short id: its `docker_image`, or a hash of
    its build folder (`HarborTask.verifier_context`)."""
    digest = hashlib.sha256(b"verifier\0")
    if task.verifier_docker_image is not None:
        digest.update(b"image\0" + task.verifier_docker_image.encode())
    else:
        for f in _files(task.verifier_context):
            digest.update(f"{f['path']}\0{f['mode']}\0".encode() + f["data"].encode() + b"\0")
    return digest.hexdigest()[:16]


def _seconds(section: dict[str, Any], name: str, key: str = "timeout_sec") -> float:
    value = section.get(key, DEFAULT_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"[{name}] {key} must be a positive number of seconds, not {value!r}")
    return float(value)


def _memory_mb(env: dict[str, Any]) -> int | None:
    """`memory_mb = 2048`, or the older `memory = "4G"` / `"512M"`."""
    if "memory_mb" in env:
        return int(env["memory_mb"])
    if "memory" not in env:
        return None
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GMK])i?B?\s*", str(env["memory"]).upper())
    if found is None:
        raise ValueError(f"[environment] memory {env['memory']!r} is not like '4G' or '512M'")
    return int(float(found[1]) * {"G": 1024, "M": 1, "K": 1 / 1024}[found[2]])


def _env(section: dict[str, Any], name: str) -> dict[str, str]:
    env = section.get("env", {})
    if not isinstance(env, dict):
        raise ValueError(f"[{name}] env must be a table of names and values")
    return {str(k): str(v) for k, v in env.items()}


def _text(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{where}: no {path.name}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{where}: cannot read {path.name} ({e})") from None


def _files(folder: Path) -> list[dict[str, Any]]:
    """Every file under `folder` (none if it is absent), sorted by path: path, mode, bytes
    (base64)."""
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.rglob("*") if p.is_file())
    return [
        {
            "path": p.relative_to(folder).as_posix(),
            "mode": p.stat().st_mode & 0o777,
            "data": base64.b64encode(p.read_bytes()).decode(),
        }
        for p in found
    ]


def _task_folders(path: Path) -> Iterator[Path]:
    if path.is_dir():
        if (path / "instruction.md").exists() or (path / "task.toml").exists():
            yield path  # one task
            return
        yield from sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        return
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read it ({e})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            named = json.loads(line)["harbor_task"]
        except (ValueError, TypeError, KeyError):
            raise TaskError(f'{path}:{number}: expected {{"harbor_task": "DIR"}}') from None
        yield Path(os.path.join(path.parent, str(named)))
