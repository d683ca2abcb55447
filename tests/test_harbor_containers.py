"""Harbor tasks on the real wire, each session a container of its task's image (the task's
environment with the wrapper's layer, `cli.harbor.task_images`), through the emulator in
container mode and the engine: the example tasks with `oracle` (all 1.0) and `nop` (all 0.0),
a verifier that cannot judge, an agent past its timeout, tests the agent cannot read.

One emulator with one runtime per environment, each running its image, and one engine whose
runtimes each serve an environment, as AgentCore has them.
Marked `containers`, run with Podman and with Docker: without that runtime, or where it does
not work, they skip, saying why. The images are built once per machine (cached by name)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.cli.harbor import task_images
from agentcore_rollout.contract import LLMSettings
from agentcore_rollout.harbor.tasks import HarborTask, read_tasks, task_payload
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.containers import (
    ContainerRuntimeError,
    container_engine,
)
from agentcore_rollout.local.stack import LocalStack, environment_arn

from .conftest import ROOT, engine_config
from .factories import flat_config, recorded_samples
from .test_containers import _ours
from .test_containers import engine as engine  # a fixture: Podman, then Docker
from .test_containers import no_container_left as no_container_left  # a fixture
from .test_traces import _runs

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


async def _roll_out(
    emulator, moto, channel, engine, images, tasks, solution: bool = True, **settings: object
) -> dict[str, object]:
    """Every task (with its solution: `oracle`'s rows) through one engine and one emulator
    with a runtime per environment, each its image's (as `LocalStack(environments=)` and
    AgentCore have them), and the emulator's other `settings`: outcome by task name."""
    arns = {environment: environment_arn(environment) for environment in images}
    emu = await emulator(
        mode="container",
        container_engine=engine.name,
        runtime_arns=tuple(arns.values()),
        runtime_images=tuple(f"{arns[e]}={image}" for e, image in images.items()),
        **settings,
    )
    runtimes = [{"arn": arn, "environment": e} for e, arn in arns.items()]
    config = engine_config(moto, channel, emu, rollout_timeout=90)
    config = type(config).model_validate(
        config.model_dump(exclude={"runtime_arn"}) | {"runtimes": runtimes}
    )
    started: dict[str, str] = {}  # task -> the runtime its session started on
    async with RolloutEngine(config) as rollouts:
        handles = [
            rollouts.submit(
                RolloutRequest(task_payload(t, solution=solution), input_id=t.name),
                on_start=lambda s: started.__setitem__(s.request.input_id, s.endpoint),
            )
            for t in tasks
        ]
        outcomes = {o.request.input_id: o for o in [await h for h in handles]}
    by_name = {t.name: t for t in tasks}
    assert {n: e.split("#")[0] for n, e in started.items()} == {
        n: arns[by_name[n].environment] for n in started
    }  # each in its own environment's runtime
    return outcomes


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_the_example_tasks_score_as_their_agent_says(
    engine, agent, reward, emulator, moto, channel, no_container_left
):
    """oracle runs each task's solve.sh: every task 1.0; nop does nothing: every task 0.0. Two
    tasks share one environment, so three images serve four tasks."""
    tasks = read_tasks(EXAMPLES)
    images = task_images(tasks, agent, engine).images
    assert len(images) == 3
    outcomes = await _roll_out(
        emulator, moto, channel, engine, images, tasks, solution=agent == "oracle"
    )
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
    images = task_images(
        tasks, "oracle", engine
    ).images  # the examples' shared image: built already
    assert len(images) == 1
    outcomes = await _roll_out(emulator, moto, channel, engine, images, tasks)
    no_reward = outcomes["no-reward"]
    assert no_reward.outcome is Outcome.VERIFIER_ERROR and no_reward.reward is None
    assert no_reward.error.startswith("verifier: VerifierError: the tests wrote no reward")
    assert no_reward.error.endswith("(test.sh exit 3); its output ended:\ncollecting tests")
    slow = outcomes["outlives-timeout"]
    assert slow.outcome is Outcome.TIMEOUT and slow.reward is None
    assert "agent oracle ran past its 2s limit: its process group was killed" in slow.error
    peek = outcomes["peeks-at-tests"]
    assert (peek.outcome, peek.reward) == (Outcome.OK, 1.0)  # /tests was empty as it ran


@pytest.mark.timeout(900)  # SmolLM2 on 2 cores: Claude Code's first reply alone takes ~3 min
@pytest.mark.parametrize("agent", ["mini-swe-agent", "claude-code"])
async def test_a_real_agent_on_the_local_model_is_scored_by_the_tests_with_an_exact_trace(
    agent, tmp_path
):
    """The agent as it ships, in the task's image, calls SmolLM2 through the gateway; whatever
    it does, the task's tests score it, and every token it was given and sampled is in the
    trace exactly as the policy worker recorded it. Once, on the first engine that works."""
    pytest.importorskip("torch")
    from .smollm2 import model_dir

    try:
        engine = container_engine("auto")
    except ContainerRuntimeError as e:
        pytest.skip(f"no container runtime here: {e}")
    (task,) = [t for t in read_tasks(EXAMPLES) if t.name == "write-greeting"]
    images = task_images([task], agent, engine).images
    local = LocalConfig(
        mode="container",
        container_engine=engine.name,
        policy=str(model_dir()),
        policy_workers=1,  # its recorded generations are all there are
        max_context=4096,  # as configs/harbor-local.yaml: a turn within a few minutes
        record_samples=True,
        bucket=f"harbor-{agent}",
        queue=f"harbor-{agent}",
    )
    async with LocalStack(local, environments=images) as stack:
        base = flat_config(exp_id=f"harbor-{agent}", rollout_timeout=900.0)
        # A reply's length where the agent asks none (mini-swe-agent): SmolLM2 at temperature
        # 1 may otherwise write to the end of its context, minutes a turn. Claude Code asks.
        bounded = LLMSettings(base_url=f"{stack.gateways[0].url}/v1", sampling={"max_tokens": 384})
        async with RolloutEngine(stack.engine_config(base, llm=bounded)) as rollouts:
            batch = await rollouts.rollout([RolloutRequest(task_payload(task), task.name)])
        recorded = await recorded_samples(stack)
    (outcome,) = batch.outcomes
    assert outcome.outcome is Outcome.OK, outcome.error
    trajectory = outcome.result.trajectory
    assert trajectory["agent"] == agent and trajectory["verifier_exit"] == 0
    assert outcome.reward in (0.0, 1.0)  # the tests' verdict, whatever the model managed
    trace = outcome.trace
    assert trace["token_capture"] is True and trace["num_turns"] >= 1
    by_prompt: dict[tuple[int, ...], list[dict]] = {}  # a client's retry samples a prompt again
    for generation in recorded:
        by_prompt.setdefault(tuple(generation["input_ids"]), []).append(generation)
    for sample in trace["samples"]:
        ids, lps = sample["response_ids"], sample["logprobs"]
        for start, end in _runs(sample["loss_mask"]):
            same = by_prompt.get(tuple(sample["prompt_ids"] + ids[:start]), [])
            worker = next((w for w in same if w["output_ids"] == ids[start:end]), None)
            assert worker is not None, "each sampled run is a generation the worker recorded"
            same.remove(worker)
            assert worker["output_logprobs"] == lps[start:end]
    by_prompt = {prompt: left for prompt, left in by_prompt.items() if left}
    assert not by_prompt, "every generation the worker recorded is in the trace"
    # veRL's rows of it, as `rollout.mode=agentcore` makes them: the tests' reward on each
    pytest.importorskip("verl")
    from agentcore_rollout.integrations.verl.convert import agent_loop_outputs

    rows = agent_loop_outputs(outcome)
    assert len(rows) == sum(s.get("delivered", True) for s in trace["samples"]) >= 1
    assert all(r.reward_score == outcome.reward for r in rows)
    assert {tuple(r.prompt_ids) for r in rows} <= {tuple(s["prompt_ids"]) for s in trace["samples"]}


@pytest.mark.timeout(900)
async def test_32_task_containers_started_at_once_all_end_ok(emulator, moto, channel):
    """32 sessions of one task (oracle) start together on this machine's cores: each waits
    for its health check as long as the starts around it share the cores
    (`agent_ready_timeout` scaled by the starts per core), and every one ends `ok`. Once, on
    the first engine that works."""
    try:
        engine = container_engine("auto")
    except ContainerRuntimeError as e:
        pytest.skip(f"no container runtime here: {e}")
    (task,) = [t for t in read_tasks(EXAMPLES) if t.name == "write-greeting"]
    images = task_images([task], "oracle", engine).images
    arn = environment_arn(task.environment)
    emu = await emulator(
        mode="container",
        container_engine=engine.name,
        runtime_arns=(arn,),
        runtime_images=(f"{arn}={images[task.environment]}",),
    )
    config = engine_config(
        moto,
        channel,
        emu,
        runtime_arn=arn,
        rollout_timeout=600,
        session_start_time=2.0,  # 25 starts a second: 50 may be starting at once
    )
    requests = [
        RolloutRequest(task_payload(task, solution=True), input_id=f"copy-{i}") for i in range(32)
    ]
    async with RolloutEngine(config) as rollouts:
        batch = await rollouts.rollout(requests)
    assert {o.outcome for o in batch.outcomes} == {Outcome.OK}, [
        o.error for o in batch.outcomes if o.outcome is not Outcome.OK
    ][:3]
    assert emu.sessions.starting.peak == 32  # all of them starting at once
    starts = [o.result.timings.received - o.started_at for o in batch.outcomes]
    print(
        f"32 containers at once: slowest start {max(starts):.1f}s, median {sorted(starts)[16]:.1f}s"
    )
    assert all(o.reward == 1.0 for o in batch.outcomes)
    assert _ours(engine) == []
