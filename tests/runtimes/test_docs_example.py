"""docs/runtimes.md's example runtime, the code as the page shows it, passes the conformance
suite: a runtime written from the page alone is one the engine runs on."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout.runtimes import SandboxRuntime

from .conformance import Leftovers, RuntimeConformance
from .conformance import results as results  # a fixture

pytestmark = pytest.mark.component

PAGE = Path(__file__).resolve().parents[2] / "docs" / "runtimes.md"


def _example() -> type[SandboxRuntime]:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    (code,) = [block for block in blocks if "class ProcessRuntime" in block]
    namespace: dict[str, Any] = {"__name__": "docs_runtimes_example"}
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace["ProcessRuntime"]


ProcessRuntime = _example()


@pytest.fixture
async def made() -> AsyncIterator[list[Any]]:
    runtimes: list[Any] = []
    yield runtimes
    for runtime in runtimes:
        await runtime.aclose()


@pytest.fixture
def make_runtime(made: list[Any], agent_endpoints: None) -> Callable[..., SandboxRuntime]:
    """Its sessions serve the basic agent, writing to moto (`agent_endpoints`: this process's
    environment, which they inherit)."""

    def make(app: str = "tests.agents.basic:app", **kwargs: Any) -> SandboxRuntime:
        made.append(runtime := ProcessRuntime(app, **kwargs))
        return runtime

    return make


@pytest.fixture
def runtime(make_runtime: Callable[..., SandboxRuntime]) -> SandboxRuntime:
    return make_runtime()


@pytest.fixture
def broken_runtime(make_runtime: Callable[..., SandboxRuntime]) -> SandboxRuntime:
    return make_runtime("tests.agents.no_such_agent:app")


@pytest.fixture
def leftovers(made: list[Any]) -> Leftovers:
    async def running() -> list[str]:
        return sorted(
            sid
            for runtime in made
            for sid, (process, _) in runtime.sessions.items()
            if process.returncode is None
        )

    return running


class TestConformance(RuntimeConformance):
    pass
