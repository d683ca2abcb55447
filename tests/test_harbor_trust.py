"""Rewards a policy cannot hack (issue 49), the parts that run without a container: task
folders that are data (no link out), the users, workdir and variables a row carries, a reward
read within bounds, the image's record of its verifier's tools and the check against it, and
the allowlist an agent's environment is. The attacks themselves, run in containers, are
tests/test_harbor_hostile.py."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from agentcore_rollout.agent import VerifierError, allowlist
from agentcore_rollout.harbor import trusted, verifier
from agentcore_rollout.harbor._process import RunAs, user_named
from agentcore_rollout.harbor.tasks import TaskError, read_task, read_tasks, task_payload
from agentcore_rollout.harbor.verifier import MAX_REWARD_BYTES, read_reward, verify

from .test_harbor_tasks import _task

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------- task folders are data


@pytest.mark.parametrize(
    ("where", "target"),
    [
        ("tests/passwd", "/etc/passwd"),
        ("solution/creds", "../../../outside"),
        ("environment/key", "/etc/hostname"),
        ("environment/dir", "/etc"),
        ("tests/loop", "loop"),
    ],
)
def test_a_symlink_out_of_its_task_folder_is_refused_naming_it(tmp_path, where, target):
    (tmp_path / "outside").write_text("a host file\n")
    folder = _task(tmp_path / "tasks", "t1")
    (folder / where).symlink_to(target)
    with pytest.raises(TaskError) as raised:
        read_tasks(tmp_path / "tasks")
    (line,) = str(raised.value).splitlines()
    assert line.startswith(f"{folder}: {where} is a symlink to {target}, which ")
    assert line.endswith(": refused (a task folder is data)")


def test_a_hard_link_is_refused_and_a_symlink_inside_is_its_targets_content(tmp_path):
    folder = _task(tmp_path, "t1", files={"tests/helper.py": "print(1)\n"})
    (folder / "tests" / "same.py").symlink_to("helper.py")
    files = {f["path"]: f["data"] for f in task_payload(read_task(folder))["verifier"]["tests"]}
    assert files["same.py"] == files["helper.py"] == base64.b64encode(b"print(1)\n").decode()
    os.link(tmp_path / "t1" / "tests" / "helper.py", tmp_path / "elsewhere.py")
    with pytest.raises(TaskError, match=r"tests/helper.py is a hard link \(2 names\): refused"):
        read_task(folder)


def test_the_rows_carry_the_users_the_workdir_and_the_environments_variables(tmp_path):
    toml = (
        '[agent]\nuser = "agent"\n[verifier]\nuser = 1000\n'
        '[environment]\nworkdir = "/srv"\nenv = { MODE = "fast" }\n'
    )
    row = task_payload(read_task(_task(tmp_path, "t1", toml)))
    assert (row["agent_user"], row["workdir"], row["environment_env"]) == (
        "agent",
        "/srv",
        {"MODE": "fast"},
    )
    check = row["verifier"]
    assert (check["verifier_user"], check["workdir"], check["environment_env"]) == (
        "1000",
        "/srv",
        {"MODE": "fast"},
    )


def test_a_user_is_a_name_or_a_uid_and_one_the_system_lacks_is_one_line():
    assert user_named(None) is None and user_named("root") is None and user_named("0") is None
    assert user_named("nobody") == RunAs("nobody", 65534, 65534, (), "/nonexistent")
    assert user_named("54321") == RunAs("54321", 54321, 54321)  # no entry: its own group
    with pytest.raises(LookupError, match=r"^no user 'no-such-user' in the task's image$"):
        user_named("no-such-user")


# ----------------------------------------------------------------- a reward within bounds


@pytest.mark.parametrize(
    ("written", "error"),
    [
        ({"reward.txt": "1" + " " * MAX_REWARD_BYTES}, r"^reward.txt is over 64 KiB$"),
        ({"reward.json": '{"a": 1e999}'}, "not one finite number"),
        ({"reward.txt": "-inf"}, "not one finite number"),
    ],
)
def test_a_reward_too_large_or_not_finite_in_any_way_cannot_judge(tmp_path, written, error):
    for name, text in written.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(VerifierError, match=error):
        read_reward(tmp_path)


def test_a_reward_file_that_is_a_link_cannot_judge(tmp_path):
    (tmp_path / "elsewhere").write_text("1\n")
    (tmp_path / "reward.txt").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(VerifierError, match=r"^reward.txt cannot be read"):
        read_reward(tmp_path)


def test_the_mean_of_large_finite_components_is_finite(tmp_path):
    """Their sum overflows (the mean was inf, then a pydantic dump as agent_error); the mean
    of the parts does not."""
    (tmp_path / "reward.json").write_text('{"a": 1.5e308, "b": 1.5e308}')
    assert read_reward(tmp_path).components["reward"] == 1.5e308


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(verifier, "TESTS_DIR", tmp_path / "tests")
    monkeypatch.setattr(verifier, "LOGS_DIR", tmp_path / "logs")
    (tmp_path / "work").mkdir()
    return tmp_path


def _tests(script: str) -> list[dict[str, object]]:
    return [{"path": "test.sh", "mode": 0o755, "data": base64.b64encode(script.encode()).decode()}]


async def test_tests_killed_by_a_signal_cannot_judge_whatever_reward_is_there(roots):
    script = 'echo 1 > "$LOGS/reward.txt"; echo dying; kill -9 $$\n'
    env = {"PATH": os.environ["PATH"], "LOGS": str(roots / "logs")}
    with pytest.raises(VerifierError) as raised:
        await verify(_tests(script), 10, env, roots / "work")
    assert str(raised.value).splitlines() == [
        "tests/test.sh was killed by signal 9 (SIGKILL); its output ended:",
        "dying",
    ]


async def test_a_logs_folder_made_a_link_is_replaced_before_the_tests(roots):
    (roots / "planted").mkdir()
    (roots / "planted" / "reward.txt").write_text("1\n")
    (roots / "logs").symlink_to(roots / "planted")
    env = {"PATH": os.environ["PATH"], "LOGS": str(roots / "logs")}
    verdict = await verify(_tests('echo 0 > "$LOGS/reward.txt"\n'), 10, env, roots / "work")
    assert verdict.rewards == 0.0 and not (roots / "logs").is_symlink()
    assert (roots / "planted" / "reward.txt").read_text() == "1\n"  # untouched, unread


# ----------------------------------------------------------------- the image's record


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A PATH of two folders, the first empty (where an agent writes), bash in the second."""
    early, tools = tmp_path / "local-bin", tmp_path / "bin"
    early.mkdir()
    tools.mkdir()
    real = tools / "bash"
    real.write_bytes(Path(os.path.realpath("/bin/bash")).read_bytes())
    real.chmod(0o755)
    (tools / "python3").symlink_to(os.path.realpath("/usr/bin/python3"))
    monkeypatch.setattr(trusted, "MOUNTS", (str(tmp_path / "logs"), str(tmp_path / "tests")))
    return {"early": early, "tools": tools, "json": tmp_path / "trusted.json"}


def test_the_build_records_the_tools_the_mounts_and_the_images_env(image):
    path = f"{image['early']}:{image['tools']}"
    made = trusted.record(image["json"], {"PATH": path, "LANG": "C.UTF-8", "HOSTNAME": "b"})
    assert set(made["tools"]) == {"bash", "python3"}  # pytest, uv, uvx: absent, left out
    assert made["tools"]["bash"]["path"] == str(image["tools"] / "bash")
    assert made["tools"]["python3"]["real"] == os.path.realpath("/usr/bin/python3")
    assert made["env"] == {"PATH": path, "LANG": "C.UTF-8"}  # not the build's HOSTNAME
    assert set(made["mounts"].values()) == {"absent"}
    assert stat.S_IMODE(image["json"].stat().st_mode) == 0o444
    loaded = trusted.load(image["json"])
    assert loaded is not None and loaded.bash() == str(image["tools"] / "bash")
    assert trusted.check(loaded, path) == []
    first = trusted.trusted_path(loaded, f"/usr/bin:{path}")
    assert first == f"{image['tools']}:/usr/bin:{image['early']}"
    assert trusted.load(image["json"].with_name("absent.json")) is None


def test_every_difference_from_the_record_is_reported(image, tmp_path):
    path = f"{image['early']}:{image['tools']}"
    trusted.record(image["json"], {"PATH": path})
    loaded = trusted.load(image["json"])
    assert loaded is not None
    fake = image["early"] / "bash"  # the agent's bash, first on PATH
    fake.write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    fake.chmod(0o755)
    (image["tools"] / "bash").write_bytes(b"#!/bin/sh\n")  # the real one rewritten
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tests").symlink_to(tmp_path / "elsewhere")
    assert trusted.check(loaded, path) == [
        f"{fake} (shadows {image['tools'] / 'bash'})",
        f"{image['tools'] / 'bash'} (sha256 differs)",
        f"{tmp_path / 'tests'} (a symlink, recorded absent)",
    ]


async def test_a_tampered_environment_cannot_judge_and_an_intact_one_runs_the_recorded_bash(
    image, roots
):
    path = f"{image['early']}:{image['tools']}:/usr/bin:/bin"
    trusted.record(image["json"], {"PATH": path})
    loaded = trusted.load(image["json"])
    script = 'echo "$PATH" > "$LOGS/path"; echo 1 > "$LOGS/reward.txt"\n'
    env = {"PATH": path, "LOGS": str(roots / "logs")}
    verdict = await verify(_tests(script), 10, env, roots / "work", trusted=loaded)
    assert verdict.rewards == 1.0 and verdict.trust == "checked"
    assert (roots / "logs" / "path").read_text().startswith(f"{image['tools']}:")
    (image["early"] / "python3").write_text("#!/bin/sh\n")
    (image["early"] / "python3").chmod(0o755)
    with pytest.raises(VerifierError, match=r"^tampered: \S+/local-bin/python3 \(shadows "):
        await verify(_tests(script), 10, env, roots / "work", trusted=loaded)


async def test_an_image_without_a_record_says_so_and_finds_bash_on_path(roots):
    env = {"PATH": os.environ["PATH"], "LOGS": str(roots / "logs")}
    verdict = await verify(_tests('echo 1 > "$LOGS/reward.txt"\n'), 10, env, roots / "work")
    assert verdict.trust.startswith("unchecked: no /opt/agentcore-rollout/trusted.json")


# ----------------------------------------------------------------- an agent's environment

SESSION = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "SSL_CERT_FILE": "/ca.pem",
    "NODE_EXTRA_CA_CERTS": "/ca.pem",
    "NO_PROXY": "localhost",
    "HTTP_PROXY": "http://proxy:3128",
    "HTTPS_PROXY": "http://user:secret@proxy:3128",
    "AWS_SECRET_ACCESS_KEY": "s",
    "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1",
    "AGENTCORE_ROLLOUT_HARBOR_AGENT": "oracle",
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=t",
    "WANDB_API_KEY": "w",
    "MLFLOW_TRACKING_TOKEN": "m",
    "GOOGLE_APPLICATION_CREDENTIALS": "/g.json",
    "AZURE_CLIENT_SECRET": "a",
    "SOMETHING_THE_LAUNCH_SET": "x",
}


def test_an_agent_gets_the_images_env_the_basics_and_the_tasks_and_nothing_else():
    image = {"PATH": "/opt/venv/bin:/usr/bin", "PYTHONUNBUFFERED": "1", "AWS_REGION": "x"}
    env = allowlist.agent_env(SESSION, image, {"MODE": "fast"})
    assert env == {
        "PATH": "/usr/bin",  # the session's own PATH over the image's
        "PYTHONUNBUFFERED": "1",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "SSL_CERT_FILE": "/ca.pem",
        "NODE_EXTRA_CA_CERTS": "/ca.pem",
        "NO_PROXY": "localhost",
        "HTTP_PROXY": "http://proxy:3128",
        "MODE": "fast",
    }


def test_without_a_record_the_session_stands_in_for_the_image_less_what_is_denied():
    env = allowlist.agent_env(SESSION, None)
    assert set(env) == {
        *("PATH", "HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"),
        *("NO_PROXY", "HTTP_PROXY", "SOMETHING_THE_LAUNCH_SET"),
    }
    assert json.dumps(env).count("secret") == 0


def test_a_process_mode_agent_of_the_local_stack_gets_an_allowlist_too():
    from agentcore_rollout.local.agent_env import process_agent_env

    host = {
        **SESSION,
        "AWS_REGION": "us-east-1",
        "AWS_PROFILE": "admin",
        "PYTHONPATH": "/src",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "AGENTCORE_ROLLOUT_GATEWAY__ADMIN_TOKEN": "t",
    }
    env = process_agent_env(host, {"MY_AGENT_SETTING": "1"})
    assert env["AWS_SECRET_ACCESS_KEY"] == "s" and env["AWS_ENDPOINT_URL_S3"]  # its writer's
    assert env["PYTHONPATH"] == "/src" and env["MY_AGENT_SETTING"] == "1"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"  # its spans join
    for name in ("AWS_PROFILE", "OTEL_EXPORTER_OTLP_HEADERS", "WANDB_API_KEY", "HTTPS_PROXY"):
        assert name not in env
    assert not [n for n in env if n.startswith(("AGENTCORE_ROLLOUT_", "GOOGLE_", "AZURE_"))]
    assert "SOMETHING_THE_LAUNCH_SET" not in env and "MLFLOW_TRACKING_TOKEN" not in env
