"""Harbor task folders, read as Harbor documents them (`instruction.md`, `task.toml`,
`environment/`, `tests/test.sh`, `solution/solve.sh`), each one dataset row.

`task.toml` is read with `tomllib` by Harbor's names and defaults: Harbor's own model needs
Python 3.12 (tests/test_harbor_schema.py checks this reader against it). Every key is honoured,
ignored or refused by name, as docs/harbor.md#tasktoml-key-by-key lists; a key the schema lacks
is refused too (Harbor would drop it unread)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..contract import VERIFIER_KEY

DEFAULT_TIMEOUT = 600.0  # Harbor's default for the agent, the verifier and the build, seconds
MAX_FILES_BYTES = 8 * 1024 * 1024
"""A task's tests and solution travel in its payload (AgentCore takes 100 MB; a result is
limited to 8 MiB by default): more than this is refused as a bad task."""
SCHEMA_VERSION = "1.4"  # the newest task.toml schema read here (Harbor 0.25.0's)
NETWORK_MODES = ("public", "no-network", "allowlist")
_HOST_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")  # Harbor's ${VAR}, ${VAR:-default}
_PACKAGE_NAME = r"[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*"
_ENVIRONMENT_KEYS = {
    *("build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "memory", "storage_mb"),
    *("storage", "gpus", "gpu_types", "tpu", "mcp_servers", "env", "skills_dir", "healthcheck"),
    *("workdir", "network_mode", "allowed_hosts", "allow_internet"),
}
_KEYS = {  # every key of Harbor's TaskConfig, by table (the tables refused whole apart)
    "": {
        *("version", "schema_version", "task", "metadata", "agent", "verifier", "environment"),
        *("solution", "source", "multi_step_reward_strategy", "steps", "artifacts"),
    },
    "[task]": {"name", "version", "description", "authors", "keywords"},
    "[agent]": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "[verifier]": {
        *("timeout_sec", "env", "user", "environment_mode", "environment", "collect"),
        *("network_mode", "allowed_hosts"),
    },
    "[environment]": _ENVIRONMENT_KEYS,
    "[solution]": {"env"},
    "artifacts": {"source", "destination", "exclude", "service"},
}
_ACCELERATORS = "no accelerator reaches a session here"
_REFUSED = {  # [environment] keys refused unless absent or one of these values, and why
    "gpus": ((0,), _ACCELERATORS),
    "gpu_types": (([],), _ACCELERATORS),
    "tpu": ((), _ACCELERATORS),
    "mcp_servers": (([],), "no agent here is wired to MCP servers"),
    "skills_dir": ((), "no agent here is given skills"),
    "healthcheck": ((), "no health check runs before the agent here"),
}


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
class Resources:
    """What a container is given: cpus, memory and disk (MB, None: no limit), network."""

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network_mode: str = "public"


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
    storage_mb: int | None = None
    network_mode: str = "public"
    """The agent's network: `public`, or `no-network` (the gateway is still reached, through
    the project's relay). `[agent] network_mode`, else `[environment]`'s (or
    `allow_internet = false`)."""
    workdir: str | None = None
    """Where commands run (`[environment] workdir`), else the image's WORKDIR."""
    environment_env: dict[str, str] = field(default_factory=dict)
    """`[environment] env`: variables set in the session, literal values only."""
    agent_user: str | None = None
    """The user (name or uid) the agent runs as; None: the image's USER."""
    verifier_user: str | None = None
    """The user the tests run as; None: the image's USER."""
    verifier_resources: Resources | None = None
    """A separate verifier's limits and network (None when shared)."""

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
    _check_links(folder, where)
    if (folder / "trajectory.json").exists():
        why = "is refused: seeding the agent with a prior context is not run here"
        raise TaskError(f"{where}: trajectory.json (Harbor's prior agent context) {why}")
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
    file under `environment/` (path, mode, bytes); and its limits and network. Tasks with one
    id share one image and one runtime."""
    digest = hashlib.sha256()
    if task.docker_image is not None:
        digest.update(b"image\0" + task.docker_image.encode())
    else:
        for f in _files(task.path / "environment"):
            digest.update(f"{f['path']}\0{f['mode']}\0".encode() + f["data"].encode() + b"\0")
    limits = Resources(task.cpus, task.memory_mb, task.storage_mb, task.network_mode)
    digest.update(repr(limits).encode())
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
        "verifier_user": task.verifier_user,
        "workdir": task.workdir,
        "environment_env": task.environment_env,
        "tests": _files(task.path / "tests"),
    }
    row: dict[str, Any] = {
        "id": task.name,
        "environment": task.environment,
        "instruction": task.instruction,
        "agent_timeout": task.agent_timeout,
        "verifier_timeout": task.verifier_timeout,  # the time the agent leaves for it
        "verifier_mode": task.verifier_mode,
        "agent_user": task.agent_user,
        "workdir": task.workdir,
        "environment_env": task.environment_env,
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
    _top_level(config)
    agent = _known(config.get("agent", {}), "[agent]")
    verifier = _known(config.get("verifier", {}), "[verifier]")
    solution = _known(config.get("solution", {}), "[solution]")
    env = _environment(config.get("environment", {}), "[environment]")
    mode = _verifier_mode(verifier)
    network = _network(agent, "[agent]", env["network_mode"])
    task = HarborTask(
        name=folder.name,
        path=folder,
        instruction=instruction,
        agent_timeout=_seconds(agent, "agent"),
        verifier_timeout=_seconds(verifier, "verifier"),
        build_timeout=env["build_timeout"],
        docker_image=env["docker_image"],
        cpus=env["cpus"],
        memory_mb=env["memory_mb"],
        storage_mb=env["storage_mb"],
        network_mode=network,
        workdir=env["workdir"],
        environment_env=env["env"],
        agent_user=_user(agent, "[agent]"),
        verifier_user=_user(verifier, "[verifier]"),
        verifier_env=_env(verifier, "[verifier]"),
        solution_env=_env(solution, "[solution]"),
        verifier_mode=mode,
        verifier_docker_image=_verifier_image(verifier),
        verifier_resources=_verifier_resources(verifier, mode, env, network),
        artifacts=_artifacts(config.get("artifacts", [])),
    )
    task = HarborTask(**{**vars(task), "environment": environment_id(task)})
    if task.verifier_mode == "separate":
        task = HarborTask(**{**vars(task), "verifier_environment": verifier_environment_id(task)})
    return task


def _top_level(config: dict[str, Any]) -> None:
    """The keys outside the tables a run uses: checked as Harbor checks them, then ignored
    (labels), or refused (`[[steps]]`, a schema newer than this reader's)."""
    _known(config, "")
    version = config.get("schema_version", config.get("version", SCHEMA_VERSION))
    found = re.fullmatch(r"(\d+)\.(\d+)", version) if isinstance(version, str) else None
    if found is None:
        raise ValueError(f"schema_version must be a string like '1.4', not {version!r}")
    if (int(found[1]), int(found[2])) > (1, 4):
        raise _refused("", "schema_version", version, "newer than 1.4, the newest read here")
    if config.get("steps"):
        raise _refused("", "[[steps]]", config["steps"], "multi-step tasks are not run yet")
    strategy = config.get("multi_step_reward_strategy", "mean")
    if strategy not in ("mean", "final"):
        raise ValueError(f"multi_step_reward_strategy must be mean or final, not {strategy!r}")
    if not isinstance(config.get("metadata", {}), dict):
        raise ValueError("[metadata] must be a table")
    if not isinstance(config.get("source", ""), str):
        raise ValueError(f"source must be a string, not {config['source']!r}")
    if "task" in config:
        name = _known(config["task"], "[task]").get("name")
        if not isinstance(name, str) or not re.fullmatch(_PACKAGE_NAME, name) or ".." in name:
            raise ValueError(f"[task] name must be a package name like 'org/name', not {name!r}")


def _known(table: Any, where: str, keys: str | None = None) -> dict[str, Any]:
    """`table`, when every key of it is one Harbor's schema has there (`_KEYS[keys or
    where]`); a key it lacks is refused, since Harbor would drop it unread."""
    if not isinstance(table, dict):
        raise ValueError(f"{where or 'task.toml'} must be a table, not {_shown(table)}")
    if unknown := sorted(set(table) - _KEYS[keys or where]):
        why = "not a key of Harbor's task schema (which drops it unread)"
        raise _refused(where, unknown[0], table[unknown[0]], why)
    return table


def _refused(where: str, key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{where} {key} = {_shown(value)} is refused: {why}".lstrip())


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _environment(table: Any, where: str) -> dict[str, Any]:
    """An `[environment]` table (or `[verifier.environment]`): what is honoured, by name;
    what cannot be carried out here refused."""
    env = _known(table, where, "[environment]")
    for key, (allowed, why) in _REFUSED.items():
        if key in env and env[key] not in allowed:
            raise _refused(where, key, env[key], why)
    if str(env.get("os", "linux")).lower() != "linux":
        raise _refused(where, "os", env["os"], "only Linux containers run here")
    return {
        "docker_image": _string(env, where, "docker_image"),
        "build_timeout": _seconds(env, where.strip("[]"), "build_timeout_sec"),
        "cpus": _cpus(env, where),
        "memory_mb": _size_mb(env, where, "memory"),
        "storage_mb": _size_mb(env, where, "storage"),
        "network_mode": _network(env, where, _allow_internet(env, where)),
        "workdir": _string(env, where, "workdir"),
        "env": _env(env, where),
    }


def _string(table: dict[str, Any], where: str, key: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where} {key} must be a string, not {_shown(value)}")
    return value or None


def _cpus(env: dict[str, Any], where: str) -> float | None:
    cpus = env.get("cpus")
    if cpus is None:
        return None
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0 < cpus < math.inf:
        raise ValueError(f"{where} cpus must be a positive number, not {cpus!r}")
    return float(cpus)


def _size_mb(env: dict[str, Any], where: str, key: str) -> int | None:
    """`memory_mb = 2048`, or the older `memory = "4G"` / `"512M"` (as Harbor reads it; the
    two must agree when both are given). Likewise `storage_mb` and `storage`."""
    mb = env.get(f"{key}_mb")
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb <= 0):
        raise ValueError(f"{where} {key}_mb must be a positive whole number, not {mb!r}")
    if key not in env:
        return mb
    size = env[key]
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GMK])\s*", str(size).upper())
    if not isinstance(size, str) or found is None:
        raise ValueError(f"{where} {key} {size!r} is not like '4G' or '512M'")
    parsed = int(float(found[1]) * {"G": 1024, "M": 1, "K": 1 / 1024}[found[2]])
    if mb is not None and mb != parsed:
        raise ValueError(f"{where} {key} {size!r} is {parsed} MB, not {key}_mb = {mb}")
    return parsed


def _allow_internet(env: dict[str, Any], where: str) -> str:
    """The baseline network before `network_mode`: the deprecated `allow_internet`, which
    Harbor reads only when neither `network_mode` nor `allowed_hosts` is given."""
    allow = env.get("allow_internet", True)
    if not isinstance(allow, bool):
        raise ValueError(f"{where} allow_internet must be true or false, not {allow!r}")
    return "public" if allow or "allowed_hosts" in env else "no-network"


def _network(table: dict[str, Any], where: str, default: str) -> str:
    """The phase's network: its `network_mode`, else `default`. An allowlist is refused: no
    local container can hold an agent to a list of hosts."""
    mode = table.get("network_mode", default)
    if mode not in NETWORK_MODES:
        raise ValueError(f"{where} network_mode must be one of {', '.join(NETWORK_MODES)}")
    if mode == "allowlist":
        raise _refused(where, "network_mode", mode, "an allowlist cannot be enforced here")
    if table.get("allowed_hosts"):
        why = "only an allowlist has hosts, and an allowlist cannot be enforced here"
        raise _refused(where, "allowed_hosts", table["allowed_hosts"], why)
    return str(mode)


def _user(table: dict[str, Any], where: str) -> str | None:
    user = table.get("user")
    if user is not None and (isinstance(user, bool) or not isinstance(user, str | int)):
        raise ValueError(f"{where} user must be a user name or a uid, not {_shown(user)}")
    return None if user is None or user == "" else str(user)


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
    own = _known(verifier.get("environment", {}), "[verifier.environment]", "[environment]")
    return _string(own, "[verifier.environment]", "docker_image")


def _verifier_resources(
    verifier: dict[str, Any], mode: str, env: dict[str, Any], agent_network: str
) -> Resources | None:
    """A separate verifier's limits: its `[verifier.environment]`'s, else (as Harbor copies
    it) the task's `[environment]`'s; its network, `[verifier] network_mode` or that
    environment's. A shared verifier has the agent's session, so one network for both."""
    if verifier.get("collect"):
        why = "no collect command runs between the agent and the verifier here"
        raise _refused("[verifier]", "collect", verifier["collect"], why)
    if mode == "shared":
        network = _network(verifier, "[verifier]", env["network_mode"])
        if network != agent_network:
            why = f"the phases differ ({agent_network}, then {network}): a shared session has one"
            if "network_mode" in verifier:
                raise _refused("[verifier]", "network_mode", network, why)
            raise _refused("[agent]", "network_mode", agent_network, why)
        return None
    own = env
    if "environment" in verifier:
        own = _environment(verifier["environment"], "[verifier.environment]")
        for key in ("env", "workdir"):
            if own[key]:
                why = "not carried to a separate verifier's session yet"
                raise _refused("[verifier.environment]", key, own[key], why)
    network = _network(verifier, "[verifier]", own["network_mode"])
    return Resources(own["cpus"], own["memory_mb"], own["storage_mb"], network)


def _artifacts(entries: Any) -> tuple[Artifact, ...]:
    if not isinstance(entries, list):
        raise ValueError("artifacts must be a list of paths or {source, destination, exclude}")
    found = []
    for entry in entries:
        if isinstance(entry, str):
            entry = {"source": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
            raise ValueError(f"artifacts entry {entry!r}: a path or a table with a source")
        _known(entry, "artifacts entry", "artifacts")
        if entry.get("service") not in (None, "main"):
            why = "only the agent's own container (main) is collected here"
            raise _refused("artifacts entry", "service", entry["service"], why)
        if ".." in Path(entry["source"]).parts:
            raise ValueError(f"artifacts entry {entry['source']!r}: no '..' in a source")
        exclude = entry.get("exclude", [])
        if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
            raise ValueError(f"artifacts entry {entry['source']!r}: exclude is a list of patterns")
        destination = _destination(entry.get("destination"))
        found.append(Artifact(entry["source"], destination, tuple(exclude)))
    return tuple(found)


def _destination(value: Any) -> str | None:
    """As Harbor checks it: a relative path, no '..', not the manifest's name."""
    if value is None or value == "":
        return None
    path = PurePosixPath(value) if isinstance(value, str) else None
    if path is None or "\\" in value or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"artifacts destination {_shown(value)}: a relative path, no '..'")
    if value.rstrip("/") == "manifest.json":
        raise ValueError("artifacts destination 'manifest.json' is Harbor's manifest")
    return value


def verifier_environment_id(task: HarborTask) -> str:
    """The separate verifier's environment as a short id: its `docker_image`, or a hash of
    its build folder (`HarborTask.verifier_context`), and its limits."""
    digest = hashlib.sha256(b"verifier\0")
    if task.verifier_docker_image is not None:
        digest.update(b"image\0" + task.verifier_docker_image.encode())
    else:
        for f in _files(task.verifier_context):
            digest.update(f"{f['path']}\0{f['mode']}\0".encode() + f["data"].encode() + b"\0")
    digest.update(repr(task.verifier_resources).encode())
    return digest.hexdigest()[:16]


def _seconds(section: dict[str, Any], name: str, key: str = "timeout_sec") -> float:
    value = section.get(key, DEFAULT_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"[{name}] {key} must be a positive number of seconds, not {value!r}")
    return float(value)


def _env(section: dict[str, Any], where: str) -> dict[str, str]:
    """A table of variables, each a string (as Harbor has it); a whole-value `${VAR}` or
    `${VAR:-default}` template, which Harbor fills from the host's environment, is refused:
    a downloaded task must not pull the user's variables (secrets) into its session."""
    env = section.get("env", {})
    if not isinstance(env, dict):
        raise ValueError(f"{where} env must be a table of names and values")
    for name, value in env.items():
        if not isinstance(value, str):
            raise ValueError(f"{where} env {name} must be a string, not {_shown(value)}")
        if _HOST_TEMPLATE.fullmatch(value):
            why = "it would pull a variable from the host's environment"
            raise _refused(where, f"env.{name}", value, why)
    return dict(env)


def _text(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{where}: no {path.name}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{where}: cannot read {path.name} ({e})") from None


def _files(folder: Path) -> list[dict[str, Any]]:
    """Every file under `folder` (none if it is absent), sorted by path: path, mode, bytes
    (base64). A symlink (which `_check_links` let through: one to a file of the task's own)
    is carried as its target's content; links to folders are not followed."""
    if not folder.is_dir():
        return []
    found = []
    for top, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        found += [Path(top) / n for n in names if (Path(top) / n).is_file()]
    return [
        {
            "path": p.relative_to(folder).as_posix(),
            "mode": p.stat().st_mode & 0o777,
            "data": base64.b64encode(p.read_bytes()).decode(),
        }
        for p in sorted(found)
    ]


def _check_links(folder: Path, where: str) -> None:
    """A task folder is data: a symlink whose target leaves it, or a link to a folder, or a
    regular file with another name (a hard link, `st_nlink` > 1, whose other name may be
    anywhere), is refused, naming it. A symlink to a file of the task's own is carried as that
    file's content."""
    root = folder.resolve()
    for top, dirs, names in os.walk(folder):
        for name in [*dirs, *names]:
            path = Path(top) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = path.resolve()
                except (OSError, RuntimeError):  # a loop
                    target = root
                if root not in target.parents or not target.is_file():
                    shown = os.readlink(path)
                    why = (
                        "leaves the task's folder"
                        if root not in target.parents
                        else ("is not a file of the task's")
                    )
                    raise TaskError(
                        f"{where}: {path.relative_to(folder)} is a symlink to {shown}, which "
                        f"{why}: refused (a task folder is data)"
                    )
            elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                raise TaskError(
                    f"{where}: {path.relative_to(folder)} is a hard link ({info.st_nlink} names): "
                    "refused (its other names may be outside the task's folder)"
                )


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
