"""The container executor (`local.mode: container`) on the real wire: the example's image built
once per test session, sessions as containers of it, its named failures, no container left.

Marked `containers`, and run once with Podman and once with Docker: without that runtime, or
where it does not work, they skip, saying why. The checks of a missing runtime and the relay
Docker's containers reach the host through need none and always run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.contract import session_id
from agentcore_rollout.local import containers
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.containers import (
    BASE_IMAGE,
    LABEL,
    SESSION_LABEL,
    ContainerEngine,
    ContainerRuntimeError,
    ImageBuildError,
    build_image,
    container_engine,
)
from agentcore_rollout.local.stack import LocalStack
from agentcore_rollout.runtimes._owner import gone, owner_label

from .conftest import ROOT, engine_config
from .factories import flat_config

pytestmark = pytest.mark.unit

TEST_IMAGE = "localhost/agentcore-rollout-agent:test"
MATH = [
    {"question": "What is 6 + 6?", "answer": 12},
    {"question": "What is 7 - 6?", "answer": 1},
    {"question": "What is 2 + 3?", "answer": 5},
    {"question": "What is 9 - 4?", "answer": 5},
]


@pytest.fixture(scope="session", params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> ContainerEngine:
    try:
        return container_engine(request.param)
    except ContainerRuntimeError as e:
        pytest.skip(f"no {request.param} here: {e}")


@pytest.fixture(scope="session")
def agent_image(engine: ContainerEngine) -> str:
    """The example's image, built once per test session and engine (its base once per
    machine and engine)."""
    build_image(ROOT / "examples/math_agent/Dockerfile", TEST_IMAGE, ROOT, engine=engine)
    return TEST_IMAGE


def _small_image(engine: ContainerEngine, tmp_path: Path, lines: str) -> str:
    """An image of a few lines on the Debian base (built in seconds: no package installed)."""
    containers.debian_base(engine)
    image = f"localhost/agentcore-rollout-test-{uuid.uuid4().hex[:8]}"
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n{lines}\n")
    build_image(tmp_path / "Dockerfile", image, tmp_path, engine=engine)
    return image


FAKE = "agentcore-rollout.test-fake"
"""On the containers the orphan-sweep test labels as emulators' (gone ones' too): no leak."""


def _ours(engine: ContainerEngine) -> list[str]:
    """The session containers, running or not, of this process's emulators or of emulators
    gone (a leak, whoever's): not those of another xdist worker's emulator, still running."""
    if not (ids := engine.run("ps", "-aq", "--filter", f"label={LABEL}").stdout.split()):
        return []
    labels = (f'{{{{index .Config.Labels "{name}"}}}}' for name in (FAKE, LABEL))
    shown = engine.run("inspect", "--format", "|".join(("{{.Id}}", *labels)), *ids)
    found = (line.split("|", 2) for line in shown.stdout.splitlines())  # some may be gone
    here = f"/{os.getpid()}/"
    return [
        parts[0][:12]
        for parts in found
        if len(parts) == 3 and parts[1] != "1" and (here in parts[2] or gone(parts[2]))
    ]


@pytest.fixture
def no_container_left(engine: ContainerEngine) -> Iterator[None]:
    yield
    assert _ours(engine) == []


def _stack_config(engine: ContainerEngine, image: str, **overrides: object) -> LocalConfig:
    name = f"c-{uuid.uuid4().hex[:10]}"
    return LocalConfig(
        mode="container",
        container_engine=engine.name,
        image=image,
        policy_workers=1,
        bucket=name,
        queue=name,
        **overrides,
    )


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_batch_runs_one_container_per_session(
    engine, agent_image, no_container_left, tmp_path
):
    """Four sessions at once, each the unmodified image binding 8080 in its own network
    namespace, reaching the gateway and S3/SQS on the host's loopback: each ends ok."""
    config = _stack_config(engine, agent_image, agent_log_dir=str(tmp_path))
    async with LocalStack(config) as stack:
        engine_cfg = stack.engine_config(flat_config(max_live_sessions=8, rollout_timeout=60.0))
        async with RolloutEngine(engine_cfg) as engine:
            batch = await engine.rollout(
                [RolloutRequest(q, input_id=f"m{i}") for i, q in enumerate(MATH)]
            )
    assert [o.outcome for o in batch.outcomes] == [Outcome.OK] * 4, batch.counts
    assert all(o.reward is not None for o in batch.outcomes)
    assert len(list(tmp_path.glob("*.log"))) == 4  # one container per session


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_container_killed_mid_rollout_ends_its_request(
    agent_image, engine, no_container_left
):
    """The killed session's request ends by its deadline (`timeout`, no result); the others
    are untouched. The toy is paced at 2 s a token (its answers may end after one or two), so
    the rollout's first turn is running when its container, answering /ping, is killed."""
    config = _stack_config(engine, agent_image, token_delay=2.0)
    async with LocalStack(config) as stack:
        engine_cfg = stack.engine_config(flat_config(rollout_timeout=40.0, result_grace=1.0))
        requests = [
            RolloutRequest({**q, "max_turns": 1}, input_id=f"m{i}") for i, q in enumerate(MATH[:3])
        ]
        victim = session_id(engine_cfg.exp_id, 0, requests[0].request_id)
        async with RolloutEngine(engine_cfg) as rollouts, aiohttp.ClientSession() as http:
            handles = [rollouts.submit(r) for r in requests]
            await _until_pinged(engine, http, victim)
            await asyncio.sleep(1.0)  # the invocation, forwarded once it answered, accepted
            killed = engine.run("kill", *_by_session(engine, victim))
            assert killed.returncode == 0, killed.stderr
            outcomes = [await h for h in handles]
    assert outcomes[0].outcome is Outcome.TIMEOUT and outcomes[0].result is None
    assert [o.outcome for o in outcomes[1:]] == [Outcome.OK, Outcome.OK]


async def _until_pinged(engine: ContainerEngine, http: aiohttp.ClientSession, sid: str) -> None:
    """Until the session's container answers `GET /ping` on its mapped port."""
    while True:
        if ids := _by_session(engine, sid):
            port = engine.run("port", ids[0], "8080").stdout.strip()
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://{port}/ping") as resp:
                    if port and resp.status == 200:
                        return
        await asyncio.sleep(0.1)


def _by_session(engine: ContainerEngine, sid: str) -> list[str]:
    return engine.run("ps", "-q", "--filter", f"label={SESSION_LABEL}={sid}").stdout.split()


def _sessions(engine: ContainerEngine, ids: list[str]) -> list[str]:
    """Those of `ids` that are some emulator's session containers."""
    template = '{{index .Config.Labels "' + LABEL + '"}}'
    return [c for c in ids if engine.run("inspect", "--format", template, c).stdout.strip()]


@pytest.mark.containers
@pytest.mark.e2e
async def test_failures_are_named(engine, no_container_left, moto, channel, emulator, tmp_path):
    """An image that does not build, a container that exits at start, one that never answers
    /ping: each a one-line error, the start failures the request's `submit_failed`."""
    (tmp_path / "bad").mkdir()
    containers.debian_base(engine)
    before = engine.run("ps", "-aq").stdout.split()
    # podman: "... exit status 3"; docker: "... returned a non-zero code: 3"
    with pytest.raises(ImageBuildError, match=r"did not build: .*(exit status|code:) 3"):
        _small_image(engine, tmp_path / "bad", "RUN exit 3")
    # its step's container removed (other tests' session containers may come and go)
    appeared = [c for c in engine.run("ps", "-aq").stdout.split() if c not in before]
    assert appeared == _sessions(engine, appeared)
    exits = _small_image(engine, tmp_path, 'CMD ["python3", "-c", "raise SystemExit(\'boom\')"]')
    silent = _small_image(engine, tmp_path, 'CMD ["sleep", "600"]')
    try:
        for image, why in [
            (exits, "agent failed to start: container exited with code 1: boom"),
            (silent, "agent failed to start: container not healthy within 3s (GET /ping)"),
        ]:
            emu = await emulator(
                mode="container",
                container_engine=engine.name,
                image=image,
                agent_ready_timeout=3.0,
            )
            async with RolloutEngine(engine_config(moto, channel, emu)) as rollouts:
                (outcome,) = (
                    await rollouts.rollout([RolloutRequest({"a": 1}, input_id="a")])
                ).outcomes
            assert outcome.outcome is Outcome.SUBMIT_FAILED
            assert why in outcome.error and "\n" not in outcome.error
    finally:
        engine.run("rmi", "-f", exits, silent)


def test_a_missing_runtime_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    containers.container_engine.cache_clear()
    try:
        with pytest.raises(ContainerRuntimeError, match=r"no container runtime .*apt-get install"):
            container_engine()
        docker = tmp_path / "docker"  # a client whose daemon is not running
        docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
        docker.chmod(0o755)
        with pytest.raises(ContainerRuntimeError, match="docker is present but not running"):
            container_engine()
        with pytest.raises(ContainerRuntimeError, match=r"no container runtime \(podman\)"):
            container_engine("podman")
        with pytest.raises(ValueError, match="none of auto, podman, docker"):
            container_engine("finch")
    finally:
        containers.container_engine.cache_clear()


def test_an_emulator_without_an_image_is_refused():
    from agentcore_rollout.local.runtime import EmulatorConfig

    with pytest.raises(ValueError, match="mode='container' needs an image"):
        EmulatorConfig(mode="container")


@pytest.mark.containers
@pytest.mark.component
async def test_a_larger_image_starts_slower_by_cold_start_per_gb(engine, agent_image, emulator):
    """`cold_start_per_gb` times the image's size as the engine reports it, read once at the
    emulator's start, on top of `cold_start`."""
    from .conftest import RUNTIME_ARN

    emu = await emulator(
        mode="container",
        container_engine=engine.name,
        app="",
        image=agent_image,
        cold_start=0.25,
        cold_start_per_gb=2.0,
    )
    size = engine.image_bytes(agent_image)
    assert size > 100_000_000  # the example's image: Debian, Python and its venv
    assert emu.sessions.cold_start(RUNTIME_ARN) == pytest.approx(0.25 + 2.0 * size / 1e9)


def test_loopback_urls_point_at_the_host_as_a_container_sees_it():
    # the host at the address its containers reach it at, where the emulator relays these ports
    url = containers.container_url
    assert url("http://127.0.0.1:5000/v1", "192.0.2.7") == "http://192.0.2.7:5000/v1"
    assert url("http://localhost:80", "192.0.2.7") == "http://192.0.2.7:80"
    assert url("https://s3.amazonaws.com", "192.0.2.7") == "https://s3.amazonaws.com"
    assert url("http://127.0.0.1:9/", "172.30.0.1") == "http://172.30.0.1:9/"
    urls = ["http://127.0.0.1:5000/v1", "http://localhost:7000", "https://s3.amazonaws.com:443"]
    assert containers.loopback_ports([*urls, "eu-west-1"]) == {5000, 7000}


_PROBE = """
import json, socket, sys
reached = {}
for address in sys.argv[1:]:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.sendall(b"GET /health HTTP/1.0\\r\\n\\r\\n")
            reached[address] = s.recv(12).decode()
    except OSError as e:
        reached[address] = type(e).__name__
print(json.dumps(reached))
"""


def _reached(engine: ContainerEngine, *addresses: str) -> dict[str, str]:
    """From a session container (on the engine's network, as the emulator runs them), what a
    connection to each `host:port` got: its first bytes, or the error's name."""
    containers.debian_base(engine)
    argv = ("run", "--rm", "--network", engine.network, "--label", f"{LABEL}=probe")
    done = engine.run(*argv, BASE_IMAGE, "python3", "-c", _PROBE, *addresses)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.containers
@pytest.mark.e2e
async def test_an_agent_container_reaches_the_gateway_and_moto_but_not_the_policy(
    engine, agent_image, no_container_left
):
    """Of the host, a session container reaches only the ports its emulator relays for it
    (the gateway's, moto's): not the policy server, the emulator or the host's loopback."""
    async with LocalStack(_stack_config(engine, agent_image)) as stack:
        ports = {
            name: urlsplit(url).port
            for name, url in [
                ("gateway", stack.gateways[0].url),
                ("moto", stack.moto.url),
                ("policy", stack.policy_url),
                ("emulator", stack.emulator.url),
            ]
        }
        host = engine.host
        seen = await asyncio.to_thread(
            _reached,
            engine,
            *(f"{host}:{port}" for port in ports.values()),
            f"10.0.2.2:{ports['policy']}",  # slirp4netns's host loopback, when allowed
            f"127.0.0.1:{ports['policy']}",
        )
    reached = [a for a, got in seen.items() if got.startswith("HTTP/")]
    assert reached == [f"{host}:{ports['gateway']}", f"{host}:{ports['moto']}"], seen


@pytest.mark.containers
@pytest.mark.e2e
def test_session_containers_cannot_reach_each_other(engine):
    """As microVMs cannot: neither at the host loopback port the emulator maps to another's
    8080, nor (Docker) at its address on the bridge, which carries no traffic between its
    containers while the host (the emulator) reaches each. Podman gives each container its
    own slirp4netns network, with no address of another's."""
    containers.debian_base(engine)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    on_network = ("--rm", "--network", engine.network, "--label", f"{LABEL}=icc")
    serve = ("python3", "-m", "http.server", "8080")
    published = ("-p", f"127.0.0.1:{port}:8080")
    server = engine.run("run", "-d", *on_network, *published, BASE_IMAGE, *serve).stdout.strip()
    try:
        template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        address = engine.run("inspect", "--format", template, server).stdout.strip()
        give_up = time.monotonic() + 30
        while True:  # until it listens, as the host (the emulator) sees it
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2),
            ):
                break
            assert time.monotonic() < give_up, f"the host never reached 127.0.0.1:{port}"
            time.sleep(0.1)
        targets = [f"{engine.host}:{port}", f"10.0.2.2:{port}"]
        targets += [f"{address}:8080"] if address else []  # Docker: its bridge address
        seen = _reached(engine, *targets)
        assert not [got for got in seen.values() if got.startswith("HTTP/")], seen
    finally:
        engine.remove(server)


@pytest.mark.containers
@pytest.mark.e2e
def test_the_orphan_sweep_removes_only_a_gone_emulators_containers(engine):
    """An emulator killed before its stop leaves its containers: the next one removes them,
    and leaves those of a live emulator, of another PID namespace or host sharing the daemon
    (whose pids it cannot see), and of any label it cannot read."""
    containers.debian_base(engine)
    mine = owner_label()
    scope, pid, started, _ = mine.split("/")
    gone = 2**22 + 1  # above pid_max's default: no process has it
    labels = {
        f"{scope}/{gone}/{started}/dead": False,  # gone: removed
        f"{scope}/{pid}/{int(started) + 1}/reused": False,  # its pid now another process's
        mine: True,  # live
        f"another-namespace/{gone}/1/ns": True,  # not ours to judge
        f"{gone}-old-format": True,
    }
    ids = {
        engine.run(
            *("run", "-d", "--rm", "--label", f"{LABEL}={label}", "--label", f"{FAKE}=1"),
            *(BASE_IMAGE, "sleep", "60"),
        ).stdout.strip()[:12]: kept
        for label, kept in labels.items()
    }
    try:
        engine.remove_orphans()
        labelled = engine.run("ps", "-aq", "--filter", f"label={LABEL}").stdout.split()
        left = [cid for cid in labelled if cid in ids]  # other tests' run alongside
        assert sorted(left) == sorted(cid for cid, kept in ids.items() if kept)
    finally:
        engine.remove(*ids)
