"""Starting a child of the local stack waits for progress, not a fixed minute
(`serving.process.ServiceProcess`): a child still loading, busy on the CPU or printing, is kept
past the bound that a child that does nothing is killed at, and the error says which bound was
reached, what was starting and the setting that changes it. The bounds here are seconds, set as
`local.start_stall_seconds` and `local.start_limit_seconds` set them, so the test does not take
the default minute."""

from __future__ import annotations

import os
import time
from pathlib import Path

import aiohttp
import pytest

from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.stack import LocalStack
from agentcore_rollout.serving.process import ServiceProcess

pytestmark = pytest.mark.component

STALL = 2.0  # seconds: the bound under test, for a child that would otherwise take 60

CHILDREN = {
    # Loading as a model does: CPU-bound, silent, for 3 bounds, then its URL.
    "busy_child": """
import time
end = time.process_time() + {busy}
while time.process_time() < end:
    sum(range(1000))
print("http://127.0.0.1:1", flush=True)
""",
    # Waiting on something, printing progress as model loaders do (tqdm on stderr), no CPU.
    "talking_child": """
import sys, time
for i in range(6):
    print(f"loading {{i}}/6", file=sys.stderr, flush=True)
    time.sleep(1)
print("http://127.0.0.1:2", flush=True)
""",
    # Hung: no output, no CPU.
    "hung_child": """
import time
time.sleep(3600)
""",
}


@pytest.fixture
def children(tmp_path: Path) -> dict[str, str]:
    for name, source in CHILDREN.items():
        (tmp_path / f"{name}.py").write_text(source.format(busy=3 * STALL))
    return {"PYTHONPATH": str(tmp_path)}


@pytest.mark.e2e  # waits out real bounds: make test, not make check
def test_a_child_that_keeps_working_is_waited_for_past_the_stall_bound(
    children: dict[str, str],
) -> None:
    for module, url in (
        ("busy_child", "http://127.0.0.1:1"),
        ("talking_child", "http://127.0.0.1:2"),
    ):
        child = ServiceProcess(f"policy worker ({module})", module, env=children, stall=STALL)
        started = time.monotonic()
        try:
            assert child.start() == url
        finally:
            child.stop()
        assert time.monotonic() - started > 2 * STALL  # it took longer than the bound


def test_a_hung_child_is_killed_at_the_bound_which_the_error_names(
    children: dict[str, str],
) -> None:
    child = ServiceProcess("policy worker 0", "hung_child", env=children, stall=STALL)
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        child.start()
    waited = time.monotonic() - started
    assert STALL <= waited < STALL + 5
    message = str(raised.value)
    assert message.startswith("policy worker 0 did not start: killed after no progress")
    assert f"for {STALL:g} s" in message and "local.start_stall_seconds" in message
    assert child.pid is None  # stopped


def test_a_child_busy_past_the_limit_is_killed_naming_the_limit(children: dict[str, str]) -> None:
    child = ServiceProcess("gateway 0", "busy_child", env=children, stall=60, limit=STALL)
    with pytest.raises(RuntimeError) as raised:
        child.start()
    message = str(raised.value)
    assert message.startswith("gateway 0 did not start: killed after no URL after 2 s")
    assert "local.start_limit_seconds" in message


def test_the_stack_hands_its_settings_to_every_child() -> None:
    config = LocalConfig(start_stall_seconds=300, start_limit_seconds=7200, policy_workers=2)
    stack = LocalStack(config)
    assert (stack.moto.stall, stack.moto.limit) == (300, 7200)
    assert {(w.stall, w.limit) for w in stack._workers()} == {(300, 7200)}


SLOW_POLICY = """
import sys, time
end = time.process_time() + {busy}  # loading, as a model on a busy machine does: silent, on CPU
while time.process_time() < end:
    sum(range(1000))
from agentcore_rollout.local.policy.__main__ import main
main(sys.argv[1:])
"""


@pytest.mark.e2e  # waits out real bounds: make test, not make check
async def test_the_stack_comes_up_with_a_policy_worker_slower_than_its_stall_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local stack, its policy worker taking 3 of its stall bounds to load (as SmolLM2 took
    more than the minute on a busy machine): it is waited for, and the stack serves. Only the
    worker's bound is small: on a loaded machine the other children may pause for seconds."""
    (tmp_path / "slow_policy.py").write_text(SLOW_POLICY.format(busy=3 * STALL))
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    workers = LocalStack._workers

    def slow_workers(self: LocalStack) -> list[ServiceProcess]:
        made = workers(self)
        for worker in made:
            worker._argv[2] = "slow_policy"  # python -m slow_policy <the worker's flags>
            worker.stall = STALL  # its bound only: moto, the gateway and the emulator keep 60 s
        return made

    monkeypatch.setattr(LocalStack, "_workers", slow_workers)
    config = LocalConfig(
        app="examples.math_agent.app:app",
        mode="in_process",
        policy_workers=1,
        bucket="slow",
        queue="slow",
    )
    started = time.monotonic()
    async with LocalStack(config) as stack, aiohttp.ClientSession() as http:
        assert time.monotonic() - started > 2 * STALL
        async with http.get(f"{stack.workers[0].url}/health") as health:
            assert health.status == 200
