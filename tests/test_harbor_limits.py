"""A Harbor task's limits, enforced in its local containers (`local.mode: container`): its
`cpus` and `memory_mb` bound its session container's cgroup, and `network_mode = "no-network"`
puts it on the internal network, where it reaches nothing but what the emulator relays for it
(moto, for its result) while a public task's container reaches the same listener.

The probe is a listener on the address the engine's containers reach the host at (Podman:
the host's own address; Docker: its bridge's gateway), on a port no relay serves: no traffic
leaves the machine."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcore_rollout import Outcome
from agentcore_rollout.cli.args import main
from agentcore_rollout.cli.harbor import task_images
from agentcore_rollout.harbor.tasks import read_tasks
from agentcore_rollout.local.config import ContainerLimits, EmulatorConfig
from agentcore_rollout.local.containers import (
    BASE_IMAGE,
    LABEL,
    ContainerEngine,
    debian_base,
    internal_network,
    isolate_ports,
    storage_quota,
)
from agentcore_rollout.local.stack import environment_arn

from .conftest import ROOT
from .test_containers import engine as engine  # a fixture: Podman, then Docker
from .test_containers import no_container_left as no_container_left  # a fixture
from .test_harbor_containers import SHARED, _roll_out

_SOLVE = """#!/bin/bash
python3 - <<'EOF' > /app/probe
import socket
seen = []
for host in {hosts!r}:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, {port}))
        seen.append("reached")
    except OSError as e:
        seen.append(type(e).__name__)
print("reached" if "reached" in seen else "blocked", *seen)
EOF
"""
_TEST = """#!/bin/bash
mem=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
v1=/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes
swap=$(cat /sys/fs/cgroup/memory.swap.max 2>/dev/null || echo $(( $(cat $v1) - mem )))
cpu=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || \
  echo "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)")
probe=$(cut -d' ' -f1 /app/probe)
echo "memory $mem swap $swap cpu $cpu probe $(cat /app/probe)"
if [ "$probe" = "{probe}" ] && {limits}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.fixture
def listener(engine: ContainerEngine) -> Iterator[tuple[str, int, list[str]]]:
    """A listener on the host's every address, on a port no relay serves: (the address
    containers reach the host at, the port, the peers it accepted)."""
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(8)
    accepted: list[str] = []

    def accept() -> None:
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            accepted.append(peer[0])
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    yield engine.host, sock.getsockname()[1], accepted
    sock.close()


def _task(into: Path, name: str, toml: str, solve: str, test: str) -> None:
    task = into / name
    shutil.copytree(SHARED, task / "environment")
    (task / "instruction.md").write_text(f"probe {name}\n")
    (task / "task.toml").write_text(f"[verifier]\ntimeout_sec = 30\n{toml}")
    for path, text in (("tests/test.sh", test), ("solution/solve.sh", solve)):
        (task / path).parent.mkdir(exist_ok=True)
        (task / path).write_text(text)


@pytest.mark.containers
@pytest.mark.e2e
async def test_a_no_network_task_reaches_nothing_but_writes_its_result(
    engine, listener, emulator, moto, channel, no_container_left, tmp_path
):
    """`sealed` (cpus 1, memory 512 MB and no swap, no-network) is blocked from the listener,
    at the host's address and at the internal network's gateway (where the relay is), and
    bounded;
    `open` (no limits, public) reaches it; both end ok with their verifier's reward 1, so the
    sealed one's result still reached moto through the internal network's relay."""
    host, port, accepted = listener
    gateway = internal_network(engine).gateway  # where the host's every address is, too
    solve = _SOLVE.format(hosts=[host, gateway], port=port)
    sealed = '[ "$mem" = "536870912" ] && [ "$swap" = 0 ] && [ "$cpu" = "100000 100000" ]'
    _task(
        tmp_path,
        "sealed",
        '[environment]\ncpus = 1\nmemory_mb = 512\nnetwork_mode = "no-network"\n',
        solve,
        _TEST.format(probe="blocked", limits=sealed),
    )
    solve = _SOLVE.format(hosts=[host], port=port)
    _task(tmp_path, "open", "", solve, _TEST.format(probe="reached", limits="true"))
    tasks = read_tasks(tmp_path)
    built = task_images(tasks, "oracle", engine)
    assert not built.failed, built.failed
    limits = {
        e: ContainerLimits(cpus=r.cpus, memory_mb=r.memory_mb, network=r.network_mode)
        for e, r in built.resources.items()
    }
    outcomes = await _roll_out(
        emulator,
        moto,
        channel,
        engine,
        built.images,
        tasks,
        runtime_limits=tuple(f"{environment_arn(e)}={lim.text()}" for e, lim in limits.items()),
    )
    assert {n: (o.outcome, o.reward) for n, o in outcomes.items()} == {
        "sealed": (Outcome.OK, 1.0),
        "open": (Outcome.OK, 1.0),
    }, {n: (o.error, o.result and o.result.trajectory) for n, o in outcomes.items()}
    assert len(accepted) == 1, accepted  # the open task's probe alone


@pytest.mark.containers
@pytest.mark.e2e
def test_run_gives_each_environment_its_tasks_limits(engine, listener, tmp_path, capfd):
    """`agentcore-rollout run` on a folder of tasks (Podman): the stack's emulator is given
    each environment's limits, so the no-network task is blocked and bounded, the public one
    is not, both end ok; a storage_mb this machine cannot bound is one warning line (the
    emulator's)."""
    if engine.name != "podman":
        pytest.skip("run's local stack is tested with Podman")
    host, port, accepted = listener
    solve = _SOLVE.format(hosts=[host, internal_network(engine).gateway], port=port)
    sealed = '[ "$mem" = "268435456" ] && [ "$swap" = 0 ] && [ "$cpu" = "50000 100000" ]'
    toml = "[environment]\ncpus = 0.5\nmemory_mb = 256\nstorage_mb = 512\n"
    toml += 'network_mode = "no-network"\n'
    data = tmp_path / "data"
    _task(data, "sealed", toml, solve, _TEST.format(probe="blocked", limits=sealed))
    solve = _SOLVE.format(hosts=[host], port=port)
    _task(data, "open", "", solve, _TEST.format(probe="reached", limits="true"))
    out = tmp_path / "out"
    code = main(
        [
            *("run", "--config", str(ROOT / "configs" / "harbor-local.yaml")),
            *("--data", str(data), "--out", str(out), "local.policy=toy"),
        ]
    )
    said = capfd.readouterr()  # the emulator's lines too (a child's stderr)
    assert code == 0, said.err[-3000:]
    rows = {r["input_id"]: r for r in map(json.loads, (out / "rollouts.jsonl").open())}
    assert {n: (r["outcome"], r["reward"]) for n, r in rows.items()} == {
        "sealed": ("ok", 1.0),
        "open": ("ok", 1.0),
    }, rows
    assert len(accepted) == 1, accepted
    why = storage_quota(engine)
    warned = [line for line in (said.out + said.err).splitlines() if "storage_mb" in line]
    assert len(warned) == (0 if why is None else 1), warned


@pytest.mark.unit
def test_limits_are_written_and_read_back_and_bad_ones_refused():
    limits = ContainerLimits(cpus=0.5, memory_mb=512, network="no-network")
    assert ContainerLimits.parse(limits.text()) == limits
    assert ContainerLimits.parse("") == ContainerLimits()
    config = EmulatorConfig(mode="container", image="i", runtime_limits=(f"arn:x={limits.text()}",))
    assert config.limits_of("arn:x") == limits
    assert config.limits_of("arn:y") == ContainerLimits()
    for bad, said in [
        ("arn:x=cpus=0", "cpus"),
        ("arn:x=network=none", "network"),
        ("arn:x=disk=1", "disk"),
        ("arn:x", "not ARN=LIMITS"),
    ]:
        with pytest.raises(ValueError, match=said):
            EmulatorConfig(mode="container", image="i", runtime_limits=(bad,))


@pytest.mark.containers
@pytest.mark.e2e
def test_no_network_containers_cannot_reach_each_other(engine):
    """On the internal network, as microVMs cannot: a container started after another (its
    port isolated once it runs, as the emulator does before a session's first invocation)
    does not reach the first's 8080, which the host (the emulator) still reaches."""
    net = internal_network(engine)
    debian_base(engine)
    on_network = ("--network", net.name, "--label", f"{LABEL}=isolation")
    serve = ("python3", "-m", "http.server", "8080")
    server = engine.run("run", "-d", "--rm", *on_network, BASE_IMAGE, *serve).stdout.strip()
    probe = ""
    try:
        template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        address = engine.run("inspect", "--format", template, server).stdout.strip()
        give_up = time.monotonic() + 30
        while True:  # until it listens, as the host (the emulator) sees it
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://{address}:8080/", timeout=2).close()
                break
            assert time.monotonic() < give_up, f"the host never reached {address}:8080"
            time.sleep(0.2)
        code = f"import time,socket;time.sleep(3);s=socket.socket();s.settimeout(3);{_CONNECT}"
        probe = engine.run(
            "run", "-d", *on_network, BASE_IMAGE, "python3", "-c", code, address
        ).stdout.strip()
        if net.bridge:
            isolate_ports(net.bridge)
        engine.run("wait", probe, timeout=60)
        said = engine.run("logs", probe).stdout.strip()
        assert said.startswith("blocked"), said
        urllib.request.urlopen(f"http://{address}:8080/", timeout=5).close()  # the host still
    finally:
        engine.remove(*(c for c in (server, probe) if c))


_CONNECT = (
    "import sys\ntry:\n s.connect((sys.argv[1], 8080)); print('reached')\n"
    "except OSError as e:\n print('blocked', type(e).__name__)"
)
