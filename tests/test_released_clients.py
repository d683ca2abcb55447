"""The released agent clients, unmodified, through the real wire: each runs a two-turn shell task
against a real gateway in front of a scripted SGLang worker, and the gateway's trace is exact.

The clients, each at the version the Makefile pins (its `*_VERSION` lines, read here): Claude
Code and Codex CLI (npm), the Claude Agent SDK, openhands-sdk with openhands-tools, and
mini-swe-agent (PyPI). `make clients` installs them outside the project's venv, into .clients/
(the npm packages under .clients/npm, one venv per Python client). A test fails, not skips,
when its client is missing or is not the pinned version.

Each test opens a gateway session and points the client at the gateway by base URL, key and
model name only, from a temporary HOME and working directory, with telemetry off. Every proxy
variable names a trap on loopback, so a client that tries to reach beyond loopback fails, and
the test sees it. The worker answers from the prompt it is sent, not from the call order, since
clients may add requests: first the client's own shell tool called with `COMMAND`, then, once
the prompt holds the tool's result, the final answer (for mini-swe-agent, its submit command).
The SmolLM2 renderer with a Qwen3 template (tests/smollm2.py) adds reasoning to each turn. A
client that sends it back (as text, or sealed in a thinking signature or an encrypted_content)
so shows that reasoning round-trips. OpenHands does not send reasoning back for this model, so
it runs twice: with the fixture tokenizer's Hermes template (no reasoning), and with Qwen3.

What must hold: the client exits 0 without a request to the proxy; the command ran (out.txt in
the working directory); the trace has one turn per model call, none ill-formed, each naming the
request fields the gateway ignored; both turns are ONE sample, exactly what the worker sampled
(ids, log-probs, loss mask), as every client here sends the model's turns back as written. The
exception: OpenHands with a reasoning policy, whose turns are two samples, each exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.gateway.render import HFRenderer

from .gateway_support import ScriptedWorker, hf_renderer
from .smollm2 import family_renderer
from .test_gateway import check_sample_against_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / ".clients"
NPM_BIN = CLIENTS / "npm" / "node_modules" / ".bin"
TIMEOUT = 150.0  # seconds per client run (each takes a few here)
TASK = "Create the file out.txt containing hi, using the shell."
COMMAND = "echo hi > out.txt && cat out.txt"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # how mini-swe-agent's model ends a task
PLAN, CHECKED = "The user wants a file: write it with the shell.", "The file holds hi."
FINAL = "Done: out.txt holds hi."
LOOPBACK = "127.0.0.1,localhost,::1"


# -- the installed clients ------------------------------------------------------------------------


def pinned(name: str) -> str:
    """A client's version as the Makefile pins it (`CODEX_VERSION := 0.171.0`)."""
    found = re.search(rf"^{name}_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, f"the Makefile pins no {name}_VERSION"
    return found.group(1)


def installed(path: Path, name: str, *version_argv: str) -> Path:
    """`path`, if it is installed and every version `path *version_argv` prints is the pinned
    one; a failure that says how to install it otherwise."""
    where, hint = path.relative_to(ROOT), "`make clients` installs the released clients"
    if not path.exists():
        pytest.fail(f"{where} is missing: {hint}")
    argv = [str(path), *version_argv]
    printed = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    if set(re.findall(r"\d+\.\d+\.\d+", printed)) != {pinned(name)}:
        pytest.fail(f"{where} reports {printed!r}, not the pinned {pinned(name)}: {hint}")
    return path


def python_client(venv: str, name: str, *distributions: str) -> Path:
    """The python of .clients/`venv`, in which `distributions` are at the pinned version."""
    script = "import importlib.metadata as m, sys; print(*map(m.version, sys.argv[1:]))"
    return installed(CLIENTS / venv / "bin" / "python", name, "-c", script, *distributions)


# -- the policy: a worker that answers from the prompt --------------------------------------------


class TaskWorker(ScriptedWorker):
    """Answers `replies[n]` to a prompt that holds n tool results (the last reply after that)."""

    def __init__(self, renderer: HFRenderer, replies: list[str], tool_result: str) -> None:
        super().__init__()
        self.renderer, self.replies, self.tool_result = renderer, replies, tool_result

    async def _generate(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())  # aiohttp keeps the body for the second read
        tok = self.renderer.tokenizer
        done = tok.decode(body["input_ids"]).count(self.tool_result)
        reply = self.replies[min(done, len(self.replies) - 1)]
        self.scripts.append([*tok.encode(reply, add_special_tokens=False), tok.eos_token_id])
        return await super()._generate(request)

    def prompt(self, call: int) -> str:
        return self.renderer.tokenizer.decode(self.calls[call]["input_ids"])


def qwen3(thought: str, text: str = "", call: dict[str, Any] | None = None) -> str:
    """A Qwen3 turn as the model writes it and its template renders it back."""
    tool_call = "" if call is None else f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return f"<think>\n{thought}\n</think>\n\n{text}{tool_call}"


def qwen3_worker(tool: str, arguments: dict[str, Any], then: str | None = None) -> TaskWorker:
    """`tool` called with `arguments`, then the final answer, or `tool` called with the
    command `then`; each turn reasoned."""
    second = {"name": tool, "arguments": {"command": then}} if then else None
    replies = [
        qwen3(PLAN, call={"name": tool, "arguments": arguments}),
        qwen3(CHECKED, "" if second else FINAL, second),
    ]
    return TaskWorker(family_renderer("qwen3"), replies, "<tool_response>")


@asynccontextmanager
async def gateway_for(
    worker: TaskWorker, **tls: str
) -> AsyncIterator[tuple[Gateway, GatewayAdmin, Any]]:
    """The gateway in front of `worker` (on HTTPS with `tls_cert` and `tls_key`), its admin
    client and a new session."""
    async with worker:
        backend = SGLangBackend(worker.url)
        gateway = Gateway(backend, worker.renderer, model_name="policy", **tls)
        async with gateway, GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            yield gateway, admin, await admin.create_session("released-client")


def check_trace(
    trace: dict[str, Any],
    worker: TaskWorker,
    ignored: set[str],
    last: str = "stop",
    samples: list[list[int]] | None = None,
) -> None:
    """Two turns (the call, then one that ends `last`), one per worker call, none ill-formed,
    each ignoring `ignored`; ONE sample of both (unless `samples` lists other turns), each
    exactly what the worker sampled."""
    turns = trace["turns"]
    assert len(turns) == len(worker.calls) == 2, turns
    assert [t["finish_reason"] for t in turns] == ["tool_calls", last]
    assert not any(t["ill_formed"] for t in turns), turns
    assert [set(t["ignored"]) for t in turns] == [ignored, ignored]
    assert [s["turns"] for s in trace["samples"]] == (samples or [[0, 1]])
    for sample in trace["samples"]:
        check_sample_against_records(sample, {c["rid"]: c for c in worker.calls}, turns)


# -- where a client runs --------------------------------------------------------------------------


class Proxy:
    """The proxy every client is given for all but loopback. It forwards nothing: it records
    each request's first line (`CONNECT host:443 HTTP/1.1`) in `.requests` and hangs up."""

    def __init__(self) -> None:
        self.requests: list[str] = []

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._refuse, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests.append((await reader.readline()).decode(errors="replace").strip())
        writer.close()


@dataclass
class Sandbox:
    """A temporary HOME and working directory, and the trap proxy."""

    home: Path
    work: Path
    proxy: Proxy

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment (none of this process's keys or endpoints), telemetry off."""
        proxies = [v for p in ("http_proxy", "https_proxy", "all_proxy") for v in (p, p.upper())]
        return {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "TMPDIR": str(self.home),  # their temporary files (OpenHands' editor history) go too
            "LANG": "C.UTF-8",
            "TMUX_TMPDIR": str(self.home),  # OpenHands' terminal: its own tmux server
            **dict.fromkeys(proxies, self.proxy.url),
            "NO_PROXY": LOOPBACK,
            "no_proxy": LOOPBACK,
            "DO_NOT_TRACK": "1",
            **extra,
        }

    async def run(self, argv: list[Any], env: dict[str, str]) -> tuple[int | None, str]:
        """Run a client in `work` to its end, its process group killed after TIMEOUT: its exit
        code (None if killed) and output."""
        process = await asyncio.create_subprocess_exec(
            *map(str, argv),
            cwd=self.work,
            env=env,
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
            return None, f"killed after {TIMEOUT} s\n{out.decode(errors='replace')}"
        return process.returncode, out.decode(errors="replace")

    def check(self, code: int | None, out: str) -> None:
        """The client ended well, having run the command, and asked for nothing beyond loopback."""
        assert code == 0, f"exit {code}:\n{out[-4000:]}"
        assert (self.work / "out.txt").read_text() == "hi\n", out[-4000:]
        assert self.proxy.requests == [], out[-4000:]


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    """A client's place to run, its proxy listening."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    async with Proxy() as proxy:
        sandbox = Sandbox(home, work, proxy)
        yield sandbox
        for socket in home.glob("tmux-*/*"):  # a tmux server OpenHands left, if it did
            await sandbox.run(["tmux", "-S", socket, "kill-server"], {"PATH": os.environ["PATH"]})


CLAUDE_ENV = {  # Claude Code, and the Claude Agent SDK's bundled copy of it, on its default model
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no title request, no update check
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "IS_SANDBOX": "1",  # lets root bypass permissions
}
CLAUDE_IGNORED = {  # on its default model, which sets a lower effort, on a system message too
    "metadata",
    "context_management",
    "output_config.effort=medium",
    "messages.output_config.effort=medium",
    "system:x-anthropic-billing-header",
}
CLAUDE_POLICY_IGNORED = {  # given the model name `policy` (the example app), the default effort
    "metadata",
    "context_management",
    "output_config.effort",
    "system:x-anthropic-billing-header",
}


def claude_env(sandbox: Sandbox, gateway: Gateway, session: Any) -> dict[str, str]:
    """Claude Code's environment: the gateway URL agents are handed, the session's key."""
    env = sandbox.env(**CLAUDE_ENV, ANTHROPIC_API_KEY=session.api_key)
    return {**env, "ANTHROPIC_BASE_URL": f"{gateway.url}/v1"}


LITELLM_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # no cost map fetched at start


# -- the clients ----------------------------------------------------------------------------------


@dataclass
class Run:
    """A client's run against a fresh gateway: its exit code and output, the session's trace,
    the worker that answered, and the gateway (its counters)."""

    code: int | None
    out: str
    trace: dict[str, Any]
    worker: TaskWorker
    gateway: Gateway


async def run_claude_code(sandbox: Sandbox, claude: Path) -> Run:
    worker = qwen3_worker("Bash", {"command": COMMAND})
    async with gateway_for(worker) as (gateway, admin, session):
        env = claude_env(sandbox, gateway, session)
        argv = [claude, "-p", TASK, "--dangerously-skip-permissions", "--output-format", "json"]
        code, out = await sandbox.run(argv, env)
        trace = await admin.finish_session(session.session_id)
    return Run(code, out, trace, worker, gateway)


async def test_claude_code(sandbox: Sandbox) -> None:
    """Anthropic Messages, streamed; the thinking is sent back whole, with its sealed signature."""
    run = await run_claude_code(sandbox, installed(NPM_BIN / "claude", "CLAUDE_CODE", "--version"))
    sandbox.check(run.code, run.out)
    assert json.loads(run.out.splitlines()[-1])["result"] == FINAL
    check_trace(run.trace, run.worker, CLAUDE_IGNORED)
    assert PLAN in run.worker.prompt(1)


CODEX_CONFIG = """\
model = "policy"
model_provider = "gateway"

[features]
plugins = false  # else it syncs a plugin catalog from github.com and chatgpt.com at start

[analytics]
enabled = false  # else it sends metrics to ab.chatgpt.com

[model_providers.gateway]
name = "gateway"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "GATEWAY_API_KEY"
"""


CODEX_IGNORED = {
    "client_metadata",
    "prompt_cache_key",
    "reasoning.summary",
    "tools:namespace",
    "tools:web_search",
}


async def run_codex(sandbox: Sandbox, codex: Path, *, websocket: bool = False) -> Run:
    """Codex on a custom provider (HTTP), or on its built-in one pointed at the gateway (its
    default transport there: a WebSocket)."""
    worker = qwen3_worker("exec_command", {"cmd": COMMAND})
    codex_home = sandbox.home / ".codex"
    codex_home.mkdir(exist_ok=True)
    async with gateway_for(worker) as (gateway, admin, session):
        config = CODEX_OPENAI_CONFIG if websocket else CODEX_CONFIG
        (codex_home / "config.toml").write_text(config.format(url=gateway.url))
        key = "CODEX_API_KEY" if websocket else "GATEWAY_API_KEY"
        env = sandbox.env(CODEX_HOME=str(codex_home), **{key: session.api_key})
        if websocket:  # what releases before `openai_base_url` (early 2026) read instead
            env["OPENAI_BASE_URL"] = f"{gateway.url}/v1"
        bypass = "--dangerously-bypass-approvals-and-sandbox"  # in a temporary directory
        code, out = await sandbox.run([codex, "exec", "--skip-git-repo-check", bypass, TASK], env)
        trace = await admin.finish_session(session.session_id)
    return Run(code, out, trace, worker, gateway)


async def test_codex(sandbox: Sandbox) -> None:
    """OpenAI Responses, streamed, `store: false`: the reasoning is sent back as the
    `encrypted_content` the gateway sealed it in."""
    run = await run_codex(sandbox, installed(NPM_BIN / "codex", "CODEX", "--version"))
    sandbox.check(run.code, run.out)
    assert FINAL in run.out
    check_trace(run.trace, run.worker, CODEX_IGNORED)
    assert PLAN in run.worker.prompt(1)


CODEX_OPENAI_CONFIG = """\
model = "policy"
openai_base_url = "{url}/v1"  # the built-in OpenAI provider, pointed at the gateway

[features]
plugins = false

[analytics]
enabled = false
"""


async def test_codex_on_its_default_transport_the_responses_websocket(sandbox: Sandbox) -> None:
    """Codex's built-in OpenAI provider opens a WebSocket to /v1/responses before any POST (a
    custom provider does not, unless `supports_websockets`): the gateway serves it, a
    `generate: false` warm-up first, then each turn as `response.create` continuing the last
    response by `previous_response_id` with only the new items, `store: false`. No fallback
    to HTTP, and the trace is as exact as over HTTP."""
    codex = installed(NPM_BIN / "codex", "CODEX", "--version")
    run = await run_codex(sandbox, codex, websocket=True)
    sandbox.check(run.code, run.out)
    assert FINAL in run.out and "falling back" not in run.out.lower(), run.out[-3000:]
    assert run.gateway.websocket_requests >= 2  # the turns came over the WebSocket
    ignored = {*CODEX_IGNORED, "input.internal_chat_message_metadata_passthrough"}
    check_trace(run.trace, run.worker, ignored)  # ^ what OpenAI's provider adds to its items
    assert PLAN in run.worker.prompt(1)


SDK_DRIVER = """
import sys, anyio
from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

async def main():
    options = ClaudeAgentOptions(permission_mode="bypassPermissions", cwd=".")
    async for message in query(prompt=sys.argv[1], options=options):
        print(type(message).__name__, repr(message)[:300])
        if isinstance(message, ResultMessage):
            sys.exit(1 if message.is_error else 0)
    sys.exit("no ResultMessage")

anyio.run(main)
"""


async def run_claude_agent_sdk(sandbox: Sandbox, python: Path) -> Run:
    worker = qwen3_worker("Bash", {"command": COMMAND})
    async with gateway_for(worker) as (gateway, admin, session):
        env = claude_env(sandbox, gateway, session)
        code, out = await sandbox.run([python, "-c", SDK_DRIVER, TASK], env)
        trace = await admin.finish_session(session.session_id)
    return Run(code, out, trace, worker, gateway)


async def test_claude_agent_sdk(sandbox: Sandbox) -> None:
    """`query()` from Python: the bundled Claude Code speaks Anthropic Messages as above, and
    asks for thinking shown as updates."""
    python = python_client("venv-claude-agent-sdk", "CLAUDE_AGENT_SDK", "claude-agent-sdk")
    run = await run_claude_agent_sdk(sandbox, python)
    sandbox.check(run.code, run.out)
    assert f"TextBlock(text='{FINAL}')" in run.out
    check_trace(run.trace, run.worker, {*CLAUDE_IGNORED, "thinking.display"})
    assert PLAN in run.worker.prompt(1)


OPENHANDS_DRIVER = """
import os, sys
from pydantic import SecretStr
from openhands.sdk import LLM, Conversation
from openhands.tools.preset.default import get_default_agent

llm = LLM(model="openai/policy", base_url=os.environ["GATEWAY_URL"],
          api_key=SecretStr(os.environ["GATEWAY_API_KEY"]), usage_id="agent")
agent = get_default_agent(llm=llm, cli_mode=True)
conversation = Conversation(agent=agent, workspace=".", max_iteration_per_run=6)
conversation.send_message(sys.argv[1])
conversation.run()
print("STATUS", conversation.state.execution_status.value)
sys.exit(conversation.state.execution_status.value != "finished")
"""


async def run_openhands(sandbox: Sandbox, python: Path, *, reasoning: bool) -> Run:
    arguments = {"command": COMMAND, "security_risk": "LOW"}
    call = json.dumps({"name": "terminal", "arguments": arguments})
    replies = [f"<tool_call>{call}</tool_call>", FINAL]
    worker = (
        qwen3_worker("terminal", arguments)
        if reasoning
        else TaskWorker(hf_renderer(), replies, "<|im_start|>tool\n")
    )
    async with gateway_for(worker) as (gateway, admin, session):
        env = sandbox.env(**LITELLM_ENV, GATEWAY_API_KEY=session.api_key)
        env["GATEWAY_URL"] = f"{gateway.url}/v1"
        code, out = await sandbox.run([python, "-c", OPENHANDS_DRIVER, TASK], env)
        trace = await admin.finish_session(session.session_id)
    return Run(code, out, trace, worker, gateway)


@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
async def test_openhands_sdk(sandbox: Sandbox, reasoning: bool) -> None:
    """OpenAI chat through litellm, not streamed. A policy that does not reason (the fixture's
    Hermes template) gets its turns back as written: one sample. OpenHands sends
    `reasoning_content` back only for the models it lists (Kimi, DeepSeek's reasoner, ...), not
    for `openai/policy`: with a reasoning policy the second prompt lacks the first turn's
    reasoning, so each turn is a sample of its own, each still exact."""
    python = python_client("venv-openhands-sdk", "OPENHANDS", "openhands-sdk", "openhands-tools")
    run = await run_openhands(sandbox, python, reasoning=reasoning)
    sandbox.check(run.code, run.out)
    assert "STATUS finished" in run.out
    ignored = {"prompt_cache_key", "reasoning_effort=high"}
    check_trace(run.trace, run.worker, ignored, samples=[[0], [1]] if reasoning else None)
    if reasoning:
        assert PLAN not in run.worker.prompt(1)


async def run_mini_swe_agent(sandbox: Sandbox, python: Path, trajectory: Path) -> Run:
    worker = qwen3_worker("bash", {"command": COMMAND}, then=SUBMIT)
    async with gateway_for(worker) as (gateway, admin, session):
        env = sandbox.env(**LITELLM_ENV, MSWEA_COST_TRACKING="ignore_errors")
        env["MSWEA_CONFIGURED"] = "true"  # no first-run setup wizard
        settings = {
            "model.model_kwargs.api_base": f"{gateway.url}/v1",
            "model.model_kwargs.api_key": session.api_key,
            "agent.step_limit": "5",
        }
        argv = [python.parent / "mini", "-y", "--exit-immediately", "-m", "openai/policy"]
        argv += ["-c", "mini.yaml", *(a for k, v in settings.items() for a in ("-c", f"{k}={v}"))]
        code, out = await sandbox.run([*argv, "-t", TASK, "-o", trajectory], env)
        trace = await admin.finish_session(session.session_id)
    return Run(code, out, trace, worker, gateway)


async def test_mini_swe_agent(sandbox: Sandbox, tmp_path: Path) -> None:
    """OpenAI chat through litellm, not streamed; the reasoning is sent back as
    `reasoning_content`. The agent ends when its model runs the submit command."""
    python = python_client("venv-mini-swe-agent", "MINI_SWE_AGENT", "mini-swe-agent")
    trajectory = tmp_path / "trajectory.json"
    run = await run_mini_swe_agent(sandbox, python, trajectory)
    sandbox.check(run.code, run.out)
    assert json.loads(trajectory.read_text())["info"]["exit_status"] == "Submitted"
    check_trace(run.trace, run.worker, set(), last="tool_calls")
    assert PLAN in run.worker.prompt(1)


# -- the example agents: the same clients inside a RolloutApp -----------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("agent", ["claude_code", "codex"])
async def test_the_coding_agent_example_runs_each_client_and_checks_its_work(
    agent: str, tls: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """examples/coding_agent/app.py as a user copies it: the rollout function runs the released
    client on the instruction with `ctx.llm` only, then the payload's check: reward 1. Over
    HTTPS too, the client verifying the gateway's certificate against a private CA that the
    session's environment names in the variable the client reads."""
    import time

    import trustme

    from agentcore_rollout.agent import RolloutContext
    from agentcore_rollout.contract import LLMSettings
    from examples.coding_agent import app

    if agent == "claude_code":
        monkeypatch.setenv("CLAUDE_BIN", str(installed(NPM_BIN / "claude", "CLAUDE_CODE", "-v")))
        worker, rollout = qwen3_worker("Bash", {"command": COMMAND}), app.claude_code_rollout
        ignored = CLAUDE_POLICY_IGNORED
    else:
        monkeypatch.setenv("CODEX_BIN", str(installed(NPM_BIN / "codex", "CODEX", "--version")))
        worker, rollout = qwen3_worker("exec_command", {"cmd": COMMAND}), app.codex_rollout
        ignored = CODEX_IGNORED
    options = {}
    if tls:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(tmp_path / "key.pem")
        cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
        ca.cert_pem.write_to_path(tmp_path / "ca.pem")
        options = {"tls_cert": str(tmp_path / "cert.pem"), "tls_key": str(tmp_path / "key.pem")}
        trusts = "NODE_EXTRA_CA_CERTS" if agent == "claude_code" else "CODEX_CA_CERTIFICATE"
        monkeypatch.setenv(trusts, str(tmp_path / "ca.pem"))
    async with gateway_for(worker, **options) as (gateway, admin, session):
        assert gateway.url.startswith("https://" if tls else "http://")
        llm = LLMSettings(base_url=f"{gateway.url}/v1", model="policy", api_key=session.api_key)
        ctx = RolloutContext("x", 0, "r", "i", 0, "s", time.time() + TIMEOUT, llm)
        payload = {"instruction": TASK, "check": "grep -qx hi out.txt"}
        output = await rollout(payload, ctx)
        trace = await admin.finish_session(session.session_id)
    assert output.rewards == 1.0, output.trajectory
    assert output.metrics == {"agent_exit": 0.0, "solved": 1.0}
    check_trace(trace, worker, ignored)
