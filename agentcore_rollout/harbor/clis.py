"""The coding agents as they ship (Claude Code, the Codex CLI, mini-swe-agent, OpenHands), each at
a pinned version, run headless on the task's instruction and pointed at the gateway.

Each installs under `/opt/<name>`, never into the wrapper's venv, so its dependencies cannot
break the wrapper; its key goes in the environment, never argv, which `ps` shows. The versions
are the Makefile's (tests/test_harbor_clis.py checks they agree). The npm CLIs need Node >= 18:
an image with an older one fails its build in one line. docs/harbor.md#agents."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..contract import LLMSettings
from .launch import AgentRun, HarborAgent, Launch

CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"
MINI_SWE_AGENT_VERSION = "2.4.6"
OPENHANDS_VERSION = "1.58.2"
UV_VERSION = "0.13.8"  # installs OpenHands' Python where the image's is older than 3.12

PREFIX = Path("/opt")
"""Where the layer installs each agent (`/opt/claude-code`, ...)."""
MINI_STEP_LIMIT = 50
"""mini-swe-agent's steps (model calls) per rollout; its cost is not tracked for the policy."""
OPENHANDS_MAX_ITERATIONS = 50
"""OpenHands' agent steps per rollout."""

_NODE = (
    "RUN command -v node >/dev/null || { apt-get update -qq && "
    "apt-get install -y -qq --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*; }"
    " && node -e 'process.exit(+process.versions.node.split(\".\")[0] < 18)'"
    ' || { echo "the npm coding agents need Node >= 18; this image has $(node --version)" >&2;'
    " exit 1; }"
)
_QUIET_NPM = "NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false"


def _npm(name: str, package: str, then: str = "") -> tuple[str, ...]:
    return (_NODE, f"RUN {_QUIET_NPM} npm install -g --prefix {PREFIX / name} {package}{then}")


# What a copied npm CLI needs on the task's image: Node alone (npm installed it already).
_NODE_RUNTIME = _NODE.replace(
    "install -y -qq --no-install-recommends nodejs npm",
    "install -y -qq --no-install-recommends nodejs",
)


def _npm_agent(
    name: str,
    launch: Callable[[AgentRun], Launch],
    version: str,
    package: str,
    then: str = "",
    *,
    node: bool = True,
) -> HarborAgent:
    """An npm CLI: installed once in the wrapper's image, its prefix copied into each task's
    layer, which gets Node where the CLI runs on it (`node`)."""
    install = _npm(name, package, then)
    runtime = (_NODE_RUNTIME,) if node else ()
    return HarborAgent(
        name, launch, version, install, shared=(str(PREFIX / name),), runtime=runtime
    )


# Its postinstall hard-links the platform's binary as bin/claude.exe: the platform packages
# are copies (240 MB each; npm < 10.4, Debian 12's 9.2, installs the musl one beside glibc's).
_CLAUDE_PLATFORMS = "lib/node_modules/@anthropic-ai/claude-code/node_modules/@anthropic-ai"
_CLAUDE_TRIM = f" && rm -rf {PREFIX / 'claude-code' / _CLAUDE_PLATFORMS}/claude-code-*"


def _bin(name: str, exe: str) -> str:
    return str(PREFIX / name / "bin" / exe)


def _llm(run: AgentRun) -> LLMSettings:
    if run.llm is None:
        raise ValueError("a coding agent needs the policy's endpoint (_rollout.llm)")
    return run.llm


# -- Claude Code ---------------------------------------------------------------------------------

_CLAUDE_QUIET = {  # nothing but the policy: no telemetry, update check or error report
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


def _claude_code(run: AgentRun) -> Launch:
    """Printing mode (`-p`), minimal (`--bare`: tools Bash, Read and Edit under a 345-character
    system prompt; no hooks, plugin sync, background prefetches or CLAUDE.md discovery). Its full
    prompt (24 tools, 77k characters, about 20k tokens) fits no local policy's context: SmolLM2's
    is 8k tokens, the toy's 32k characters. Drop `--bare` for Claude Code as users run it."""
    llm = _llm(run)
    env = {
        **_CLAUDE_QUIET,
        "HOME": str(run.home),
        "ANTHROPIC_BASE_URL": llm.base_url,  # the gateway serves /v1/messages under it
        "ANTHROPIC_API_KEY": llm.api_key,
        "ANTHROPIC_MODEL": llm.model,
        "IS_SANDBOX": "1",  # the session is the sandbox: lets it skip permissions as root
    }
    if run.llm_headers:  # "Name: Value" lines
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in run.llm_headers.items())
    argv = [_bin("claude-code", "claude"), "-p", "--bare", "--dangerously-skip-permissions"]
    return Launch([*argv, "--", run.instruction], env)


# -- Codex CLI -----------------------------------------------------------------------------------


def _codex_config(model: str, base_url: str, headers: dict[str, str]) -> str:
    """Its config.toml: the policy as its only provider, `headers` on each of its calls (JSON
    strings are TOML strings)."""
    header_table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in headers.items())
    return (
        f"model = {json.dumps(model)}\n"
        'model_provider = "policy"\n'
        "[model_providers.policy]\n"
        'name = "policy"\n'
        f"base_url = {json.dumps(base_url)}\n"
        'wire_api = "responses"\n'
        'env_key = "POLICY_API_KEY"\n'
        f"http_headers = {{ {header_table} }}\n"
        "[features]\n"
        "plugins = false\n"  # else it syncs a plugin catalog from github.com at start
        "[analytics]\n"
        "enabled = false\n"  # else it sends metrics to ab.chatgpt.com
    )


def _codex(run: AgentRun) -> Launch:
    llm = _llm(run)
    codex_home = run.home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(_codex_config(llm.model, llm.base_url, run.llm_headers))
    env = {"HOME": str(run.home), "CODEX_HOME": str(codex_home), "POLICY_API_KEY": llm.api_key}
    argv = [_bin("codex", "codex"), "exec", "--skip-git-repo-check"]
    argv += ["--dangerously-bypass-approvals-and-sandbox", "--", run.instruction]
    return Launch(argv, env)


# -- mini-swe-agent ------------------------------------------------------------------------------


def _mini_swe_agent(run: AgentRun) -> Launch:
    """`mini` in yolo mode, ending when its model submits (or at its step limit); litellm's
    `openai/` provider reads the endpoint and key from the environment."""
    llm = _llm(run)
    env = {
        "HOME": str(run.home),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": llm.api_key,
        "MSWEA_CONFIGURED": "true",  # no first-run setup wizard
        "MSWEA_GLOBAL_CONFIG_DIR": str(run.home / "mini-swe-agent"),
        "MSWEA_COST_TRACKING": "ignore_errors",  # the policy has no price
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no cost map fetched at start
    }
    argv = [_bin("mini-swe-agent", "mini"), "-y", "--exit-immediately"]
    argv += [
        "-m",
        f"openai/{llm.model}",
        "-c",
        "mini.yaml",
        "-c",
        f"agent.step_limit={MINI_STEP_LIMIT}",
    ]
    argv += ["-o", str(run.home / "trajectory.json"), "-t", run.instruction]
    return Launch(argv, env)


# -- OpenHands -----------------------------------------------------------------------------------

_OPENHANDS_DRIVER = """\
import os, sys
from pydantic import SecretStr
from openhands.sdk import LLM, Conversation
from openhands.tools.preset.default import get_default_agent

llm = LLM(model="openai/" + os.environ["LLM_MODEL"], base_url=os.environ["LLM_BASE_URL"],
          api_key=SecretStr(os.environ["LLM_API_KEY"]), usage_id="agent")
agent = get_default_agent(llm=llm, cli_mode=True)
steps = int(os.environ["OPENHANDS_MAX_ITERATIONS"])
conversation = Conversation(agent=agent, workspace=".", max_iteration_per_run=steps)
conversation.send_message(sys.argv[1])
conversation.run()
status = conversation.state.execution_status.value
print("openhands:", status)
sys.exit(status != "finished")
"""


def _openhands(run: AgentRun) -> Launch:
    llm = _llm(run)
    env = {
        "HOME": str(run.home),
        "TMUX_TMPDIR": str(run.home),  # its terminal's own tmux server, if tmux is there
        "LLM_MODEL": llm.model,
        "LLM_BASE_URL": llm.base_url,
        "LLM_API_KEY": llm.api_key,
        "OPENHANDS_MAX_ITERATIONS": str(OPENHANDS_MAX_ITERATIONS),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "DO_NOT_TRACK": "1",
    }
    return Launch([_bin("openhands", "python"), "-c", _OPENHANDS_DRIVER, run.instruction], env)


def _openhands_install() -> tuple[str, ...]:
    venv, uv = PREFIX / "openhands", PREFIX / "openhands-uv"
    packages = f"openhands-sdk=={OPENHANDS_VERSION} openhands-tools=={OPENHANDS_VERSION}"
    return (
        f"RUN python3 -m venv {uv} && {uv}/bin/pip install -q --no-cache-dir uv=={UV_VERSION}"
        f" && UV_PYTHON_INSTALL_DIR={uv}/python {uv}/bin/uv venv -q --python 3.12 {venv}"
        f" && {uv}/bin/uv pip install -q --no-cache --python {venv}/bin/python {packages}",
    )


CLI_AGENTS: tuple[HarborAgent, ...] = (
    _npm_agent(
        "claude-code",
        _claude_code,
        CLAUDE_CODE_VERSION,
        f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
        _CLAUDE_TRIM,
        node=False,  # bin/claude is the platform's native binary (glibc's, as installed)
    ),
    _npm_agent("codex", _codex, CODEX_VERSION, f"@openai/codex@{CODEX_VERSION}"),
    HarborAgent(
        "mini-swe-agent",
        _mini_swe_agent,
        MINI_SWE_AGENT_VERSION,
        (
            f"RUN python3 -m venv {PREFIX / 'mini-swe-agent'} && {_bin('mini-swe-agent', 'pip')}"
            f" install -q --no-cache-dir mini-swe-agent=={MINI_SWE_AGENT_VERSION}",
        ),
    ),
    HarborAgent("openhands", _openhands, OPENHANDS_VERSION, _openhands_install()),
)
"""Claude Code, the Codex CLI, mini-swe-agent and OpenHands, each at its pinned version."""
