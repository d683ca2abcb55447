"""The coding agents a Harbor task runs (`agentcore_rollout/harbor/clis.py`): what each launch
is (argv, environment, configuration written), and, end to end, each released agent started from
its launch against the local stack's gateway on the toy policy, its model calls traced.

The e2e tests run the clients `make clients` installs in .clients/ (the image layer installs the
same versions under /opt): each is skipped with the reason when it is missing. The toy policy
writes characters, not code: what is checked is that the agent starts headless from its launch
alone, reaches the policy through the gateway only, and that the gateway traced its turns.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import tomllib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentcore_rollout._engine.gateway_admin import GatewayAdmin
from agentcore_rollout.contract import LLMSettings
from agentcore_rollout.harbor import clis
from agentcore_rollout.harbor.agents import AgentRun, agent_named
from agentcore_rollout.local.config import LocalConfig
from agentcore_rollout.local.stack import LocalStack

from .test_released_clients import LOOPBACK, Proxy

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / ".clients"
KEY = "sk-session-key-0123456789"
URL = "http://127.0.0.1:4321/v1"
TASK = "Create the file out.txt containing hi, using the shell."
NAMES = ["claude-code", "codex", "mini-swe-agent", "openhands"]


def a_run(tmp_path: Path, instruction: str = TASK) -> AgentRun:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    llm = LLMSettings(base_url=URL, model="policy", api_key=KEY)
    return AgentRun(instruction, llm, work, home, tmp_path / "solution")


# -- each launch ---------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_versions_are_the_ones_the_makefile_pins_for_the_released_clients_tests() -> None:
    makefile = (ROOT / "Makefile").read_text()

    def pinned(name: str) -> str:
        found = re.search(rf"^{name}_VERSION := (\S+)$", makefile, re.M)
        assert found, name
        return found.group(1)

    versions = {a.name: a.version for a in clis.CLI_AGENTS}
    assert versions == {
        "claude-code": pinned("CLAUDE_CODE"),
        "codex": pinned("CODEX"),
        "mini-swe-agent": pinned("MINI_SWE_AGENT"),
        "openhands": pinned("OPENHANDS"),
    }


@pytest.mark.unit
@pytest.mark.parametrize("name", NAMES)
def test_each_agent_is_installed_at_its_pin_under_its_own_prefix(name: str) -> None:
    agent = agent_named(name)
    lines = "\n".join(agent.install)
    assert agent.install and all(line.startswith("RUN ") for line in agent.install)
    assert agent.version in lines and f"/opt/{name}" in lines
    assert "/opt/agentcore-rollout" not in lines  # never into the wrapper's venv
    assert agent.calls_model and not agent.needs_solution


@pytest.mark.unit
@pytest.mark.parametrize("name", NAMES)
def test_each_launch_points_at_the_policy_alone_with_its_key_out_of_argv(
    name: str, tmp_path: Path
) -> None:
    run = a_run(tmp_path, "-v looks like a flag")
    launch = agent_named(name).launch(run)
    assert launch.argv[0] == f"/opt/{name}/bin/{Path(launch.argv[0]).name}"
    assert launch.argv[-1] == run.instruction  # the last word: an instruction is never a flag
    assert KEY not in " ".join(launch.argv)
    assert launch.env["HOME"] == str(run.home)
    assert KEY in launch.env.values()
    written = "".join(p.read_text() for p in run.home.rglob("*") if p.is_file())
    urls = re.findall(r"https?://[^\s\"']+", " ".join([*launch.env.values(), written]))
    assert set(urls) == {URL}, urls  # the gateway, and no other endpoint


@pytest.mark.unit
def test_an_instruction_that_looks_like_a_flag_follows_the_end_of_options(tmp_path: Path) -> None:
    for name in ("claude-code", "codex"):
        argv = agent_named(name).launch(a_run(tmp_path, "--help")).argv
        assert argv[-2:] == ["--", "--help"], argv
    argv = agent_named("mini-swe-agent").launch(a_run(tmp_path, "--help")).argv
    assert argv[-2:] == ["-t", "--help"]  # an option's value, whatever it looks like


@pytest.mark.unit
def test_claude_code_runs_printing_with_permissions_skipped_and_telemetry_off(
    tmp_path: Path,
) -> None:
    launch = agent_named("claude-code").launch(a_run(tmp_path))
    assert launch.argv[1:4] == ["-p", "--bare", "--dangerously-skip-permissions"]
    assert launch.env["ANTHROPIC_BASE_URL"] == URL and launch.env["ANTHROPIC_MODEL"] == "policy"
    for quiet in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY"):
        assert launch.env[quiet] == "1"


@pytest.mark.unit
def test_codex_gets_the_policy_as_its_only_provider_in_its_home(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    launch = agent_named("codex").launch(run)
    config = tomllib.loads((run.home / ".codex" / "config.toml").read_text())
    assert launch.env["CODEX_HOME"] == str(run.home / ".codex")
    assert config["model"] == "policy" and config["model_provider"] == "policy"
    provider = config["model_providers"]["policy"]
    assert provider["base_url"] == URL and launch.env[provider["env_key"]] == KEY
    assert config["analytics"] == {"enabled": False} and config["features"]["plugins"] is False
    assert launch.argv[1:4] == [
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
    ]


@pytest.mark.unit
def test_the_rollouts_traceparent_rides_on_each_coding_agents_calls(tmp_path: Path) -> None:
    """Codex's provider headers and Claude Code's custom headers, when the engine traces; none
    when it does not."""
    header = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    run = replace(a_run(tmp_path), llm_headers=header)
    agent_named("codex").launch(run)
    config = tomllib.loads((run.home / ".codex" / "config.toml").read_text())
    assert config["model_providers"]["policy"]["http_headers"] == header
    claude = agent_named("claude-code").launch(run).env
    assert claude["ANTHROPIC_CUSTOM_HEADERS"] == f"traceparent: {header['traceparent']}"
    assert "ANTHROPIC_CUSTOM_HEADERS" not in agent_named("claude-code").launch(a_run(tmp_path)).env


@pytest.mark.unit
def test_mini_swe_agent_runs_in_yolo_mode_with_a_step_limit(tmp_path: Path) -> None:
    launch = agent_named("mini-swe-agent").launch(a_run(tmp_path))
    argv = launch.argv
    assert {"-y", "--exit-immediately"} <= set(argv)
    assert argv[argv.index("-m") + 1] == "openai/policy"
    assert f"agent.step_limit={clis.MINI_STEP_LIMIT}" in argv
    assert launch.env["OPENAI_BASE_URL"] == URL and launch.env["OPENAI_API_KEY"] == KEY
    assert launch.env["MSWEA_CONFIGURED"] == "true"


@pytest.mark.unit
def test_without_the_policy_a_coding_agent_refuses_in_one_line(tmp_path: Path) -> None:
    run = AgentRun(TASK, None, tmp_path, tmp_path, tmp_path)
    for name in NAMES:
        with pytest.raises(ValueError, match=r"^a coding agent needs the policy's endpoint"):
            agent_named(name).launch(run)


# -- each agent, released, through the local stack's gateway -------------------------------------

INSTALLED = {  # where `make clients` puts each one: linked as the layer's /opt/<name> would be
    "claude-code": ("bin/claude", CLIENTS / "npm" / "node_modules" / ".bin" / "claude"),
    "codex": ("bin/codex", CLIENTS / "npm" / "node_modules" / ".bin" / "codex"),
    "mini-swe-agent": ("", CLIENTS / "venv-mini-swe-agent"),
    "openhands": ("", CLIENTS / "venv-openhands-sdk"),
}
TIMEOUT = 240.0  # seconds per agent run
MAX_CONTEXT = 32768  # the toy's; the gateway fits each turn's max_tokens into it


@pytest.fixture
async def stack() -> AsyncIterator[LocalStack]:
    """The local stack with its gateway, on the toy policy."""
    config = LocalConfig(bucket="harbor-clis", queue="harbor-clis", mode="in_process")
    async with LocalStack(config) as running:
        yield running


def install_like_the_layer(name: str, prefix: Path) -> None:
    """`prefix/<name>` as the image's layer installs it, linked to the client in .clients/."""
    inside, client = INSTALLED[name]
    if not client.exists():
        pytest.skip(f"{client.relative_to(ROOT)} is missing: `make clients` installs it")
    prefix.mkdir(exist_ok=True)
    if inside:
        (prefix / name / "bin").mkdir(parents=True)
        (prefix / name / inside).symlink_to(client)
    else:
        (prefix / name).symlink_to(client)  # a venv keeps its layout


async def run_launch(
    argv: list[str], env: dict[str, str], cwd: Path, proxy: Proxy
) -> tuple[int | None, str]:
    """The launch as the wrapper runs it (its own process group, killed at TIMEOUT), with every
    proxy variable naming `proxy`, which records any request for beyond loopback."""
    proxies = [v for p in ("http_proxy", "https_proxy", "all_proxy") for v in (p, p.upper())]
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={
            "PATH": os.environ["PATH"],
            "LANG": "C.UTF-8",
            **dict.fromkeys(proxies, proxy.url),
            "NO_PROXY": LOOPBACK,
            "no_proxy": LOOPBACK,
            **env,
        },
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = await process.communicate()
        return None, out.decode(errors="replace")
    return process.returncode, out.decode(errors="replace")


@pytest.mark.e2e
@pytest.mark.parametrize("name", NAMES)
async def test_each_agent_calls_the_policy_through_the_gateway_from_its_launch(
    name: str, stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_like_the_layer(name, tmp_path / "opt")
    monkeypatch.setattr(clis, "PREFIX", tmp_path / "opt")
    gateway = stack.engine_config().gateway
    assert gateway is not None
    async with Proxy() as proxy, GatewayAdmin(gateway.url, gateway.admin_token) as admin:
        session = await admin.create_session(f"harbor-{name}", max_context=MAX_CONTEXT)
        llm = LLMSettings(base_url=f"{stack.gateways[0].url}/v1", api_key=session.api_key)
        run = a_run(tmp_path)
        run = AgentRun(TASK, llm, run.workdir, run.home, run.solution)
        launch = agent_named(name).launch(run)
        code, out = await run_launch(launch.argv, launch.env, run.workdir, proxy)
        trace = await admin.finish_session(session.session_id)
    turns: list[dict[str, Any]] = trace["turns"]
    assert turns, f"{name} exited {code} without a traced turn:\n{out[-3000:]}"
    assert code == 0, out[-3000:]  # headless: it ran to its end without asking anyone
    assert session.api_key not in out
    assert proxy.requests == [], out[-3000:]  # the policy, and nothing else
