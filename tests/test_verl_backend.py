"""The gateway sampling through veRL's server manager: an agent's turn, through the gateway's
real HTTP API, becomes one `generate` call on the manager, and the trace holds exactly the ids,
log-probs and weight version (`global_steps`) of veRL's `TokenOutput`. No rollout server runs on
CPU, so the manager here is a stand-in with `LLMServerClient.generate`'s signature that returns
veRL's own `TokenOutput`."""

from __future__ import annotations

import openai
import pytest
from verl.workers.rollout.replica import TokenOutput

from agentcore_rollout.gateway import Gateway, GatewayAdmin, ResumePolicy
from agentcore_rollout.integrations.verl import agent_loop_outputs
from agentcore_rollout.integrations.verl.backend import VerlServerBackend
from agentcore_rollout.local.policy import CharRenderer, CharTokenizer

from .factories import make_outcome

pytestmark = pytest.mark.component

TOK = CharTokenizer()


class ServerManager:
    """Answers each generate with `reply` (+ <|im_end|>) sampled by weights `global_steps`."""

    def __init__(self, reply: str, global_steps: int, stop_reason: str | None = "completed"):
        self.ids = [*TOK.encode(reply), TOK.encode("<|im_end|>")[0]]
        self.global_steps = global_steps
        self.stop_reason = stop_reason
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls.append({"rid": request_id, "prompt_ids": prompt_ids, "params": sampling_params})
        return TokenOutput(
            token_ids=self.ids,
            log_probs=[-0.125 * (i + 1) for i in range(len(self.ids))],
            stop_reason=self.stop_reason,
            extra_fields={"global_steps": self.global_steps},
        )


async def _turn(
    manager: ServerManager, resume: ResumePolicy | None = None
) -> tuple[dict, str | Exception]:
    async with (
        Gateway(VerlServerBackend(manager), CharRenderer(), resume=resume) as gateway,
        GatewayAdmin(gateway.admin_url, gateway.admin_token) as admin,
    ):
        session = await admin.create_session("r1", sampling={"temperature": 1.0})
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key=session.api_key, max_retries=0
        )
        try:
            reply = await client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "What is 5 + 7?"}],
                max_tokens=8,
            )
            answer: str | Exception = reply.choices[0].message.content or ""
        except openai.APIStatusError as e:
            answer = e
        finally:
            await client.close()
        return await admin.finish_session(session.session_id), answer


async def test_the_trace_is_what_veRLs_servers_sampled():
    manager = ServerManager("12", global_steps=7)
    trace, answer = await _turn(manager)
    [call] = manager.calls
    assert answer == "12"
    assert call["params"]["logprobs"] is True and call["params"]["max_tokens"] == 8
    assert TOK.encode("<|im_end|>")[0] in call["params"]["stop_token_ids"]
    [sample] = trace["samples"]
    assert sample["prompt_ids"] == call["prompt_ids"]
    assert sample["response_ids"] == manager.ids and sample["loss_mask"] == [1, 1, 1]
    assert sample["logprobs"] == [-0.125, -0.25, -0.375]
    assert sample["weight_versions"] == ["7"] and sample["finish_reason"] == "stop"
    # ... and veRL's row says which weights sampled it.
    outcome = make_outcome(step=7, trace=trace)
    [row] = agent_loop_outputs(outcome)
    assert row.extra_fields["min_global_steps"] == row.extra_fields["max_global_steps"] == 7


async def test_a_generation_veRL_aborts_for_an_update_is_resumed_under_the_new_weights():
    manager = ServerManager("12", global_steps=2)
    answers = [(manager.ids[:1], 2, "aborted"), (manager.ids[1:], 3, "completed")]

    async def generate(request_id, *, prompt_ids, sampling_params, **kwargs):
        manager.calls.append({"rid": request_id, "prompt_ids": prompt_ids, **sampling_params})
        ids, steps, reason = answers.pop(0)
        logprobs = [-0.5 * (len(prompt_ids) + i) for i in range(len(ids))]
        extra = {"global_steps": steps}
        return TokenOutput(
            token_ids=ids, log_probs=logprobs, stop_reason=reason, extra_fields=extra
        )

    manager.generate = generate
    trace, answer = await _turn(manager)
    first, second = manager.calls
    assert answer == "12"  # the agent never saw the abort
    assert second["prompt_ids"] == first["prompt_ids"] + manager.ids[:1]
    assert second["max_tokens"] == 7 and second["rid"] == f"{first['rid']}.1"
    [sample] = trace["samples"]
    n = len(first["prompt_ids"])
    assert sample["response_ids"] == manager.ids
    assert sample["logprobs"] == [-0.5 * n, -0.5 * (n + 1), -0.5 * (n + 2)]
    assert sample["version_runs"] == [["2", 1], ["3", 2]] and sample["resumed"] == 1
    # veRL's row spans both weight versions.
    [row] = agent_loop_outputs(make_outcome(step=3, trace=trace))
    assert (row.extra_fields["min_global_steps"], row.extra_fields["max_global_steps"]) == (2, 3)


async def test_a_generation_veRL_keeps_aborting_is_a_503_to_the_agent():
    manager = ServerManager("", global_steps=2, stop_reason="aborted")
    manager.ids = []
    _, answer = await _turn(manager, ResumePolicy(first_backoff=0.001))
    assert isinstance(answer, openai.APIStatusError) and answer.status_code == 503
    assert "aborted this turn 4 times in a row without a new token" in str(answer)
    assert len(manager.calls) == 4


@pytest.mark.parametrize("log_probs", [None, [-0.5]])
async def test_missing_log_probs_are_an_error_not_a_silent_gap(log_probs):
    manager = ServerManager("42", global_steps=1)

    async def generate(request_id, *, prompt_ids, sampling_params, **kwargs):
        return TokenOutput(token_ids=manager.ids, log_probs=log_probs)

    manager.generate = generate
    _, answer = await _turn(manager)
    assert isinstance(answer, openai.APIStatusError) and answer.status_code == 502


async def test_veRLs_async_client_is_asked_once_per_attempt_so_each_tokens_version_is_kept(
    monkeypatch,
):
    """veRL's async trainers hand out a `FullyAsyncLLMServerClient`, whose own resume loop would
    merge an aborted generation and its continuation under the last version only: the backend
    skips that loop (one `LLMServerClient.generate` per attempt) and the gateway resumes."""
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

    ids = [*TOK.encode("12"), TOK.encode("<|im_end|>")[0]]
    answers = [(ids[:1], 4, "aborted"), (ids[1:], 5, "completed")]
    calls: list[str] = []

    async def one_attempt(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        calls.append(request_id)
        token_ids, steps, reason = answers.pop(0)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=[-0.25] * len(token_ids),
            stop_reason=reason,
            extra_fields={"global_steps": steps},
        )

    monkeypatch.setattr(LLMServerClient, "generate", one_attempt)
    client = FullyAsyncLLMServerClient.__new__(FullyAsyncLLMServerClient)  # no Ray, no servers
    trace, answer = await _turn(client)
    assert answer == "12" and len(calls) == 2 and calls[1] == f"{calls[0]}.1"
    [sample] = trace["samples"]
    assert sample["version_runs"] == [["4", 1], ["5", 2]] and sample["resumed"] == 1
