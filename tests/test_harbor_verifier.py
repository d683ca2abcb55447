"""Harbor's verifier contract (`harbor/verifier.py`), run for real (bash, a process group) in a
temporary directory standing for `/tests` and `/logs/verifier`: the reward read as Harbor
reads it, and every way the tests cannot judge a `VerifierError`, never a 0."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from agentcore_rollout.agent import VerifierError
from agentcore_rollout.contract import NamedRewards
from agentcore_rollout.harbor import verifier
from agentcore_rollout.harbor._process import group_alive
from agentcore_rollout.harbor.verifier import read_reward, verify

pytestmark = pytest.mark.unit


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`/tests` and `/logs/verifier` under `tmp_path`; a stale file in each, to be emptied."""
    for name in ("tests", "logs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "stale").write_text("from before")
    monkeypatch.setattr(verifier, "TESTS_DIR", tmp_path / "tests")
    monkeypatch.setattr(verifier, "LOGS_DIR", tmp_path / "logs")
    (tmp_path / "work").mkdir()
    return tmp_path


def _tests(script: str, **more: str) -> list[dict[str, object]]:
    files = {"test.sh": script, **more}
    return [
        {"path": path, "mode": 0o755, "data": base64.b64encode(text.encode()).decode()}
        for path, text in files.items()
    ]


def _env(roots: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "LOGS": str(roots / "logs")}


async def test_a_reward_txt_is_the_reward_and_the_tests_run_where_the_task_works(roots):
    script = 'pwd > "$LOGS/cwd"; ls /dev/null helper.sh 2>&1; echo 1 > "$LOGS/reward.txt"\n'
    script = script.replace("helper.sh", str(roots / "tests" / "helper.sh"))
    tests = _tests(script, **{"helper.sh": "true\n"})
    verdict = await verify(tests, 10, _env(roots), roots / "work")
    assert verdict.rewards == 1.0 and verdict.exit_code == 0
    assert (roots / "logs" / "cwd").read_text().strip() == str(roots / "work")
    assert str(roots / "tests" / "helper.sh") in verdict.output  # written in, with test.sh
    assert not (roots / "tests" / "stale").exists() and not (roots / "logs" / "stale").exists()
    assert "helper.sh" in (roots / "logs" / "test-stdout.txt").read_text()


async def test_a_failing_exit_with_a_reward_is_a_verdict(roots):
    """As in Harbor: many tests write 0 and exit 1."""
    script = 'echo 0 > "$LOGS/reward.txt"; echo failed; exit 1\n'
    verdict = await verify(_tests(script), 10, _env(roots), roots / "work")
    assert (verdict.rewards, verdict.exit_code, verdict.output) == (0.0, 1, "failed")


@pytest.mark.parametrize(
    ("written", "reward"),
    [
        ({"reward.txt": " 0.25\n"}, 0.25),
        ({"reward.json": '{"reward": 1}'}, 1.0),
        ({"reward.json": '{"passed": 0.5}'}, 0.5),
        ({"reward.txt": "1", "reward.json": '{"reward": 0}'}, 1.0),  # reward.txt first
        (
            {"reward.json": '{"reward": 0.5, "style": 1, "tests": 0}'},
            NamedRewards(components={"reward": 0.5, "style": 1, "tests": 0}, scalar="reward"),
        ),
        (
            {"reward.json": '{"style": 1, "tests": 0}'},
            NamedRewards(components={"style": 1, "tests": 0, "reward": 0.5}, scalar="reward"),
        ),
    ],
)
def test_rewards_are_read_as_harbor_writes_them(tmp_path, written, reward):
    for name, text in written.items():
        (tmp_path / name).write_text(text)
    assert read_reward(tmp_path) == reward


@pytest.mark.parametrize(
    ("written", "error"),
    [
        ({}, "the tests wrote no reward"),
        ({"reward.txt": "passed"}, "reward.txt is 'passed', not one finite number"),
        ({"reward.txt": "nan"}, "not one finite number"),
        ({"reward.txt": ""}, "reward.txt is '', not one finite number"),
        ({"reward.json": "{"}, "reward.json is not JSON"),
        ({"reward.json": "[1]"}, "reward.json is not an object of numbers"),
        ({"reward.json": "{}"}, "reward.json is not an object of numbers"),
        ({"reward.json": '{"reward": true}'}, "reward.json 'reward' is 'True'"),
        ({"reward.json": '{"reward": "high"}'}, "not one finite number"),
    ],
)
def test_a_reward_that_is_not_one_finite_number_cannot_judge(tmp_path, written, error):
    for name, text in written.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(VerifierError, match=error):
        read_reward(tmp_path)


async def test_tests_that_exit_without_a_reward_cannot_judge(roots):
    script = "echo collecting; echo 'ImportError: no module named app'; exit 2\n"
    with pytest.raises(VerifierError) as raised:
        await verify(_tests(script), 10, _env(roots), roots / "work")
    first, *rest = str(raised.value).splitlines()
    assert first == "the tests wrote no reward (/logs/verifier/reward.txt or reward.json) " + (
        "(test.sh exit 2); its output ended:"
    )
    assert rest == ["collecting", "ImportError: no module named app"]


async def test_a_payload_without_test_sh_cannot_judge(roots):
    tests = _tests("exit 0\n")
    tests[0]["path"] = "run_tests.sh"
    with pytest.raises(VerifierError, match=r"^the task's tests have no test.sh$"):
        await verify(tests, 10, _env(roots), roots / "work")


async def test_an_environment_without_bash_cannot_judge(roots):
    env = {"PATH": str(roots / "work")}  # no bash on it
    with pytest.raises(VerifierError, match=r"^no bash in the task's environment"):
        await verify(_tests("exit 0\n"), 10, env, roots / "work")


async def test_tests_past_their_timeout_are_killed_whole_and_cannot_judge(roots):
    """test.sh and what it started (a background child) are gone by the time it raises."""
    script = 'sleep 300 & echo $! > "$LOGS/child"; echo started; echo $$ > "$LOGS/pid"; wait\n'
    with pytest.raises(VerifierError, match=r"^tests/test.sh ran past its 1s timeout") as raised:
        await verify(_tests(script), 1, _env(roots), roots / "work")
    assert str(raised.value).splitlines()[-1] == "started"
    group = int((roots / "logs" / "pid").read_text())
    child = int((roots / "logs" / "child").read_text())
    assert not group_alive(group)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
