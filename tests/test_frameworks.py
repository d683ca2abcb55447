"""Agent frameworks, unmodified, through the gateway's real wire: each is given only a base URL, a
key and a model name, and runs a two-turn tool round trip on a scripted policy (a real SGLang
/generate server sampling the fixture tokenizer's ids): the policy calls `add`, the framework
runs the tool, the policy answers. Checked: the tool ran with the arguments the policy wrote,
the answer is what the policy wrote, and the trace is exact (tests/framework_support.py).

One gateway and worker per module, one session per test. To add a framework, write a test that
takes `live` (a `LiveSession`: `base_url`, `url`, `api_key`, `model`), calls `live.script(...)`
with the policy's replies, runs the framework and ends with `live.assert_exact(await
live.finish())`. The frameworks come with the `[frameworks]` extra.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agentcore_rollout import RolloutEngine, RolloutRequest
from agentcore_rollout.agent import RolloutApp, RolloutContext, RolloutOutput
from agentcore_rollout.cli.config import load_config
from agentcore_rollout.contract import LLMSettings
from agentcore_rollout.gateway import Gateway, GatewayAdmin, SGLangBackend
from agentcore_rollout.local.stack import LocalStack

from .factories import recorded_samples
from .framework_support import (
    LiveSession,
    Wire,
    assert_trace_exact,
    quiet_frameworks,
    reached_outside,
    tool_call_text,
)
from .gateway_support import ADD_TOOL, ScriptedWorker, hf_renderer

quiet_frameworks()

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.component]

ROOT = Path(__file__).resolve().parent.parent

QUESTION = "What is 2 + 3? Use the add tool."
CALL = tool_call_text(("add", {"a": 2, "b": 3}))
ANSWER = "The answer is 5."


class Calls:
    """The real tool every framework is given, recording the arguments it ran with."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        self.seen.append((a, b))
        return a + b


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wire() -> AsyncIterator[Wire]:
    async with ScriptedWorker() as worker:
        gateway = Gateway(SGLangBackend(worker.url), hf_renderer())
        async with gateway, GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin:
            yield Wire(worker, gateway, admin)


@pytest.fixture(autouse=True)
def loopback_only() -> Iterator[None]:
    """No framework phones home: nothing but loopback is looked up or connected to."""
    reached_outside()
    yield
    assert reached_outside() == []


@pytest_asyncio.fixture(loop_scope="module")
async def live(wire: Wire, request: pytest.FixtureRequest) -> AsyncIterator[LiveSession]:
    session = await wire.admin.create_session(request.node.name, sampling={"temperature": 1.0})
    yield LiveSession(wire, session)
    await wire.admin.drop_session(session.session_id)


# -- the openai SDK ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_chat_completions(live: LiveSession, stream: bool) -> None:
    import openai

    live.script(CALL, ANSWER)
    tools = Calls()
    client = openai.AsyncOpenAI(base_url=live.base_url, api_key=live.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    answer = ""
    for _ in range(2):
        if stream:
            message = await _streamed(client, live.model, messages)
        else:
            reply = await client.chat.completions.create(
                model=live.model, messages=messages, tools=[ADD_TOOL]
            )
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        for call in message.get("tool_calls") or []:
            result = tools.add(**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
        answer = message.get("content") or ""
    await client.close()
    assert tools.seen == [(2, 3)] and answer == ANSWER
    live.assert_exact(await live.finish(), samples=1)


async def _streamed(client: Any, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    stream = await client.chat.completions.create(
        model=model, messages=messages, tools=[ADD_TOOL], stream=True
    )
    content, calls = "", {}
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": d.id, "type": "function"})
                fn = call.setdefault("function", {"name": "", "arguments": ""})
                fn["name"] += d.function.name or ""
                fn["arguments"] += d.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = list(calls.values())
    return message


# -- the OpenAI Agents SDK on chat completions ---------------------------------------------------


async def test_openai_agents_sdk_chat_completions_model(live: LiveSession) -> None:
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

    live.script(CALL, ANSWER)
    tools = Calls()
    client = openai.AsyncOpenAI(base_url=live.base_url, api_key=live.api_key, max_retries=0)
    agent = Agent(
        name="adder",
        instructions="Use the add tool.",
        model=OpenAIChatCompletionsModel(model=live.model, openai_client=client),
        tools=[function_tool(tools.add)],
    )
    result = await Runner.run(agent, QUESTION)
    await client.close()
    assert tools.seen == [(2, 3)] and result.final_output == ANSWER
    live.assert_exact(await live.finish(), samples=1)


# -- Strands Agents (OpenAI provider) ------------------------------------------------------------


async def test_strands_agents_openai_provider(live: LiveSession) -> None:
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    live.script(CALL, ANSWER)
    tools = Calls()
    model = OpenAIModel(
        client_args={"base_url": live.base_url, "api_key": live.api_key, "max_retries": 0},
        model_id=live.model,
    )
    agent = Agent(model=model, tools=[tool(tools.add)], callback_handler=None)
    result = await agent.invoke_async(QUESTION)
    assert tools.seen == [(2, 3)] and str(result).strip() == ANSWER
    live.assert_exact(await live.finish(), samples=1)


# -- LangGraph + langchain-openai ----------------------------------------------------------------


async def test_langgraph_react_agent_with_chat_openai(live: LiveSession) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    live.script(CALL, ANSWER)
    tools = Calls()
    model = ChatOpenAI(
        base_url=live.base_url, api_key=live.api_key, model=live.model, max_retries=0
    )
    agent = create_react_agent(model, [tool(tools.add)])
    state = await agent.ainvoke({"messages": [("user", QUESTION)]})
    assert tools.seen == [(2, 3)] and state["messages"][-1].content == ANSWER
    live.assert_exact(await live.finish(), samples=1)


# -- litellm (openai provider) -------------------------------------------------------------------


async def test_litellm_acompletion_openai_provider(live: LiveSession) -> None:
    import litellm

    live.script(CALL, ANSWER)
    tools = Calls()
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for _ in range(2):
        reply = await litellm.acompletion(
            model=f"openai/{live.model}",
            api_base=live.base_url,
            api_key=live.api_key,
            messages=messages,
            tools=[ADD_TOOL],
            num_retries=0,
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            result = tools.add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    assert tools.seen == [(2, 3)] and message.content == ANSWER
    live.assert_exact(await live.finish(), samples=1)


# -- two tool calls in one turn ------------------------------------------------------------------


async def test_two_tool_calls_in_one_turn_through_the_agents_sdk(live: LiveSession) -> None:
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

    live.script(tool_call_text(("add", {"a": 2, "b": 3}), ("add", {"a": 4, "b": 5})), "5 and 9.")
    tools = Calls()
    client = openai.AsyncOpenAI(base_url=live.base_url, api_key=live.api_key, max_retries=0)
    agent = Agent(
        name="adder",
        model=OpenAIChatCompletionsModel(model=live.model, openai_client=client),
        tools=[function_tool(tools.add)],
    )
    result = await Runner.run(agent, "What are 2 + 3 and 4 + 5?")
    await client.close()
    assert tools.seen == [(2, 3), (4, 5)] and result.final_output == "5 and 9."
    trace = await live.finish()
    live.assert_exact(trace, samples=1)
    assert [t["finish_reason"] for t in trace["turns"]] == ["tool_calls", "stop"]


# -- the harness itself --------------------------------------------------------------------------


async def test_the_exactness_check_fails_on_a_trace_that_is_not_what_was_sampled(
    live: LiveSession,
) -> None:
    """assert_exact is what every test above rests on: it must catch a changed id, log-prob or
    mask, a log-prob under mask 0, a lost turn and an unused script."""
    import copy

    import openai

    live.script(ANSWER)
    client = openai.AsyncOpenAI(base_url=live.base_url, api_key=live.api_key, max_retries=0)
    reply = await client.chat.completions.create(
        model=live.model, messages=[{"role": "user", "content": QUESTION}]
    )
    await client.close()
    assert reply.choices[0].message.content == ANSWER
    trace = await live.finish()
    live.assert_exact(trace, samples=1)

    def corrupt(edit: Any) -> dict[str, Any]:
        bad = copy.deepcopy(trace)
        edit(bad["samples"][0])
        return bad

    n_prompt_tail = len(trace["samples"][0]["response_ids"]) - 1
    bad_traces = [
        corrupt(lambda s: s["response_ids"].__setitem__(0, s["response_ids"][0] + 1)),
        corrupt(lambda s: s["logprobs"].__setitem__(-1, s["logprobs"][-1] - 1.0)),
        corrupt(lambda s: s["loss_mask"].__setitem__(n_prompt_tail, 0)),
        corrupt(lambda s: s["prompt_ids"].__setitem__(-1, 0)),
        {**trace, "turns": [], "samples": []},
    ]
    for bad in bad_traces:
        with pytest.raises(AssertionError):
            live.assert_exact(bad)
    with pytest.raises(AssertionError, match="1 samples"):
        live.assert_exact(trace, samples=2)
    live.wire.worker.scripts.append([0])  # a script the framework never asked for
    with pytest.raises(AssertionError, match="fewer policy calls"):
        live.assert_exact(trace)
    live.wire.worker.scripts.clear()


# -- the example agents ------------------------------------------------------------------------

EXAMPLES = ["examples.strands_agent.app", "examples.langgraph_agent.app"]


def _context(live: LiveSession, **sampling: Any) -> RolloutContext:
    llm = LLMSettings(
        base_url=live.base_url, model=live.model, api_key=live.api_key, sampling=sampling
    )
    return RolloutContext("fw", 0, "r-1", "add-0", 0, "s" * 33, time.time() + 60, llm)


@pytest.mark.parametrize("module", EXAMPLES)
async def test_example_agent_calls_its_tool_and_is_rewarded(live: LiveSession, module: str) -> None:
    example = importlib.import_module(module)
    live.script(tool_call_text(("add", {"a": 17, "b": 44})), "61")
    output = await example.rollout({"question": "What is 17 + 44?", "answer": 61}, _context(live))
    assert output.rewards.components == {"reward": 1.0, "tool_calls": 1.0}
    assert output.stop_reason == "answered"
    json.dumps(output.trajectory)  # the result carries it as JSON
    live.assert_exact(await live.finish(), samples=1)


@pytest.mark.parametrize("module", EXAMPLES)
async def test_example_agent_cut_at_max_tokens_still_ends_with_reward_0(
    live: LiveSession, module: str
) -> None:
    example = importlib.import_module(module)
    live.script("6 is my final answer.", max_tokens=3)
    ctx = _context(live, max_tokens=3)
    output = await example.rollout({"question": "What is 17 + 44?", "answer": 61}, ctx)
    assert output.rewards.components == {"reward": 0.0, "tool_calls": 0.0}
    # Strands raises MaxTokensReachedException on a `length` finish; LangGraph returns the text.
    assert output.stop_reason == ("max_tokens" if "strands" in module else "answered")
    trace = await live.finish()
    live.assert_exact(trace, samples=1)
    assert [t["finish_reason"] for t in trace["turns"]] == ["length"]


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["strands_agent", "langgraph_agent"])
async def test_example_runs_on_the_local_stack_and_every_rollout_ends_ok_with_a_reward(
    name: str,
) -> None:
    """The example as `agentcore-rollout run --config configs/NAME.yaml` runs it (in one
    process here): the toy policy writes mostly nonsense, and every rollout still ends ok with a
    reward, its trace exact against what the policy worker recorded sampling."""
    overrides = {
        "local.mode": "in_process",
        "local.policy_workers": 1,
        "local.record_samples": True,
        "local.bucket": f"fw-{name.replace('_', '-')}",
        "local.queue": f"fw-{name}",
    }
    config = load_config(ROOT / "configs" / f"{name}.yaml", env_file=None, overrides=overrides)
    assert config.local.app == f"examples.{name}.app:app"
    rows = [json.loads(line) for line in (ROOT / config.run.data).read_text().splitlines()][:3]
    requests = [
        RolloutRequest(row, input_id=row["id"], sample_index=k) for row in rows for k in range(2)
    ]
    async with LocalStack(config.local) as stack:
        async with RolloutEngine(stack.engine_config(config.engine)) as engine:
            batch = await engine.rollout(requests)
        by_rid = {s["rid"]: s for s in await recorded_samples(stack)}
    assert batch.counts["ok"] == len(requests), [o.error for o in batch.outcomes]
    for outcome in batch.outcomes:
        assert outcome.reward in (0.0, 1.0)
        assert outcome.result.stop_reason in ("answered", "max_tokens", "max_steps")
        trace = outcome.trace
        assert trace is not None and trace["num_turns"] >= 1
        assert_trace_exact(trace, [by_rid[t["rid"]] for t in trace["turns"]])


async def test_the_readme_framework_wrap_runs_as_written(live: LiveSession) -> None:
    """The docs' wrap of a Strands agent (docs/agents.md), taken from the page as is."""
    from strands import tool

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/agents.md").read_text(), re.S)
    (block,) = [b for b in blocks if "OpenAIModel(" in b]
    tools = Calls()
    namespace: dict[str, Any] = {
        "app": RolloutApp(),
        "RolloutOutput": RolloutOutput,
        "add": tool(tools.add),
    }
    exec(compile(block, "docs/agents.md", "exec"), namespace)
    live.script(CALL, "5")
    output = await namespace["rollout"]({"question": QUESTION, "answer": 5}, _context(live))
    assert tools.seen == [(2, 3)] and output.rewards == 1.0
    live.assert_exact(await live.finish(), samples=1)
