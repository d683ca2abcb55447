"""Harbor tasks' images (`cli.harbor.task_images`) with a real container engine: an
environment that does not build is its own failure, named, with the builder's last line, and
the others build; a separate verifier's environment is built too, with no agent; a second
build finds every layer up to date and builds nothing.

Marked `containers`: without a container runtime that works, it skips, saying why. Small on
purpose (three tiny environments on the Debian base, one build of the wrapper per machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcore_rollout.cli.harbor import task_images
from agentcore_rollout.harbor.agents import AGENT_ENV
from agentcore_rollout.harbor.images import agent_image, environment_image
from agentcore_rollout.harbor.tasks import read_tasks
from agentcore_rollout.local.containers import ContainerRuntimeError, container_engine

pytestmark = [pytest.mark.containers, pytest.mark.e2e]  # builds images: make test, not check


def _task(root: Path, name: str, dockerfile: str, verifier: str | None = None) -> None:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "instruction.md").write_text(f"task {name}\n")
    toml = "[agent]\ntimeout_sec = 60\n"
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    if verifier is not None:
        toml += '[verifier]\nenvironment_mode = "separate"\n'
        (task / "tests" / "Dockerfile").write_text(verifier)
    (task / "task.toml").write_text(toml)


def test_a_bad_environment_fails_alone_a_separate_verifier_is_built_and_then_all_is_cached(
    tmp_path,
):
    try:
        engine = container_engine("auto")
    except ContainerRuntimeError as e:
        pytest.skip(f"no container runtime here: {e}")
    tag = tmp_path.name  # distinct environments, every run
    _task(
        tmp_path,
        "good",
        f"FROM python:3.11-slim\nWORKDIR /app\nRUN echo {tag} > /app/good\n",
        verifier=f"FROM python:3.11-slim\nRUN echo {tag} > /verifier\n",
    )
    _task(tmp_path, "bad", f"FROM python:3.11-slim\nRUN echo {tag} && false\n")
    tasks = {t.name: t for t in read_tasks(tmp_path)}
    good, bad = tasks["good"], tasks["bad"]
    try:
        made = task_images(tasks.values(), "oracle", engine)
        assert set(made.images) == {good.environment, good.verifier_environment}
        assert made.built == set(made.images)
        (why,) = made.failed.values()
        assert set(made.failed) == {bad.environment}
        head, *tail = why.splitlines()
        assert head.startswith(f"environment {bad.environment} (task bad): image ")
        assert "did not build" in head and tail  # the builder's last lines, bounded
        assert len(tail) <= 8 and any("exit status 1" in line for line in [head, *tail])
        verifier = made.images[good.verifier_environment]
        shown = engine.run("image", "inspect", "--format", "{{json .Config.Env}}", verifier)
        assert f"{AGENT_ENV}=nop" in json.loads(shown.stdout)  # the wrapper, no agent
        ran = engine.run("run", "--rm", made.images[good.environment], "cat", "/app/good")
        assert ran.stdout.strip() == tag

        again = task_images(tasks.values(), "oracle", engine)
        assert again.images == made.images and not again.built
        assert again.cached == set(made.images) and set(again.failed) == {bad.environment}
    finally:  # the layers first, then the environments they are on
        envs = [e for t in tasks.values() for e in (t.environment, t.verifier_environment) if e]
        layers = [agent_image(e, a) for e in envs for a in ("oracle", "nop")]
        engine.run("rmi", "-f", *layers, *(environment_image(None, e) for e in envs))
