"""Harbor task folders as a dataset: read by Harbor's names and defaults, one row per task
carrying its tests and solution as files, tasks with one environment sharing its id, and every
bad task named in one line before anything starts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from agentcore_rollout.cli import main
from agentcore_rollout.harbor.tasks import (
    DEFAULT_TIMEOUT,
    Artifact,
    Resources,
    TaskError,
    is_task_source,
    read_tasks,
    task_payload,
    write_files,
)

from .test_cli_dataset import stack_starts  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\n"


def _task(
    root: Path, name: str, toml: str = "", files: dict[str, str | None] | None = None
) -> Path:
    """A task folder: instruction, task.toml, a Dockerfile, a test and a solution; `files`
    (relative path -> text) added, or left out where the text is None."""
    folder = root / name
    contents = {
        "instruction.md": f"Do {name}.\n",
        "task.toml": toml,
        "environment/Dockerfile": DOCKERFILE,
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "true\n",
        **(files or {}),
    }
    for path, text in contents.items():
        if text is None:
            continue
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def test_a_folder_of_tasks_reads_by_harbors_names_and_defaults(tmp_path):
    toml = (
        'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[agent]\ntimeout_sec = 30\n'
        '[verifier]\ntimeout_sec = 12.5\nenv = { LEVEL = "3" }\n[environment]\ncpus = 2\n'
        'memory = "4G"\nbuild_timeout_sec = 90\nallow_internet = false\n'
    )
    _task(tmp_path, "b-task", toml)
    _task(tmp_path, "a-task", "[environment]\nmemory_mb = 512\n")
    _task(tmp_path, "c-task", files={"environment/Dockerfile": DOCKERFILE + "RUN true\n"})
    _task(tmp_path, "d-task", '[environment]\ndocker_image = "ghcr.io/x/y:1"\n')
    _task(tmp_path, "e-task", '[environment]\nmemory = "512M"\n[task]\nname = "x/e"\n')
    (tmp_path / ".hidden").mkdir()
    a, b, c, d, e = read_tasks(tmp_path)
    assert [t.name for t in (a, b, c, d, e)] == ["a-task", "b-task", "c-task", "d-task", "e-task"]
    assert (b.agent_timeout, b.verifier_timeout, b.build_timeout) == (30.0, 12.5, 90.0)
    assert (b.cpus, b.memory_mb, b.verifier_env) == (2.0, 4096, {"LEVEL": "3"})
    assert b.network_mode == "no-network" and a.network_mode == "public"
    assert (a.agent_timeout, a.memory_mb, a.cpus) == (DEFAULT_TIMEOUT, 512, None)
    # one environment byte for byte, with the same limits: one id, one image, one runtime;
    # any other byte, or other limits: another
    assert a.environment == e.environment != c.environment
    assert b.environment != a.environment
    assert d.docker_image == "ghcr.io/x/y:1" and d.environment not in (a.environment, c.environment)
    assert read_tasks(tmp_path / "c-task") == [c]  # one task folder is a dataset of one


def test_a_task_is_one_row_its_tests_travel_as_files(tmp_path):
    folder = _task(tmp_path, "t", files={"tests/data/in.csv": "x,1\n"})
    (folder / "tests" / "test.sh").chmod(0o755)
    (task,) = read_tasks(tmp_path)
    row = task_payload(task, solution=True)
    assert row["id"] == "t" and row["instruction"] == "Do t.\n"
    assert row["environment"] == task.environment
    tests = row["verifier"]["tests"]  # the verifier's alone: never in the agent's session
    assert "tests" not in row and [f["path"] for f in tests] == ["data/in.csv", "test.sh"]
    assert [f["path"] for f in row["solution"]] == ["solve.sh"]
    assert task_payload(task)["solution"] == []  # only the oracle's row carries it
    json.dumps(row)  # a payload: JSON as it is
    into = tmp_path / "written"
    write_files(tests, into)
    assert (into / "data" / "in.csv").read_text() == "x,1\n"
    assert (into / "test.sh").stat().st_mode & 0o777 == 0o755
    escape = [{"path": "../out.sh", "mode": 0o644, "data": base64.b64encode(b"x").decode()}]
    with pytest.raises(ValueError, match="leaves"):
        write_files(escape, into)


def test_a_jsonl_names_task_folders_relative_to_itself(tmp_path):
    _task(tmp_path / "tasks", "one")
    _task(tmp_path / "tasks", "two")
    listing = tmp_path / "train.jsonl"
    listing.write_text('{"harbor_task": "tasks/two"}\n\n{"harbor_task": "tasks/one"}\n')
    assert is_task_source(listing) and is_task_source(tmp_path / "tasks")
    assert [t.name for t in read_tasks(listing)] == ["two", "one"]
    payloads = tmp_path / "payloads.jsonl"
    payloads.write_text('{"id": 1, "a": 2}\n')
    assert not is_task_source(payloads)
    listing.write_text('{"harbor_task": "tasks/one"}\n{"task": "tasks/two"}\n')
    with pytest.raises(TaskError, match=r"train.jsonl:2: expected \{\"harbor_task\": \"DIR\"\}"):
        read_tasks(listing)


BAD = {  # folder -> (how it is broken, what its one line says)
    "no-instruction": ({"instruction.md": None}, "no instruction.md"),
    "empty-instruction": ({"instruction.md": "  \n"}, "instruction.md is empty"),
    "no-tests": ({"tests/test.sh": None}, "no tests/test.sh (the verifier)"),
    "bad-toml": ({"task.toml": "[agent\n"}, "task.toml is not valid TOML"),
    "bad-timeout": (
        {"task.toml": "[agent]\ntimeout_sec = -1\n"},
        "task.toml: [agent] timeout_sec must be a positive number of seconds, not -1",
    ),
    "bad-memory": (
        {"task.toml": '[environment]\nmemory = "lots"\n'},
        "task.toml: [environment] memory 'lots' is not like '4G' or '512M'",
    ),
    "no-environment": (
        {"environment/Dockerfile": None},
        "no environment/Dockerfile and no [environment] docker_image",
    ),
}


def test_every_bad_task_is_one_line_before_anything_starts(tmp_path, capsys, stack_starts):  # noqa: F811
    data = tmp_path / "tasks"
    _task(data, "fine")
    for name, (files, _) in BAD.items():
        _task(data, name, files=files)
    out = tmp_path / "out"
    assert main(["run", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(BAD), err
    for line, (name, (_, why)) in zip(err, sorted(BAD.items()), strict=True):
        assert line.startswith(f"error: data: {data / name}: ") and why in line, (line, why)
    assert stack_starts == []
    assert sorted(p.name for p in out.iterdir()) == ["lock"]  # nothing to resume


# -- every key of the schema: refused by name, ignored, or honoured --------------------------------

REFUSED = {  # task.toml -> what its one line names (key, value, why)
    "[environment]\ngpus = 1\n": "[environment] gpus = 1 is refused: no accelerator",
    '[environment]\ngpu_types = ["H100"]\n': "[environment] gpu_types = ['H100'] is refused",
    '[environment.tpu]\ntype = "v6e"\ntopology = "2x4"\n': "[environment] tpu = {'type': 'v6e'",
    '[environment]\nos = "Windows"\n': "[environment] os = 'Windows' is refused: only Linux",
    '[[environment.mcp_servers]]\nname = "m"\nurl = "http://x"\n': (
        "[environment] mcp_servers = [{'name': 'm', 'url': 'http://x'}] is refused: no agent here"
    ),
    '[environment]\nskills_dir = "/skills"\n': "[environment] skills_dir = '/skills' is refused",
    '[environment.healthcheck]\ncommand = "true"\n': (
        "[environment] healthcheck = {'command': 'true'} is refused: no health check"
    ),
    '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n': (
        "[environment] network_mode = 'allowlist' is refused: an allowlist cannot be enforced"
    ),
    '[agent]\nnetwork_mode = "allowlist"\n': "[agent] network_mode = 'allowlist' is refused",
    '[environment]\nallowed_hosts = ["x.org"]\nallow_internet = false\n': (
        "[environment] allowed_hosts = ['x.org'] is refused"
    ),
    '[environment]\nenv = { TOKEN = "${HF_TOKEN}" }\n': (
        "[environment] env.TOKEN = '${HF_TOKEN}' is refused: it would pull a variable from the host"
    ),
    '[verifier]\nenv = { K = "${K:-x}" }\n': "[verifier] env.K = '${K:-x}' is refused",
    '[solution]\nenv = { K = "${K}" }\n': "[solution] env.K = '${K}' is refused",
    '[[verifier.collect]]\ncommand = "dump"\n': (
        "[verifier] collect = [{'command': 'dump'}] is refused: no collect command"
    ),
    '[[steps]]\nname = "one"\n': "[[steps]] = [{'name': 'one'}] is refused: multi-step tasks",
    'schema_version = "1.5"\n': "schema_version = '1.5' is refused: newer than 1.4",
    "[environment]\nunknown = 1\n": (
        "[environment] unknown = 1 is refused: not a key of Harbor's task schema"
    ),
    "[agent]\nuser = 'a'\nturns = 3\n": "[agent] turns = 3 is refused: not a key",
    "retries = 2\n": "retries = 2 is refused: not a key of Harbor's task schema",
    'artifacts = [{ source = "/x", service = "db" }]\n': (
        "artifacts entry service = 'db' is refused: only the agent's own container"
    ),
    'artifacts = [{ source = "/x", to = "y" }]\n': "artifacts entry to = 'y' is refused",
    "[verifier.environment]\ngpus = 2\n": "[verifier.environment] gpus = 2 is refused",
    '[verifier.environment]\nworkdir = "/w"\n': (
        "[verifier.environment] workdir = '/w' is refused: not carried to a separate verifier"
    ),
    '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n': (
        "[verifier] network_mode = 'public' is refused: the phases differ (no-network, then"
    ),
    '[environment]\nallow_internet = false\n[agent]\nnetwork_mode = "public"\n': (
        "[agent] network_mode = 'public' is refused: the phases differ (public, then no-network)"
    ),
}


@pytest.mark.parametrize("toml", REFUSED)
def test_a_key_that_cannot_be_carried_out_is_refused_in_one_line_naming_it(tmp_path, toml):
    _task(tmp_path, "t", toml)
    with pytest.raises(TaskError) as refused:
        read_tasks(tmp_path)
    (line,) = str(refused.value).splitlines()
    assert line.startswith(f"{tmp_path / 't'}: task.toml: ") and REFUSED[toml] in line, line


BAD_VALUES = {  # values Harbor rejects, or would read other than written: one line naming the key
    "version = 1.0\n": "schema_version must be a string like '1.4', not 1.0",
    '[environment]\nnetwork_mode = "offline"\n': "[environment] network_mode must be one of",
    "[environment]\nmemory = 4096\n": "[environment] memory 4096 is not like '4G'",
    '[environment]\nmemory = "4G"\nmemory_mb = 1024\n': "memory '4G' is 4096 MB, not memory_mb",
    '[environment]\nstorage = "10GB"\n': "[environment] storage '10GB' is not like",
    "[environment]\ncpus = 0\n": "[environment] cpus must be a positive number, not 0",
    "[environment]\nallow_internet = 'no'\n": "allow_internet must be true or false, not 'no'",
    "[verifier]\nenv = { LEVEL = 3 }\n": "[verifier] env LEVEL must be a string, not 3",
    "[agent]\nuser = true\n": "[agent] user must be a user name or a uid, not True",
    '[task]\nname = "no-org"\n': "[task] name must be a package name like 'org/name'",
    "metadata = 3\n": "[metadata] must be a table",
    'multi_step_reward_strategy = "max"\n': "multi_step_reward_strategy must be mean or final",
    'artifacts = [{ source = "/x", destination = "/abs" }]\n': "destination '/abs': a relative",
    'artifacts = [{ source = "/x", destination = "manifest.json" }]\n': "Harbor's manifest",
    '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\n': "with a [verifier.env",
    '[verifier]\nenvironment = "img"\n': "[verifier.environment] must be a table, not 'img'",
    "agent = 3\n": "[agent] must be a table, not 3",
    'artifacts = [{ source = "/x", exclude = "*.tmp" }]\n': "exclude is a list of patterns",
}


@pytest.mark.parametrize("toml", BAD_VALUES)
def test_a_value_harbor_rejects_is_one_line_naming_the_key(tmp_path, toml):
    _task(tmp_path, "t", toml)
    with pytest.raises(TaskError) as bad:
        read_tasks(tmp_path)
    (line,) = str(bad.value).splitlines()
    assert BAD_VALUES[toml] in line, line


def test_a_trajectory_to_seed_the_agent_is_refused(tmp_path):
    _task(tmp_path, "t", files={"trajectory.json": "{}"})
    with pytest.raises(TaskError, match=r"t: trajectory.json \(Harbor's prior agent context\) is"):
        read_tasks(tmp_path)


IGNORED = """\
schema_version = "1.4"
source = "terminal-bench@2.0"
multi_step_reward_strategy = "final"
steps = []

[task]
name = "org/sum-sales"
version = "1.2.0"
description = "Sum the sales."
authors = [{ name = "A", email = "a@x.org" }]
keywords = ["csv"]

[metadata]
difficulty = "easy"
anything = { nested = [1, 2] }

[environment]
gpus = 0
gpu_types = []
mcp_servers = []
allowed_hosts = []
os = "LINUX"

[verifier]
collect = []
"""


def test_labels_and_empty_defaults_are_accepted_and_change_nothing(tmp_path):
    _task(tmp_path, "plain")
    _task(tmp_path, "labelled", IGNORED)
    plain, labelled = read_tasks(tmp_path)
    assert {**vars(labelled), "name": "", "path": None, "instruction": ""} == {
        **vars(plain),
        "name": "",
        "path": None,
        "instruction": "",
    }


HONOURED = """\
version = "1.2"
artifacts = ["/app/out.txt", { source = "/logs/agent", destination = "agent", exclude = ["*.tmp"] }]

[agent]
user = "agent"

[verifier]
user = 0
timeout_sec = 30

[verifier.environment]
docker_image = "ghcr.io/x/verifier:1"
cpus = 1
storage = "2G"
allow_internet = false

[environment]
docker_image = "ghcr.io/x/task:1"
build_timeout_sec = 60
cpus = 2.0
memory_mb = 2048
storage_mb = 8192
network_mode = "no-network"
workdir = "/app"
env = { MODE = "fast", PRICE = "$5", PATH_EXTRA = "${A}/b" }
"""


def test_honoured_keys_are_read_by_harbors_names(tmp_path):
    (task,) = read_tasks(_task(tmp_path, "t", HONOURED))
    assert (task.docker_image, task.build_timeout, task.verifier_timeout) == (
        "ghcr.io/x/task:1",
        60.0,
        30.0,
    )
    assert (task.cpus, task.memory_mb, task.storage_mb) == (2.0, 2048, 8192)
    assert (task.network_mode, task.workdir) == ("no-network", "/app")
    # a literal `$` is a literal; only a whole-value ${VAR} pulls from the host (refused above)
    assert task.environment_env == {"MODE": "fast", "PRICE": "$5", "PATH_EXTRA": "${A}/b"}
    assert (task.agent_user, task.verifier_user) == ("agent", "0")
    # a [verifier.environment] makes the verifier separate, with its own image and limits
    assert (task.verifier_mode, task.verifier_docker_image) == ("separate", "ghcr.io/x/verifier:1")
    assert task.verifier_resources == Resources(1.0, None, 2048, "no-network")
    assert task.verifier_environment not in ("", task.environment)
    assert task.artifacts == (
        Artifact("/app/out.txt"),
        Artifact("/logs/agent", "agent", ("*.tmp",)),
    )


def test_a_separate_verifier_without_its_own_environment_copies_the_tasks(tmp_path):
    toml = (
        '[verifier]\nenvironment_mode = "separate"\nnetwork_mode = "public"\n'
        '[environment]\ncpus = 4\nmemory = "1G"\nnetwork_mode = "no-network"\n'
    )
    (task,) = read_tasks(_task(tmp_path, "t", toml))
    # the verifier's phase may have its own network in its own session
    assert task.verifier_resources == Resources(4.0, 1024, None, "public")
    assert (task.network_mode, task.verifier_mode) == ("no-network", "separate")
    (shared,) = read_tasks(_task(tmp_path / "s", "t", '[environment]\nmemory = "1G"\n'))
    assert (shared.verifier_mode, shared.verifier_resources, shared.verifier_environment) == (
        "shared",
        None,
        "",
    )


def test_limits_and_network_make_another_environment(tmp_path):
    tomls = [
        "",
        "[environment]\ncpus = 1\n",
        "[environment]\nmemory_mb = 1024\n",
        '[environment]\nstorage = "1G"\n',
        "[environment]\nallow_internet = false\n",
    ]
    for n, toml in enumerate(tomls):
        _task(tmp_path, f"t{n}", toml)
    ids = [t.environment for t in read_tasks(tmp_path)]
    assert len(set(ids)) == len(tomls)
