"""`ContainerRuntime`: the conformance suite on containers of an image serving
`tests.agents.basic:app`, then what only containers do: their start failures named, a dead one
replaced, their bounds, none left behind.

The image is this checkout's package and test agents on top of the agent's image (`make
containers` builds it; else the test session builds it from the example's Dockerfile), built
in seconds. Run with Podman, then Docker: without one, or where it does not work, those tests
skip, saying why (the `engine` fixture of tests/test_containers.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout.contract import WARM_UP_PAYLOAD
from agentcore_rollout.local.containers import AGENT_IMAGE, ContainerEngine, build_image
from agentcore_rollout.local.moto import MotoServer
from agentcore_rollout.runtimes import ContainerRuntime, SessionCallError
from agentcore_rollout.runtimes.containers import RUNTIME_LABEL, SESSION_LABEL

from ..conftest import ROOT, agent_env
from ..test_containers import agent_image as agent_image  # a fixture: the example's image
from ..test_containers import engine as engine  # a fixture: Podman, then Docker
from .conformance import Leftovers, Results, RuntimeConformance
from .conformance import results as results  # a fixture

pytestmark = pytest.mark.unit

BASIC_IMAGE = "localhost/agentcore-rollout-basic:test"
SERVE = '["python", "-m", "agentcore_rollout.agent.serve", "tests.agents.basic:app", '
SERVE += '"--host", "0.0.0.0", "--port", "8080"]'


@pytest.fixture(scope="session")
def basic_image(
    engine: ContainerEngine,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """The agent's image with this checkout's package and test agents on top, serving the
    basic agent (no package installed: built in seconds)."""
    built = engine.image_exists(AGENT_IMAGE)
    base = AGENT_IMAGE if built else request.getfixturevalue("agent_image")
    context = tmp_path_factory.mktemp("basic-image")
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "agentcore_rollout", context / "agentcore_rollout", ignore=skip)
    shutil.copytree(ROOT / "tests" / "agents", context / "tests" / "agents", ignore=skip)
    (context / "tests" / "__init__.py").touch()
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY agentcore_rollout /app/agentcore_rollout\nCOPY tests /app/tests\n"
        f"CMD {SERVE}\n"
    )
    build_image(context / "Dockerfile", BASIC_IMAGE, context, engine=engine, log=None)
    return BASIC_IMAGE


@pytest.fixture(scope="module")
def moto(moto: MotoServer, engine: ContainerEngine) -> Iterator[MotoServer]:
    """Podman's containers reach the host's loopback; Docker's reach the host on its bridge
    only, so theirs is a moto listening on every address."""
    if engine.name == "podman":
        yield moto
        return
    with MotoServer(host="0.0.0.0") as server:
        yield server


@pytest.fixture
def engine_env(engine: ContainerEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's environment as the test session's engine has it (Podman's containers.conf)."""
    for name in ("CONTAINERS_CONF",):
        if name in engine.env:
            monkeypatch.setenv(name, engine.env[name])


@pytest.fixture
async def made(engine: ContainerEngine, engine_env: None) -> AsyncIterator[list[ContainerRuntime]]:
    """The test's runtimes: closed after it, which leaves none of their containers."""
    runtimes: list[ContainerRuntime] = []
    yield runtimes
    for runtime in runtimes:
        await runtime.aclose()
    assert _containers(engine, {r.owner for r in runtimes}) == []


@pytest.fixture
def make_runtime(
    made: list[ContainerRuntime], engine: ContainerEngine, basic_image: str, moto: MotoServer
) -> Callable[..., ContainerRuntime]:
    """Runtimes of the basic agent's image, its results written to moto."""

    def make(image: str = basic_image, **kwargs: Any) -> ContainerRuntime:
        env = {k: v for k, v in agent_env(moto).items() if k != "PYTHONPATH"}
        made.append(runtime := ContainerRuntime(image, engine=engine.name, env=env, **kwargs))
        return runtime

    return make


@pytest.fixture
def runtime(make_runtime: Callable[..., ContainerRuntime]) -> ContainerRuntime:
    return make_runtime()


@pytest.fixture
def broken_runtime(make_runtime: Callable[..., ContainerRuntime]) -> ContainerRuntime:
    return make_runtime("localhost/agentcore-rollout-no-such-image:test")


@pytest.fixture
def leftovers(engine: ContainerEngine, made: list[ContainerRuntime]) -> Leftovers:
    async def left() -> list[str]:
        return await asyncio.to_thread(_containers, engine, {r.owner for r in made})

    return left


def _containers(engine: ContainerEngine, owners: set[str]) -> list[str]:
    """The containers, running or not, of the runtimes `owners` names."""
    if not (ids := engine.run("ps", "-aq", "--filter", f"label={RUNTIME_LABEL}").stdout.split()):
        return []
    template = '{{.Id}} {{index .Config.Labels "' + RUNTIME_LABEL + '"}}'
    shown = engine.run("inspect", "--format", template, *ids)  # some may be gone by now
    found = (line.split(" ", 1) for line in shown.stdout.splitlines() if " " in line)
    return [cid[:12] for cid, owner in found if owner in owners]


def _by_session(engine: ContainerEngine, sid: str) -> list[str]:
    return engine.run("ps", "-q", "--filter", f"label={SESSION_LABEL}={sid}").stdout.split()


@pytest.mark.containers
@pytest.mark.e2e
class TestConformance(RuntimeConformance):
    pass


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_container_that_ends_before_it_is_healthy_is_named(
    engine: ContainerEngine,
    basic_image: str,
    make_runtime: Callable[..., ContainerRuntime],
    results: Results,
    leftovers: Leftovers,
    tmp_path: Path,
) -> None:
    """Its code and last line, not retryable, nothing left to stop."""
    (tmp_path / "Dockerfile").write_text(
        f'FROM {basic_image}\nCMD ["python", "-c", "print(\'no agent here\'); exit(3)"]\n'
    )
    image = f"{basic_image}-exits"
    build_image(tmp_path / "Dockerfile", image, tmp_path, engine=engine, log=None)
    sid = results.session()
    with pytest.raises(SessionCallError) as raised:
        await make_runtime(image).invoke(sid, results.payload(sid, "r1"))
    assert raised.value.code == "ContainerExited"
    assert "code 3" in str(raised.value) and "no agent here" in str(raised.value)
    assert not raised.value.retryable and not raised.value.maybe_started
    assert await leftovers() == []


@pytest.fixture(scope="session")
def silent_image(
    engine: ContainerEngine, basic_image: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """Its container runs, idle, and never answers `/ping`."""
    context = tmp_path_factory.mktemp("silent-image")
    sleep = '["python", "-c", "import time; time.sleep(3600)"]'
    (context / "Dockerfile").write_text(f"FROM {basic_image}\nCMD {sleep}\n")
    image = f"{basic_image}-silent"
    build_image(context / "Dockerfile", image, context, engine=engine, log=None)
    return image


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_container_that_makes_no_progress_is_given_up(
    silent_image: str,
    make_runtime: Callable[..., ContainerRuntime],
    results: Results,
    leftovers: Leftovers,
) -> None:
    """Running, using no CPU, never healthy: given up `ready_timeout` after its last progress,
    removed, not retryable."""
    sid = results.session()
    runtime = make_runtime(silent_image, ready_timeout=3.0)
    with pytest.raises(SessionCallError) as raised:
        await runtime.invoke(sid, results.payload(sid, "r1"))
    assert raised.value.code == "NotHealthy" and "without progress" in str(raised.value)
    assert not raised.value.retryable and not raised.value.maybe_started
    assert await leftovers() == []


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_stop_while_its_container_starts_leaves_nothing(
    engine: ContainerEngine,
    silent_image: str,
    make_runtime: Callable[..., ContainerRuntime],
    results: Results,
    leftovers: Leftovers,
) -> None:
    """The invocation waiting for it to be healthy fails, saying nothing is left to stop."""
    sid = results.session()
    runtime = make_runtime(silent_image)
    invoking = asyncio.ensure_future(runtime.invoke(sid, results.payload(sid, "r1")))
    while not _by_session(engine, sid):  # running
        assert not invoking.done()
        await asyncio.sleep(0.1)
    await runtime.stop(sid)
    with pytest.raises(SessionCallError) as raised:
        await invoking
    assert raised.value.code == "Stopped" and not raised.value.maybe_started
    assert await leftovers() == []


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_session_whose_container_died_gets_a_new_one(
    engine: ContainerEngine, runtime: ContainerRuntime, results: Results
) -> None:
    """Killed after it was healthy: the next invocation (the engine's retry) fails retryable
    or starts a new container, never waits on the dead one."""
    sid = results.session()
    await runtime.invoke(sid, results.payload(sid, "r1", mode="instance"))
    first = (await results.get("r1")).trajectory
    assert engine.run("kill", *_by_session(engine, sid)).returncode == 0
    for attempt in range(30):
        try:
            await runtime.invoke(sid, results.payload(sid, f"r2-{attempt}", mode="instance"))
            break
        except SessionCallError as e:  # before its CLI process saw it end: the call cut off
            assert e.retryable and e.maybe_started
            await asyncio.sleep(1)
    else:
        pytest.fail("no new container in 30 invocations")
    again = (await results.get(f"r2-{attempt}")).trajectory
    assert again != first  # another process
    assert len(_by_session(engine, sid)) == 1
    await runtime.stop(sid)


@pytest.mark.containers
@pytest.mark.e2e
async def test_containers_are_bounded_and_closing_removes_them_all(
    engine: ContainerEngine,
    make_runtime: Callable[..., ContainerRuntime],
    results: Results,
    leftovers: Leftovers,
) -> None:
    runtime = make_runtime(cpus=0.5, memory_mb=256)
    sessions = [results.session(), results.session()]
    for i, sid in enumerate(sessions):
        await runtime.invoke(sid, results.payload(sid, f"r{i}", mode="instance"))
    (container,) = _by_session(engine, sessions[0])
    template = "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}"
    bounds = engine.run("inspect", "--format", template, container).stdout.split()
    assert bounds == [str(5 * 10**8), str(256 * 2**20)]
    assert len(await leftovers()) == 2
    await runtime.aclose()
    assert await leftovers() == []


_KILLED = """
import asyncio, sys
from agentcore_rollout.contract import WARM_UP_PAYLOAD
from agentcore_rollout.runtimes import ContainerRuntime

async def main():
    runtime = ContainerRuntime(sys.argv[1], engine=sys.argv[2])
    await runtime.invoke("killed-" + "k" * 33, WARM_UP_PAYLOAD)
    print(runtime.owner, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_killed_processs_containers_go_at_the_next_start_and_a_live_ones_stay(
    engine: ContainerEngine, make_runtime: Callable[..., ContainerRuntime], basic_image: str
) -> None:
    """A process killed before `aclose` leaves its container running; the next runtime's
    first start removes it, and not the container of a runtime still running."""
    live = make_runtime()
    await live.invoke("live-" + "l" * 35, WARM_UP_PAYLOAD)
    killed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED, basic_image, engine.name,
        env={**os.environ, **engine.env}, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert killed.stdout is not None
    owner = (await asyncio.wait_for(killed.stdout.readline(), 120)).decode().strip()
    killed.kill()
    await killed.wait()
    assert len(_containers(engine, {owner})) == 1  # left behind by the kill

    await make_runtime().invoke("next-" + "n" * 35, WARM_UP_PAYLOAD)
    assert _containers(engine, {owner}) == []
    assert len(_containers(engine, {live.owner})) == 1


async def test_no_engine_is_named_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no podman on it
    async with ContainerRuntime("localhost/any:image") as runtime:
        with pytest.raises(SessionCallError) as raised:
            await runtime.invoke("s" * 40, b"{}")
    assert raised.value.code == "EngineNotFound"
    assert not raised.value.retryable and not raised.value.maybe_started


async def test_the_limits_say_where_they_come_from() -> None:
    cores = os.cpu_count() or 1
    limits = await ContainerRuntime("localhost/a:b").limits()
    assert (limits.max_live_sessions, limits.pool) == (cores, "podman:localhost/a:b")
    assert "podman on this machine" in limits.source
    given = ContainerRuntime("localhost/a:b", engine="docker", max_live_sessions=3, pool="here")
    limits = await given.limits()
    assert (limits.max_live_sessions, limits.pool) == (3, "here")
    assert given.name == "docker:localhost/a:b"
    with pytest.raises(ValueError, match="none of podman, docker"):
        ContainerRuntime("localhost/a:b", engine="lxc")
