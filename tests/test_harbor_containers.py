"""Harbor tasks on the real wire, each session a container of its task's image (the task's
environment with the wrapper's layer, `cli.harbor.task_images`), through the emulator in
container mode and the engine: the example tasks with `oracle` (all 1.0) and `nop` (all 0.0),
a verifier that cannot judge, an agent past its timeout, tests the agent cannot read.

One emulator per environment (one image each), as AgentCore has one runtime per environment.
Marked `containers`, run with Podman and with Docker: without that runtime, or where it does
not work, they skip, saying why. The images are built once per machine (cached by name)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.cli.harbor import task_images
from agentcore_rollout.harbor.tasks import HarborTask, read_tasks, task_payload
from agentcore_rollout.local.containers import (
    LABEL,
    ContainerEngine,
    ContainerRuntimeError,
    container_engine,
)

from .conftest import ROOT, engine_config

pytestmark = [pytest.mark.containers, pytest.mark.e2e]

EXAMPLES = ROOT / "examples/harbor_tasks"
SHARED = EXAMPLES / "write-greeting" / "environment"  # sum-sales's too, byte for byte
# Fixture tasks, each on the examples' shared environment (so its image, built already).
FIXTURES = {
    "no-reward": ("echo 'collecting tests'; exit 3", "true", 120),
    "outlives-timeout": (
        "echo 1 > /logs/verifier/reward.txt",
        "sleep 300 & sleep 300",  # a child of its own, in its group
        2,
    ),
    "peeks-at-tests": (
        "if [ -f /app/seen ] && [ ! -s /app/seen ]; then r=1; else r=0; fi\n"
        "echo $r > /logs/verifier/reward.txt",
        "ls -A /tests 2>/dev/null > /app/seen; cat /tests/test.sh >> /app/seen 2>/dev/null; true",
        120,
    ),
}


@pytest.fixture(scope="session", params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> ContainerEngine:
    try:
        return container_engine(request.param)
    except ContainerRuntimeError as e:
        pytest.skip(f"no {request.param} here: {e}")


@pytest.fixture
def no_container_left(engine: ContainerEngine) -> Iterator[None]:
    yield
    assert engine.run("ps", "-aq", "--filter", f"label={LABEL}").stdout.split() == []


def _fixture_tasks(into: Path) -> list[HarborTask]:
    for name, (test, solve, agent_timeout) in FIXTURES.items():
        task = into / name
        shutil.copytree(SHARED, task / "environment")
        (task / "instruction.md").write_text(f"fixture task {name}\n")
        (task / "task.toml").write_text(
            f"[agent]\ntimeout_sec = {agent_timeout}\n[verifier]\ntimeout_sec = 20\n"
        )
        for path, text in (("tests/test.sh", test), ("solution/solve.sh", solve)):
            (task / path).parent.mkdir()
            (task / path).write_text(f"#!/bin/bash\n{text}\n")
    return read_tasks(into)


async def _roll_out(emulator, moto, channel, engine, images, tasks) -> dict[str, object]:
    """Each environment's tasks on an emulator of its image: outcome by task name."""
    outcomes = {}
    for environment, image in images.items():
        emu = await emulator(mode="container", container_engine=engine.name, image=image)
        config = engine_config(moto, channel, emu, exp_id=f"h-{image[-20:]}", rollout_timeout=90)
        requests = [
            RolloutRequest(task_payload(t), input_id=t.name)
            for t in tasks
            if t.environment == environment
        ]
        async with RolloutEngine(config) as rollouts:
            batch = await rollouts.rollout(requests)
        outcomes |= {o.request.input_id: o for o in batch.outcomes}
    return outcomes


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_the_example_tasks_score_as_their_agent_says(
    engine, agent, reward, emulator, moto, channel, no_container_left
):
    """oracle runs each task's solve.sh: every task 1.0; nop does nothing: every task 0.0. Two
    tasks share one environment, so three images serve four tasks."""
    tasks = read_tasks(EXAMPLES)
    images = task_images(tasks, agent, engine)
    assert len(images) == 3
    outcomes = await _roll_out(emulator, moto, channel, engine, images, tasks)
    assert {n: o.outcome for n, o in outcomes.items()} == {t.name: Outcome.OK for t in tasks}
    assert {n: o.reward for n, o in outcomes.items()} == {t.name: reward for t in tasks}
    for outcome in outcomes.values():
        trajectory = outcome.result.trajectory
        assert trajectory["agent"] == agent and trajectory["verifier_exit"] == 0
        assert outcome.trace is None  # it never called the model


async def test_a_verifier_that_cannot_judge_an_agent_too_slow_and_tests_kept_hidden(
    engine, emulator, moto, channel, no_container_left, tmp_path
):
    tasks = _fixture_tasks(tmp_path)
    images = task_images(tasks, "oracle", engine)  # the examples' shared image: built already
    assert len(images) == 1
    outcomes = await _roll_out(emulator, moto, channel, engine, images, tasks)
    no_reward = outcomes["no-reward"]
    assert no_reward.outcome is Outcome.VERIFIER_ERROR and no_reward.reward is None
    assert no_reward.error.startswith("VerifierError: the tests wrote no reward")
    assert no_reward.error.endswith("(test.sh exit 3); its output ended:\ncollecting tests")
    slow = outcomes["outlives-timeout"]
    assert slow.outcome is Outcome.TIMEOUT and slow.reward is None
    assert "agent oracle ran past its 2s limit: its process group was killed" in slow.error
    peek = outcomes["peeks-at-tests"]
    assert (peek.outcome, peek.reward) == (Outcome.OK, 1.0)  # /tests was empty as it ran
