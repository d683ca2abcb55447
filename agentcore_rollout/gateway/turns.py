"""One turn in the gateway's own terms, whatever API the agent speaks: each API is a `Dialect` that
turns its request into a `ChatTurn` and the `TurnAnswer` back into its reply, stream and errors.

The sessions, rendering, sampling and traces behind every dialect are the same, so a rollout's
trace does not depend on the SDK its agent was written with. Every request field is honoured,
ignored (named in the trace) or refused, so nothing changes a turn unseen
(docs/gateway.md#which-fields-it-honours-ignores-or-refuses)."""

from __future__ import annotations

import base64
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .sessions import Session

ToolMode = Literal["none", "auto", "required"]
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class ToolChoice:
    """Which tool calls a turn may make: `mode`, narrowed to one tool by `name`."""

    mode: ToolMode = "auto"
    name: str | None = None

    def __str__(self) -> str:
        return f"{self.name!r}" if self.name else self.mode


@dataclass
class TurnRequest:
    """One turn as a backend samples it: the conversation and the request's options (checked, the
    session's sampling defaults applied), and once rendered, its prompt and end-of-turn ids."""

    messages: list[dict[str, Any]]  # OpenAI chat messages
    tools: list[dict[str, Any]] | None = None  # OpenAI chat tool definitions
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    sampling: dict[str, Any] = field(default_factory=dict)
    json_schema: dict[str, Any] | None = None  # decode only JSON matching it (response_format)
    logprobs: bool = False  # pass-through backends: token-capture ones always return them
    top_logprobs: int = 0
    prompt_ids: list[int] | None = None  # rendered by the gateway (token-capture backends)
    stop_token_ids: tuple[int, ...] = ()  # the renderer's end-of-turn ids
    model: str = ""
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class ChatTurn(TurnRequest):
    """A request, checked and converted by its dialect: what the gateway renders, samples and
    parses, and what the dialect's reply needs of the request."""

    stream: bool = False
    body: Mapping[str, Any] = field(default_factory=dict)  # the request as sent, for echoes
    ignored: list[str] = field(default_factory=list)  # fields accepted with no effect


@dataclass
class TurnAnswer:
    """A finished turn: the assistant message as the agent sees it (`content`, `tool_calls`,
    `reasoning_content`), why it ended, its usage and, if asked, its tokens' log-probs."""

    id: str
    message: dict[str, Any]
    finish_reason: str  # stop | length | tool_calls
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None  # OpenAI chat entries: token, logprob, bytes, top
    stop_sequence: str | None = None  # the stop string that ended it, when the backend says

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def reasoning(self) -> str:
        return self.message.get("reasoning_content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    def chat_message(self) -> dict[str, Any]:
        """The answer as an OpenAI chat assistant message: what the chat API replies, and what a
        stored response's conversation continues from."""
        message: dict[str, Any] = {"role": "assistant", "content": self.message.get("content")}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class Dialect:
    """An API the gateway serves at `paths` (POST). Every field of its requests is `honoured`,
    `no_effect` (ignored), `refused` (name -> why) or unknown to it (ignored too: a client's
    newer field); a `strict` dialect refuses the ones it would ignore."""

    name: str
    paths: tuple[str, ...]
    honoured: set[str]
    no_effect: set[str]
    refused: Mapping[str, str]

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict

    def turn(self, body: dict[str, Any], session: Session, model: str) -> ChatTurn:
        """The request as a ChatTurn for `session` (its sampling defaults; state a dialect keeps
        there, such as stored responses); ValueError (a 400) naming the first field refused
        (set: not null, not false)."""
        ignored = Ignored(self.strict)
        for name, why in self.refused.items():
            if body.get(name) not in (None, False):
                raise ValueError(f"{name} is not supported: {why}")
        for name, value in body.items():
            if name not in self.honoured and name not in self.refused and value is not None:
                known = name in self.no_effect
                why = "it has no effect on the turn" if known else "unknown to the gateway"
                ignored.add(name, why)
        turn = self.convert(body, session, ignored)
        turn.model = body["model"] if isinstance(body.get("model"), str) else model
        turn.body, turn.ignored = body, ignored
        return turn

    def convert(self, body: dict[str, Any], session: Session, ignored: Ignored) -> ChatTurn:
        """The request's own fields as a ChatTurn (`turn` adds the model, body and ignored)."""
        raise NotImplementedError

    def reply(self, answer: TurnAnswer, turn: ChatTurn) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, answer: TurnAnswer, turn: ChatTurn) -> Iterator[tuple[str | None, Any]]:
        """The reply as the API streams it: (SSE event name or None, data) pairs."""
        raise NotImplementedError

    def error(self, status: int, message: str, code: str | None) -> dict[str, Any]:
        """An error body in OpenAI's shape (both OpenAI APIs'); the Messages dialect has its own."""
        kind = "invalid_request_error" if status < 500 else "api_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# -- checks the dialects share --------------------------------------------------------------------


class Ignored(list[str]):
    """The names of the fields a request set that change nothing sampled, in order, once each.
    A strict gateway refuses each instead."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict

    def add(self, name: str, why: str) -> None:
        if self.strict:
            raise ValueError(f"{name} is not honoured ({why}), and this gateway is strict")
        if name not in self:
            self.append(name)


def steering(value: Any, name: str, ignored: Ignored) -> None:
    """A setting that steers a hosted model (effort, verbosity): the policy has no such knob,
    and what it samples is in the trace either way, so any value is ignored; one other than
    the API's default is named with its value (`reasoning_effort=high`)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    default = STEERING_DEFAULTS.get(name)
    ignored.add(name if value == default else f"{name}={value}", "the policy is not steered")


STEERING_DEFAULTS = {  # each API's documented default
    "reasoning_effort": "medium",
    "verbosity": "medium",
    "reasoning.effort": "medium",
    "text.verbosity": "medium",
    "output_config.effort": "high",
    "messages.output_config.effort": "high",
}


SEAL_PREFIX = "agw1."  # what this gateway's sealed reasoning starts with


def seal_reasoning(text: str) -> str:
    """The policy's reasoning as an opaque token (Anthropic's thinking `signature`, the
    Responses API's `encrypted_content`), so a client that keeps only the token sends the text
    back and the next prompt extends what was sampled. Sealed, not encrypted: the agent saw
    the text, and a changed one only splits the trace's sample."""
    return SEAL_PREFIX + base64.urlsafe_b64encode(zlib.compress(text.encode())).decode()


def unseal_reasoning(token: Any) -> str | None:
    """The text of a token `seal_reasoning` made; None for any other (another service's)."""
    if not isinstance(token, str) or not token.startswith(SEAL_PREFIX):
        return None
    try:
        return zlib.decompress(base64.urlsafe_b64decode(token[len(SEAL_PREFIX) :])).decode()
    except (ValueError, zlib.error):
        return None


def mode_choice(value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice | None:
    """An OpenAI `tool_choice` given as a mode (absent: auto with tools, else none), or None
    when it is given in another form."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if value not in ("none", "auto", "required"):
        return None
    if value == "required" and not tools:
        raise ValueError("tool_choice 'required' needs tools")
    return ToolChoice(value)


def json_schema_of(kind: Any, schema: Any, where: str) -> dict[str, Any] | None:
    """The JSON schema a `response_format`-like option asks for: None for plain text, `{"type":
    "object"}` for JSON mode."""
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        if not isinstance(schema, dict):
            raise ValueError(f"{where}: a json_schema format needs its schema as an object")
        return schema
    raise ValueError(f"{where}: type must be text, json_object or json_schema, not {kind!r}")


def top_logprobs_of(value: Any, where: str = "top_logprobs") -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ValueError(f"{where} must be an integer from 0 to {MAX_TOP_LOGPROBS}")
    return value


def named_choice(name: Any, tools: list[dict[str, Any]] | None, where: str) -> ToolChoice:
    names = {t["function"].get("name") for t in tools or ()}
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"{where} names {name!r}, which is not one of the request's tools")
    return ToolChoice("required", name)
