"""`harbor/tasks.py` against Harbor's own task model (`harbor` at the Makefile's
HARBOR_VERSION, `TaskConfig`): every key Harbor's model has, found by walking it, is in
docs/harbor.md's key-by-key table, and the table names no key Harbor lacks; the keys tasks.py
knows, table by table, are Harbor's; and every example task, and each variant below, reads the
same both ways (or is rejected both ways).

Harbor needs Python >= 3.12, so it runs in a venv of its own: `.clients/venv-harbor`, which
`make clients` installs (then its absence fails the test). Without it, the test makes it
there from a Python >= 3.12 in ~/.pyenv/versions or python3.12 on the PATH, and skips, saying
so, only when there is none. AGENTCORE_ROLLOUT_HARBOR_PYTHON names another python that has
Harbor."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout.harbor import tasks
from agentcore_rollout.harbor.tasks import TaskError, read_task

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / ".clients"
VENV = CLIENTS / "venv-harbor"
EXAMPLES = ROOT / "examples" / "harbor_tasks"
LEGACY = {"version", "environment.memory", "environment.storage"}
"""Keys Harbor's validators take before its model sees them (the older spellings)."""

# Run in Harbor's venv: its keys (walking TaskConfig), or each task folder as Harbor reads it.
HARBOR_SIDE = r"""
import json, sys, typing, warnings
from pydantic import BaseModel
from harbor.models.task.config import TaskConfig
from harbor.models.task.verifier_mode import (
    resolve_effective_verifier_env_config, resolve_task_verifier_mode,
)
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, VerifierConfig
from harbor.trial.network_policy import resolve_trial_network_plan

warnings.simplefilter("ignore")


def models_in(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from models_in(arg)


def keys(model, prefix=""):
    hints = typing.get_type_hints(model, vars(sys.modules[model.__module__]))
    for name in model.model_fields:
        yield prefix + name
        for sub in models_in(hints[name]):
            yield from keys(sub, prefix + name + ".")


def read(folder):
    try:
        with open(folder + "/task.toml") as f:
            c = TaskConfig.model_validate_toml(f.read())
    except Exception as e:
        return {"error": str(e).splitlines()[0]}
    env, ver = c.environment, c.verifier
    arts = [a if isinstance(a, str) else a.model_dump() for a in c.artifacts]
    mode = resolve_task_verifier_mode(c)
    plan = resolve_trial_network_plan(
        c, AgentConfig(), EnvironmentConfig(), VerifierConfig(), None, verifier_mode=mode
    )
    own = resolve_effective_verifier_env_config(c, None)
    limits = own and [own.cpus, own.memory_mb, own.storage_mb]
    return {
        "agent_timeout": c.agent.timeout_sec,
        "verifier_timeout": ver.timeout_sec,
        "build_timeout": env.build_timeout_sec,
        "docker_image": env.docker_image,
        "cpus": env.cpus,
        "memory_mb": env.memory_mb,
        "storage_mb": env.storage_mb,
        "network_mode": plan.agent_phase.network_mode.value,
        "verifier_network": plan.verifier_phase.network_mode.value,
        "verifier_resources": limits and [*limits, plan.verifier_phase.network_mode.value],
        "workdir": env.workdir,
        "environment_env": env.env,
        "agent_user": c.agent.user,
        "verifier_user": ver.user,
        "verifier_env": ver.env,
        "solution_env": c.solution.env,
        "verifier_mode": mode.value,
        "verifier_docker_image": ver.environment and ver.environment.docker_image,
        "artifacts": [{"source": a} if isinstance(a, str) else a for a in arts],
    }


ask = json.load(sys.stdin)
if ask == "keys":
    print(json.dumps(list(keys(TaskConfig))))
else:
    print(json.dumps({folder: read(folder) for folder in ask}))
"""

VARIANTS = {  # task.toml both read, to the same fields
    "defaults": "",
    "older-forms": (
        'version = "1.0"\n[environment]\ncpus = 2\nmemory = "4G"\nstorage = "10G"\n'
        "build_timeout_sec = 90\nallow_internet = false\n"
    ),
    "both-memories": '[environment]\nmemory = "512M"\nmemory_mb = 512\n',
    "network": (
        '[environment]\nnetwork_mode = "no-network"\nallowed_hosts = []\n'
        '[agent]\nnetwork_mode = "no-network"\n'
    ),
    "allow-internet-under-network-mode": (
        '[environment]\nallow_internet = false\nnetwork_mode = "public"\n'
    ),
    "image-and-fraction": '[environment]\ndocker_image = "ghcr.io/x/y:1"\ncpus = 0.5\n',
    "users-env-workdir": (
        '[agent]\nuser = "agent"\ntimeout_sec = 30\n[verifier]\nuser = 1000\n'
        'env = { A = "1", B = "$5" }\n[solution]\nenv = { S = "x" }\n'
        '[environment]\nworkdir = "/app"\nenv = { MODE = "${A}/b", K = "v" }\n'
    ),
    "separate-with-artifacts": (
        'artifacts = ["/app/out", { source = "/logs", destination = "l", exclude = ["*.tmp"] }]\n'
        '[verifier]\nenvironment_mode = "separate"\n'
    ),
    "verifier-environment-implies-separate": (
        '[verifier.environment]\ndocker_image = "ghcr.io/x/v:1"\ncpus = 1\nstorage = "2G"\n'
        "allow_internet = false\n"
    ),
    "separate-verifier-copies-the-environment": (
        '[environment]\ncpus = 4\nmemory = "1G"\nnetwork_mode = "no-network"\n'
        '[verifier]\nenvironment_mode = "separate"\nnetwork_mode = "public"\n'
    ),
    "verifier-phase-as-the-agents": (
        '[environment]\nallow_internet = false\n[verifier]\nnetwork_mode = "no-network"\n'
    ),
    "labels": (
        'schema_version = "1.4"\nsource = "x"\nmulti_step_reward_strategy = "final"\n'
        '[task]\nname = "org/x"\nversion = "2"\nauthors = [{ name = "A" }]\n'
        '[metadata]\ndifficulty = "hard"\n'
    ),
}

REJECTED = {  # task.toml Harbor's model rejects: a bad task here too
    "float-version": "version = 1.0\n",
    "network-mode": '[environment]\nnetwork_mode = "offline"\n',
    "env-number": "[verifier]\nenv = { LEVEL = 3 }\n",
    "package-name": '[task]\nname = "no-org"\n',
    "memories-disagree": '[environment]\nmemory = "4G"\nmemory_mb = 1024\n',
    "size-unit": '[environment]\nstorage = "10GB"\n',
    "shared-with-environment": '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\n',
    "strategy": 'multi_step_reward_strategy = "max"\n',
    "absolute-destination": 'artifacts = [{ source = "/x", destination = "/abs" }]\n',
    "hosts-without-allowlist": '[agent]\nallowed_hosts = ["x.org"]\n',
}


def _pinned() -> str:
    found = re.search(r"^HARBOR_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile pins no HARBOR_VERSION"
    return found.group(1)


def _python312() -> str | None:
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.1[2-9]*/bin/python3"))
    return str(pyenv[0]) if pyenv else shutil.which("python3.12")


@pytest.fixture(scope="module")
def harbor_python() -> str:
    """A python with Harbor at the pinned version (made in .clients/venv-harbor if need be)."""
    if named := os.environ.get("AGENTCORE_ROLLOUT_HARBOR_PYTHON"):
        return named
    python = VENV / "bin" / "python"
    if not python.exists() and (CLIENTS / ".installed").exists():
        pytest.fail(f"{python.relative_to(ROOT)} is missing: `make clients` installs it")
    if not python.exists():
        base = _python312() or pytest.skip("Harbor needs Python >= 3.12: none found")
        CLIENTS.mkdir(exist_ok=True)
        with (CLIENTS / "venv-harbor.lock").open("w") as lock:  # one maker, if xdist splits
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not python.exists():
                subprocess.run([base, "-m", "venv", str(VENV)], check=True, timeout=300)
                pip = [str(python), "-m", "pip", "install", "--quiet"]
                subprocess.run([*pip, f"harbor=={_pinned()}"], check=True, timeout=900)
    script = "import importlib.metadata as m; print(m.version('harbor'))"
    printed = subprocess.run([python, "-c", script], capture_output=True, text=True).stdout
    if printed.strip() != _pinned():
        pytest.fail(f"{python} has harbor {printed.strip()!r}, not {_pinned()}: `make clients`")
    return str(python)


def _harbor(python: str, ask: Any) -> Any:
    done = subprocess.run(
        [python, "-c", HARBOR_SIDE], input=json.dumps(ask), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _documented() -> dict[str, str]:
    """docs/harbor.md's key-by-key table: key -> decision."""
    page = (ROOT / "docs" / "harbor.md").read_text()
    section = page.split("## task.toml, key by key", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| [^|]+ \| (\w+) \|", section, re.M)
    assert len(rows) == len(dict(rows)), "a key twice in the table"
    assert {d for _, d in rows} <= {"honoured", "read", "ignored", "refused"}
    return dict(rows)


def _covered(key: str, table: dict[str, str]) -> bool:
    """`key` has a row, or is a table whose keys have rows, or is under a key whose row says
    `.*` (its keys decided alike), or under one ignored or refused whole."""
    parts = key.split(".")
    ancestors = [".".join(parts[:n]) for n in range(1, len(parts))]
    return (
        key in table
        or any(row.startswith(f"{key}.") for row in table)
        or any(f"{a}.*" in table or table.get(a) in ("ignored", "refused") for a in ancestors)
    )


def test_every_key_of_harbors_model_is_in_the_docs_table_and_no_other(harbor_python):
    harbor = set(_harbor(harbor_python, "keys"))
    table = _documented()
    assert [k for k in sorted(harbor) if not _covered(k, table)] == []
    named = {k.removesuffix(".*") for k in table}
    assert sorted(named - harbor - LEGACY) == []


def test_the_keys_tasks_py_knows_are_harbors_table_by_table(harbor_python):
    harbor = set(_harbor(harbor_python, "keys")) | LEGACY

    def under(prefix: str) -> set[str]:
        return {
            k[len(prefix) :] for k in harbor if k.startswith(prefix) and "." not in k[len(prefix) :]
        }

    assert tasks._KEYS[""] == under("")
    for table in ("task", "agent", "verifier", "environment", "solution"):
        assert tasks._KEYS[f"[{table}]"] == under(f"{table}."), table
    assert tasks._KEYS["artifacts"] == under("artifacts.")
    assert under("verifier.environment.") == under("environment.") - {"memory", "storage"}


def _folder(root: Path, name: str, toml: str) -> Path:
    for path, text in {
        "instruction.md": "Do it.\n",
        "task.toml": toml,
        "environment/Dockerfile": "FROM python:3.12-slim\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    }.items():
        (root / name / path).parent.mkdir(parents=True, exist_ok=True)
        (root / name / path).write_text(text)
    return root / name


_FIELDS = [
    *("agent_timeout", "verifier_timeout", "build_timeout", "docker_image", "cpus"),
    *("memory_mb", "storage_mb", "network_mode", "workdir", "environment_env", "agent_user"),
    *("verifier_user", "verifier_env", "solution_env", "verifier_mode", "verifier_docker_image"),
]


def _ours(folder: Path) -> dict[str, Any]:
    """Our reading in Harbor's terms (a shared verifier has the agent's network here)."""
    task = read_task(folder)
    resources = task.verifier_resources
    return {
        **{k: getattr(task, k) for k in _FIELDS},
        "verifier_network": resources.network_mode if resources else task.network_mode,
        "verifier_resources": resources and [*vars(resources).values()],
        "artifacts": [vars(a) for a in task.artifacts],
    }


def test_every_example_and_variant_reads_the_same_both_ways(harbor_python, tmp_path):
    folders = sorted(p for p in EXAMPLES.iterdir() if (p / "task.toml").is_file())
    assert len(folders) >= 4
    folders += [_folder(tmp_path, name, toml) for name, toml in VARIANTS.items()]
    harbor = _harbor(harbor_python, [str(f) for f in folders])
    for folder in folders:
        theirs = harbor[str(folder)]
        assert "error" not in theirs, (folder.name, theirs)
        if theirs["artifacts"]:
            theirs["artifacts"] = [_artifact(a) for a in theirs["artifacts"]]
        ours = _ours(folder)
        ours["artifacts"] = [_artifact(a) for a in ours["artifacts"]]
        if theirs["agent_timeout"] is None:
            ours["agent_timeout"] = None
        for key in ("agent_user", "verifier_user"):
            if theirs[key] is not None:
                theirs[key] = str(theirs[key])
        assert ours == theirs, folder.name


def _artifact(a: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": a["source"],
        "destination": a.get("destination"),
        "exclude": list(a.get("exclude") or []),
    }


def test_what_harbor_rejects_is_a_bad_task_here_too(harbor_python, tmp_path):
    folders = [_folder(tmp_path, name, toml) for name, toml in REJECTED.items()]
    harbor = _harbor(harbor_python, [str(f) for f in folders])
    for folder in folders:
        assert "error" in harbor[str(folder)], folder.name
        with pytest.raises(TaskError, match=r"task\.toml"):
            read_task(folder)
