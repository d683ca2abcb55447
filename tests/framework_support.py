"""The harness of the framework conformance tests (tests/test_frameworks.py).

One wire per test module: a ScriptedWorker (a real HTTP SGLang /generate server) behind a real
Gateway with the fixture tokenizer's HFRenderer, and the admin client; each test opens its own
gateway session on it (`LiveSession`) and gives the framework only what a user would: a base
URL, a key and a model name. A test scripts the policy's replies as text (`script`), runs the
framework unmodified, finishes the session and checks the trace with `assert_exact`: every
sampled token's id and log-prob is what the worker recorded it sampled, turn by turn, and
nothing the policy did not sample carries a log-prob.

The worker pops scripts in order, so the tests of a module run one at a time (pytest's default);
`script` clears what an earlier failed test left, and `assert_exact` checks every script was used.

Nothing here may reach past loopback: `quiet_frameworks()` switches off the frameworks' own
telemetry and remote look-ups before they are imported (tracing exporters, litellm's model cost
map download, LangSmith).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentcore_rollout.gateway import Gateway, GatewayAdmin, GatewaySession

from .gateway_support import ScriptedWorker, hf_renderer

MODEL = "policy"  # the model name the gateway serves; frameworks pass it through

# Set before any framework is imported: each is read at import or first use.
QUIET_ENV = {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",  # the Agents SDK exports traces to OpenAI by default
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm downloads its cost map at import otherwise
    "LITELLM_TELEMETRY": "False",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "OTEL_SDK_DISABLED": "true",  # Strands' OpenTelemetry spans: no exporter, no SDK
    "HF_HUB_OFFLINE": "1",
}


LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_outside: list[str] = []  # non-loopback look-ups and connects seen since the guard went in
_guard: list[bool] = []  # [True] once the audit hook is in


def quiet_frameworks() -> None:
    """Switch off every framework's telemetry and remote look-ups, and start recording any
    attempt to reach past loopback (`reached_outside`). Idempotent."""
    os.environ.update(QUIET_ENV)
    if not _guard:
        sys.addaudithook(_audit)  # process-wide and permanent: it only records
        _guard.append(True)


def reached_outside() -> list[str]:
    """The non-loopback host look-ups and connects made since the last call (then cleared)."""
    seen = list(_outside)
    _outside.clear()
    return seen


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect" and isinstance(args[1], tuple):
        host = args[1][0]
    else:
        return
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host is not None and host not in LOOPBACK:
        _outside.append(f"{event} {host}")


def reply_ids(text: str) -> list[int]:
    """The ids the scripted policy samples to write `text` and end its turn: the fixture
    tokenizer's canonical encoding, then the end-of-turn token."""
    tok = hf_renderer().tokenizer
    return [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]


def tool_call_text(*calls: tuple[str, dict[str, Any]]) -> str:
    """What a Hermes / Qwen2.5 model writes to call tools: one `<tool_call>` block per call,
    separated by a newline (the fixture template's own rendering, so a re-sent call re-renders
    to the very ids sampled)."""
    return "\n".join(
        f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
        for name, args in calls
    )


@dataclass
class Wire:
    """A module's live stack: the scripted policy, the gateway in front of it, its admin."""

    worker: ScriptedWorker
    gateway: Gateway
    admin: GatewayAdmin


@dataclass
class LiveSession:
    """One gateway session, as an agent framework sees it: `base_url` (the OpenAI-style
    `.../v1`), `url` (the gateway's root, for SDKs that append `/v1/...` themselves), `api_key`
    and `model`."""

    wire: Wire
    session: GatewaySession
    model: str = MODEL
    scripted: list[list[int]] = field(default_factory=list)
    _first_call: int = 0

    @property
    def url(self) -> str:
        return self.wire.gateway.url

    @property
    def base_url(self) -> str:
        return f"{self.wire.gateway.url}/v1"

    @property
    def api_key(self) -> str:
        return self.session.api_key

    def script(self, *texts: str, max_tokens: int | None = None) -> None:
        """The policy's next replies, one text per turn (each ends with end-of-turn). With
        `max_tokens` (the limit the test makes the framework send), what the worker will sample:
        the first `max_tokens` ids of each, as a server cuts a turn."""
        worker = self.wire.worker
        worker.scripts.clear()
        self._first_call = len(worker.calls)
        ids = [reply_ids(t) for t in texts]
        worker.scripts.extend(ids)
        self.scripted = [i[:max_tokens] for i in ids]

    async def finish(self) -> dict[str, Any]:
        """Close the session and return its trace."""
        return await self.wire.admin.finish_session(self.session.session_id)

    def assert_exact(self, trace: dict[str, Any], *, samples: int | None = None) -> None:
        """The trace holds exactly the scripted turns, in order, and is token-exact (see
        `assert_trace_exact`); with `samples`, the turns merged into that many samples."""
        calls = self.wire.worker.calls[self._first_call :]
        assert not self.wire.worker.scripts, "the framework made fewer policy calls than scripted"
        assert [c["output_ids"] for c in calls] == self.scripted, "sampled ids are not the script"
        assert_trace_exact(trace, calls)
        if samples is not None:
            got = [s["turns"] for s in trace["samples"]]
            assert len(got) == samples, f"turns merged into {len(got)} samples {got}, not {samples}"


def assert_trace_exact(trace: dict[str, Any], calls: Iterable[dict[str, Any]]) -> None:
    """`trace` is what the policy sampled, token for token: one turn per recorded policy call,
    in order; in each sample, every merged turn's prompt (the worker's input ids) is a prefix of
    prompt + response, its sampled ids and log-probs sit right after it as recorded, the loss
    mask is 1 on exactly those spans, and a token has a log-prob exactly when its mask is 1."""
    calls = list(calls)
    assert trace["token_capture"] is True
    assert [t["rid"] for t in trace["turns"]] == [c["rid"] for c in calls], "turns != calls"
    by_rid = {c["rid"]: c for c in calls}
    seen: list[int] = []
    for sample in trace["samples"]:
        full = sample["prompt_ids"] + sample["response_ids"]
        n_prompt = len(sample["prompt_ids"])
        response, mask, logprobs = sample["response_ids"], sample["loss_mask"], sample["logprobs"]
        assert len(response) == len(mask) == len(logprobs)
        sampled: set[int] = set()
        for index in sample["turns"]:
            seen.append(index)
            record = by_rid[trace["turns"][index]["rid"]]
            inp, out = record["input_ids"], record["output_ids"]
            assert full[: len(inp)] == inp, f"turn {index}: the prompt is not what was sent"
            start = len(inp) - n_prompt
            assert response[start : start + len(out)] == out, f"turn {index}: ids differ"
            assert logprobs[start : start + len(out)] == record["output_logprobs"]
            sampled |= set(range(start, start + len(out)))
        assert {i for i, m in enumerate(mask) if m == 1} == sampled
        assert all((lp is None) == (m == 0) for lp, m in zip(logprobs, mask, strict=True))
        assert sample["num_sampled"] == len(sampled)
    assert sorted(seen) == list(range(len(calls))), "every turn in exactly one sample"
