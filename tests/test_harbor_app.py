"""The agent wrapper (`harbor/app.py`) in-process, its roots (`/solution`, `/logs`, `/tests`,
the WORKDIR) in a temporary directory: a task's rollout end to end with the real oracle and
nop (bash, process groups), the agent killed whole at its timeout, a payload of another
environment refused; and the image layer's Dockerfile text (`harbor/images.py`)."""

from __future__ import annotations

import base64
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentcore_rollout import ConfigError
from agentcore_rollout.agent import AgentTimeout, RolloutContext, VerifierError
from agentcore_rollout.cli.config import load_config
from agentcore_rollout.harbor import app as wrapper
from agentcore_rollout.harbor import images, verifier
from agentcore_rollout.harbor._process import group_alive
from agentcore_rollout.harbor.agents import AGENT_ENV, ENVIRONMENT_ENV, NOP, ORACLE
from agentcore_rollout.harbor.tasks import read_task, task_payload

from .conftest import ROOT

pytestmark = pytest.mark.unit

# The task's files as Harbor writes them, the roots moved under $ROOTS for the test.
TEST_SH = """\
mkdir -p "$ROOTS/logs/verifier"
ls -A "$ROOTS/tests" > "$ROOTS/tests-now"
if [ "$(cat done.txt 2>/dev/null)" = "done" ]; then r=1; else r=0; fi
echo "verifier says $r"; echo $r > "$ROOTS/logs/verifier/reward.txt"
"""
SOLVE_SH = """\
ls -A "$ROOTS/tests" > "$ROOTS/tests-then" 2>&1
echo "home=$HOME aws=${AWS_SECRET_ACCESS_KEY:-none}"
echo done > done.txt
"""


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("work", "tests"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(wrapper, "WORKDIR", tmp_path / "work")
    monkeypatch.setattr(wrapper, "SOLUTION_DIR", tmp_path / "solution")
    monkeypatch.setattr(wrapper, "AGENT_LOG", tmp_path / "logs" / "agent" / "output.txt")
    monkeypatch.setattr(verifier, "TESTS_DIR", tmp_path / "tests")
    monkeypatch.setattr(verifier, "LOGS_DIR", tmp_path / "logs" / "verifier")
    monkeypatch.setenv("ROOTS", str(tmp_path))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "session-secret")  # the wrapper's alone
    monkeypatch.setenv(AGENT_ENV, ORACLE.name)
    monkeypatch.setenv(ENVIRONMENT_ENV, "env1")
    return tmp_path


def _file(path: str, text: str) -> dict[str, object]:
    return {"path": path, "mode": 0o755, "data": base64.b64encode(text.encode()).decode()}


def _payload(solve: str = SOLVE_SH, agent_timeout: float = 30) -> dict[str, object]:
    """The agent's invocation, as `task_payload` makes it for `oracle` (its verifier's apart)."""
    return {
        "id": "t1",
        "environment": "env1",
        "instruction": "write done to done.txt",
        "agent_timeout": agent_timeout,
        "verifier_timeout": 30,
        "verifier_mode": "shared",
        "solution_env": {},
        "solution": [_file("solve.sh", solve)],
    }


def _verifier() -> dict[str, object]:
    """The verifier's invocation, in the same session once the agent's has ended."""
    tests = [_file("test.sh", TEST_SH)]
    return {
        "id": "t1",
        "phase": "verify",
        "verifier_timeout": 30,
        "verifier_env": {},
        "tests": tests,
    }


async def _rollout(payload: dict[str, object], ctx: RolloutContext | None = None):
    """The agent's invocation, then the verifier's in the same session: their outputs."""
    ctx = ctx or _ctx()
    agent = await wrapper.rollout(payload, ctx)
    verify_ctx = replace(ctx, request_id=f"{ctx.request_id}.verify")
    return agent, await wrapper.rollout(_verifier(), verify_ctx)


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _ctx(seconds: float = 120) -> RolloutContext:
    return RolloutContext("exp", 0, "r1", "t1", 0, "s1", time.time() + seconds, None)


async def test_the_oracle_solves_in_the_workdir_and_the_tests_arrive_only_after_it(roots):
    agent, output = await _rollout(_payload())
    assert agent.rewards is None  # the agent's invocation judges nothing
    assert output.rewards == 1.0
    assert (roots / "tests-then").read_text() == ""  # /tests empty while the agent ran
    assert (roots / "tests-now").read_text().split() == ["test.sh"]
    assert agent.trajectory["agent"] == "oracle"
    assert output.trajectory["verifier_output"] == "verifier says 1"
    assert output.trajectory["verifier_exit"] == 0
    home, aws = agent.trajectory["agent_output"].split()
    assert aws == "aws=none" and home != f"home={os.environ.get('HOME')}"  # its own HOME
    assert not _exists(home.removeprefix("home="))  # and gone after
    assert agent.metrics["agent_exit"] == 0 and agent.metrics["agent_seconds"] > 0
    assert (roots / "logs" / "agent" / "output.txt").read_text().startswith("home=")


async def test_nop_leaves_the_task_undone_and_gets_no_solution(roots, monkeypatch):
    monkeypatch.setenv(AGENT_ENV, NOP.name)
    _, output = await _rollout(_payload())
    assert output.rewards == 0.0
    assert not (roots / "solution").exists()


async def test_an_agent_past_its_timeout_is_killed_with_all_it_spawned(roots):
    solve = 'sleep 300 & echo $! > "$ROOTS/child"; echo $$ > "$ROOTS/pid"; echo working; wait\n'
    with pytest.raises(AgentTimeout, match=r"^agent oracle ran past its 1s limit") as raised:
        await wrapper.rollout(_payload(solve, agent_timeout=1), _ctx())
    assert str(raised.value).splitlines()[-1] == "working"
    assert not group_alive(int((roots / "pid").read_text()))
    with pytest.raises(ProcessLookupError):
        os.kill(int((roots / "child").read_text()), 0)
    assert not (roots / "logs" / "verifier").exists()  # no verdict on a timed-out agent


async def test_the_agent_gets_what_the_deadline_leaves_after_the_verifier(roots):
    """30 s verifier timeout, 5 s margin: a rollout with 20 s left has no time for its agent."""
    with pytest.raises(AgentTimeout, match="no time for the agent"):
        await wrapper.rollout(_payload(), _ctx(seconds=20))


async def test_a_task_of_another_environment_is_refused(roots, monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_ENV, "env2")
    with pytest.raises(ValueError, match=r"^task 't1' is of environment 'env1', this image serves"):
        await wrapper.rollout(_payload(), _ctx())
    assert not (roots / "solution").exists()


async def test_a_payload_that_is_no_task_is_refused(roots):
    with pytest.raises(ValueError, match=r"^not a Harbor task payload: no agent_timeout$"):
        await wrapper.rollout({"instruction": "x", "verifier_timeout": 1}, _ctx())


async def test_a_verifier_in_a_session_where_its_agent_never_ran_cannot_judge(roots):
    """A session that ended and was made anew under its id holds none of the agent's work:
    its tests would score a fresh environment 0."""
    with pytest.raises(VerifierError, match="the agent's session is gone"):
        await wrapper.rollout(_verifier(), replace(_ctx(), request_id="elsewhere.verify"))


def test_the_wrapper_gives_the_agent_the_images_environment_without_the_sessions():
    env = {
        "PATH": "/bin",
        "LANG": "C.UTF-8",
        "NODE_EXTRA_CA_CERTS": "/ca.pem",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1",
        AGENT_ENV: "oracle",
    }
    assert wrapper.task_env(env) == {
        "PATH": "/bin",
        "LANG": "C.UTF-8",
        "NODE_EXTRA_CA_CERTS": "/ca.pem",
    }


def test_the_image_layer_keeps_the_workdir_and_serves_the_wrapper():
    text = images.layer_dockerfile("localhost/env:abc", ORACLE, "abc")
    assert text.startswith("FROM localhost/env:abc\nUSER root\n")
    assert "WORKDIR" not in text
    assert f"ENV {AGENT_ENV}=oracle {ENVIRONMENT_ENV}=abc\n" in text
    assert '"agentcore_rollout.harbor.app:app", "--host", "0.0.0.0", "--port", "8080"]' in text
    assert '"/tmp/agentcore-rollout[agent]"' in text
    task = read_task(ROOT / "examples/harbor_tasks/sum-sales")
    assert images.environment_image(task.docker_image, task.environment) == (
        f"localhost/agentcore-rollout-harbor-env:{task.environment}"
    )
    assert images.agent_image("abc", "nop") == "localhost/agentcore-rollout-harbor:abc-nop"
    assert images.environment_image("ubuntu:24.04", "abc") == "ubuntu:24.04"


def test_the_example_tasks_share_one_environment_between_two():
    from agentcore_rollout.harbor.tasks import read_tasks

    tasks = read_tasks(ROOT / "examples/harbor_tasks")
    assert len(tasks) == 4 and len({t.environment for t in tasks}) == 3
    assert all(task_payload(t, solution=True)["solution"] for t in tasks)
    for task in tasks:  # the agent's session never holds the tests; only oracle's the solution
        row = task_payload(task)
        assert "tests" not in row and row["solution"] == [] and row["solution_env"] == {}
        assert [f["path"] for f in row["verifier"]["tests"]] == ["test.sh"]
        assert "environment" not in row["verifier"]  # shared: invoked again in its session


def test_an_unknown_harbor_agent_is_one_line(tmp_path):
    (tmp_path / "c.yaml").write_text("harbor:\n  agent: aider\n")
    with pytest.raises(ConfigError, match="no Harbor agent 'aider': one of") as raised:
        load_config(tmp_path / "c.yaml")
    assert "\n" not in str(raised.value)
    (tmp_path / "c.yaml").write_text("run:\n  n: 1\n")
    assert load_config(tmp_path / "c.yaml").harbor.agent == "oracle"


def test_local_build_names_a_bad_harbor_task_in_one_line(tmp_path, capsys):
    """`local build` with `run.data` naming Harbor tasks reads them first: a bad one is one
    line and exit 2, before any image is built."""
    from agentcore_rollout.cli.args import main

    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "instruction.md").write_text("do it\n")
    (tmp_path / "c.yaml").write_text(f"run:\n  data: {tmp_path}\n")
    code = main(["local", "build", "--config", str(tmp_path / "c.yaml")])
    err = capsys.readouterr().err
    assert (code, err) == (2, f"error: data: {tmp_path}/t1: no tests/test.sh (the verifier)\n")


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        (
            "agent_user",
            "no-such-user",
            r"^\[agent\] user: no user 'no-such-user' in the task's image",
        ),
        ("workdir", "/no/such/dir", r"^\[environment\] workdir '/no/such/dir' is not a folder of"),
    ],
)
async def test_a_user_or_workdir_the_image_lacks_is_one_line_before_the_agent(
    roots, key, value, error
):
    with pytest.raises(ValueError, match=error):
        await wrapper.rollout({**_payload(), key: value}, _ctx())
    assert not (roots / "solution").exists() and not (roots / "tests-then").exists()


async def test_the_tasks_variables_and_workdir_reach_the_agent_and_the_tests(roots):
    (roots / "elsewhere").mkdir()
    solve = 'echo "$MODE" > mode; echo done > done.txt\n'
    payload = {**_payload(solve), "workdir": str(roots / "elsewhere")}
    payload["environment_env"] = {"MODE": "fast"}
    await wrapper.rollout(payload, _ctx())
    assert (roots / "elsewhere" / "mode").read_text() == "fast\n"
    assert not (roots / "work" / "done.txt").exists()


def test_each_distinct_environment_is_built_once_and_a_separate_verifier_has_no_agent(tmp_path):
    """Two tasks on one environment share it; a separate verifier's environment is built
    from tests/Dockerfile with the wrapper alone (`nop`), or, where it has no Dockerfile of
    its own, from the task's `docker_image`."""
    from agentcore_rollout.cli.harbor import environments
    from agentcore_rollout.harbor.agents import agent_named
    from agentcore_rollout.harbor.tasks import read_tasks

    def task(name: str, toml: str, dockerfile: str | None, tests_dockerfile: str | None) -> None:
        folder = tmp_path / name
        (folder / "tests").mkdir(parents=True)
        (folder / "tests" / "test.sh").write_text("#!/bin/bash\n")
        (folder / "instruction.md").write_text("do it\n")
        (folder / "task.toml").write_text(toml)
        if dockerfile is not None:
            (folder / "environment").mkdir()
            (folder / "environment" / "Dockerfile").write_text(dockerfile)
        if tests_dockerfile is not None:
            (folder / "tests" / "Dockerfile").write_text(tests_dockerfile)

    separate = '[verifier]\nenvironment_mode = "separate"\n'
    task("a", "", "FROM debian\n", None)
    task("b", separate, "FROM debian\n", "FROM debian\nRUN echo v\n")
    task("c", '[environment]\ndocker_image = "ubuntu:24.04"\n' + separate, None, None)
    tasks = {t.name: t for t in read_tasks(tmp_path)}
    found = environments(tasks.values(), agent_named("claude-code"))
    by_id = {e.id: e for e in found}
    assert len(found) == len(by_id) == 4  # a and b share one; b's and c's verifiers
    assert by_id[tasks["a"].environment].agent.name == "claude-code"
    b_verifier = by_id[tasks["b"].verifier_environment]
    assert (b_verifier.agent, b_verifier.context) == (NOP, tmp_path / "b" / "tests")
    assert b_verifier.image == images.agent_image(b_verifier.id, "nop")
    c_verifier = by_id[tasks["c"].verifier_environment]
    assert (c_verifier.agent, c_verifier.base) == (NOP, "ubuntu:24.04")
