"""Coding agents as they ship, one per rollout: Claude Code and the Codex CLI, unmodified,
pointed at the policy by base URL, key and model name only.

Each rollout runs the agent headless in a fresh working directory on the payload's
`instruction`, then runs the payload's `check` (a shell command) there: reward 1 if it exits
0, else 0. The agent's own turns go through the gateway (`ctx.llm`), which records the exact
tokens; nothing here parses the agent's output. Two apps, one per agent:

    python -m agentcore_rollout.agent.serve examples.coding_agent.app:claude_code --port 8080
    python -m agentcore_rollout.agent.serve examples.coding_agent.app:codex --port 8080

The binaries are `claude` (`npm install @anthropic-ai/claude-code@2.1.332`) and `codex`
(`npm install @openai/codex@0.171.0`) on the PATH, or where `CLAUDE_BIN` / `CODEX_BIN` say.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput

claude_code = RolloutApp()
codex = RolloutApp()

# Nothing but the policy: no telemetry, no update checks, no error reports.
# The CA files an agent trusts a gateway's TLS certificate by (Node's, Codex's, OpenSSL's): a
# private CA set in the session's environment reaches the agent.
TRUST = ("NODE_EXTRA_CA_CERTS", "CODEX_CA_CERTIFICATE", "SSL_CERT_FILE", "SSL_CERT_DIR")
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


@claude_code.rollout_entrypoint
async def claude_code_rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    llm = _llm(ctx)
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as work:
        env = {
            **QUIET,
            "HOME": home,
            "ANTHROPIC_BASE_URL": llm.base_url,  # the gateway serves /v1/messages under it
            "ANTHROPIC_API_KEY": llm.api_key,
            "ANTHROPIC_MODEL": llm.model,
            "IS_SANDBOX": "1",  # the session is the sandbox: lets it skip permissions as root
        }
        if headers := ctx.trace_headers():  # each call joins the rollout's trace (OpenTelemetry)
            env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in headers.items())
        argv = [os.environ.get("CLAUDE_BIN", "claude"), "-p", payload["instruction"]]
        argv.append("--dangerously-skip-permissions")
        return await _run_and_check(argv, env, Path(work), payload, ctx)


@codex.rollout_entrypoint
async def codex_rollout(payload: dict[str, Any], ctx: RolloutContext) -> RolloutOutput:
    llm = _llm(ctx)
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as work:
        (Path(home) / "config.toml").write_text(
            f'model = "{llm.model}"\n'
            'model_provider = "policy"\n'
            "[model_providers.policy]\n"
            'name = "policy"\n'
            f'base_url = "{llm.base_url}"\n'
            'wire_api = "responses"\n'
            'env_key = "POLICY_API_KEY"\n'
            f"http_headers = {_toml_table(ctx.trace_headers())}\n"  # the rollout's trace
            "[features]\n"
            "plugins = false\n"  # else it syncs a plugin catalog from github.com at start
            "[analytics]\n"
            "enabled = false\n"  # else it sends metrics to ab.chatgpt.com
        )
        env = {"HOME": home, "CODEX_HOME": home, "POLICY_API_KEY": llm.api_key}
        argv = [os.environ.get("CODEX_BIN", "codex"), "exec", "--skip-git-repo-check"]
        argv += ["--dangerously-bypass-approvals-and-sandbox", payload["instruction"]]
        return await _run_and_check(argv, env, Path(work), payload, ctx)


def _toml_table(values: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in values.items()) + " }"


def _llm(ctx: RolloutContext) -> Any:
    if ctx.llm is None:
        raise ValueError("this agent needs the policy's endpoint (_rollout.llm)")
    return ctx.llm


async def _run_and_check(
    argv: list[str], env: dict[str, str], work: Path, payload: dict[str, Any], ctx: RolloutContext
) -> RolloutOutput:
    """Run the agent in `work` until it exits (or the rollout's time is up), then the check."""
    trust = {name: os.environ[name] for name in TRUST if name in os.environ}
    env = {"PATH": os.environ.get("PATH", ""), **trust, **env}
    agent = await asyncio.create_subprocess_exec(
        *argv,
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,  # Codex reads a piped stdin into its prompt
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(agent.communicate(), timeout=ctx.time_left() - 10)
    except TimeoutError:
        agent.kill()
        await agent.wait()
        return RolloutOutput(rewards=0.0, stop_reason="timeout", metrics={"agent_exit": -1.0})
    check = await asyncio.create_subprocess_shell(payload["check"], cwd=work)
    solved = await check.wait() == 0
    metrics = {"agent_exit": float(agent.returncode or 0), "solved": float(solved)}
    log = output.decode(errors="replace")[-4000:]
    return RolloutOutput(rewards=float(solved), trajectory={"log": log}, metrics=metrics)
