"""Wire contract v1: what the engine sends to agents, what agents write back, and how S3/SQS
tell the engine about it.

Everything that crosses a process boundary is defined here, once, as pydantic models. Parsing
never raises anything but `ContractError`, whose message is one line naming what is wrong, so
callers can turn any bad payload, object or message into a named outcome without a traceback.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SCHEMA_VERSION = 1
CONTROL_KEY = "_rollout"
DEFAULT_MAX_RESULT_BYTES = 8 * 1024 * 1024
SESSION_ID_MIN, SESSION_ID_MAX = 33, 256  # AgentCore's runtimeSessionId rule


class ContractError(ValueError):
    """A payload, result object or notification does not follow the wire contract.

    `reason` names the kind of fault in one word (`schema`, `not_json`, `version`, `too_large`,
    `signature`, `wrong_object`), so invalid results can be counted by cause.
    """

    def __init__(self, message: str, reason: str = "schema") -> None:
        super().__init__(message)
        self.reason = reason


class Outcome(StrEnum):
    """The terminal outcome of one rollout request. Every request ends in exactly one."""

    OK = "ok"
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    SUBMIT_FAILED = "submit_failed"
    INVALID_RESULT = "invalid_result"
    CANCELLED = "cancelled"


AgentStatus = Literal["ok", "agent_error", "timeout", "cancelled"]
"""The subset of outcomes an agent may write into its own result."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- request


class ResultTarget(_Model):
    """Where the agent writes its result, and optionally which queue it notifies itself."""

    bucket: str = Field(min_length=3)
    key: str = Field(min_length=1)
    queue_url: str | None = None


class LLMSettings(_Model):
    """How the agent reaches the policy: an OpenAI-compatible endpoint and a per-session key."""

    base_url: str
    model: str
    api_key: str = "EMPTY"
    sampling: dict[str, Any] = Field(default_factory=dict)

    def __repr__(self) -> str:  # keep the key out of logs and tracebacks
        return f"LLMSettings(base_url={self.base_url!r}, model={self.model!r}, api_key='***')"


class RolloutControl(_Model):
    """The `_rollout` block the engine adds to the user's payload."""

    v: Literal[1] = SCHEMA_VERSION
    exp_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    step: int = Field(ge=0)
    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    input_id: str
    sample_index: int = Field(ge=0)
    session_id: str = Field(min_length=SESSION_ID_MIN, max_length=SESSION_ID_MAX)
    result: ResultTarget
    llm: LLMSettings | None = None
    deadline: float = Field(description="unix seconds; counted from dispatch so cold start counts")
    sig_key: str = Field(min_length=16, repr=False)


def split_payload(payload: dict[str, Any]) -> tuple[dict[str, Any], RolloutControl]:
    """Separate the user's payload from the control block, validating the latter."""
    if not isinstance(payload, dict):
        raise ContractError(f"payload must be a JSON object, got {type(payload).__name__}")
    raw = payload.get(CONTROL_KEY)
    if raw is None:
        raise ContractError(f"payload has no {CONTROL_KEY!r} control block")
    _check_version(raw, "control block")
    control = _validate(RolloutControl, raw, "control block")
    user = {k: v for k, v in payload.items() if k != CONTROL_KEY}
    return user, control


# --------------------------------------------------------------------------- result


class NamedRewards(_Model):
    """Named reward components plus the name of the one that is the training scalar."""

    components: dict[str, float]
    scalar: str

    @field_validator("scalar")
    @classmethod
    def _scalar_is_a_component(cls, v: str, info: Any) -> str:
        if v not in info.data.get("components", {}):
            raise ValueError(f"scalar {v!r} is not one of the components")
        return v


Rewards = float | list[float] | NamedRewards


def scalar_reward(rewards: Rewards | None) -> float | None:
    """The one number a trainer optimizes: the value, the sum of per-step rewards, or the
    declared component."""
    if rewards is None:
        return None
    if isinstance(rewards, NamedRewards):
        return rewards.components[rewards.scalar]
    if isinstance(rewards, list):
        return float(sum(rewards))
    return float(rewards)


class ErrorInfo(_Model):
    type: str
    message: str


class Timings(_Model):
    """Unix seconds as seen by the agent."""

    received: float
    started: float | None = None
    finished: float


class RolloutResult(_Model):
    """The one object an agent writes per request."""

    v: Literal[1] = SCHEMA_VERSION
    exp_id: str
    step: int
    request_id: str
    input_id: str
    session_id: str
    status: AgentStatus
    stop_reason: str | None = None
    rewards: Rewards | None = None
    trajectory: dict[str, Any] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    timings: Timings
    error: ErrorInfo | None = None
    sig: str = ""

    def scalar_reward(self) -> float | None:
        return scalar_reward(self.rewards)


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no spaces, UTF-8. What the signature covers."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def _signing_body(result: RolloutResult) -> bytes:
    return canonical_json(result.model_dump(mode="json", exclude={"sig"}))


def sign_result(result: RolloutResult, sig_key: str) -> RolloutResult:
    """Return `result` with `sig` set to HMAC-SHA256 of its canonical body."""
    sig = hmac.new(sig_key.encode(), _signing_body(result), hashlib.sha256).hexdigest()
    return result.model_copy(update={"sig": sig})


def verify_result(result: RolloutResult, sig_key: str) -> None:
    """Raise ContractError unless `result.sig` is the HMAC of its body under `sig_key`."""
    expected = hmac.new(sig_key.encode(), _signing_body(result), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, result.sig):
        raise ContractError(f"result {result.request_id}: signature does not match", "signature")


def encode_result(result: RolloutResult) -> bytes:
    return canonical_json(result.model_dump(mode="json"))


def decode_result(body: bytes, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> RolloutResult:
    """Parse a result object, enforcing the size limit before reading it as JSON."""
    if len(body) > max_bytes:
        raise ContractError(
            f"result object is {len(body)} bytes, over the {max_bytes} limit", "too_large"
        )
    data = _loads(body, "result object")
    _check_version(data, "result object")
    return _validate(RolloutResult, data, "result object")


# --------------------------------------------------------------------------- S3 key layout

_STEP_WIDTH = 8
_KEY_RE = re.compile(
    r"^(?:(?P<prefix>.+)/)?(?P<exp_id>[A-Za-z0-9._-]+)/(?P<step>\d{8,})/(?P<request_id>[A-Za-z0-9._-]+)\.json$"
)


class ResultKey(_Model):
    """A parsed result key; `key` is the object key exactly as it was given."""

    key: str
    prefix: str
    exp_id: str
    step: int
    request_id: str


def result_key(prefix: str, exp_id: str, step: int, request_id: str) -> str:
    """`{prefix}/{exp_id}/{step:08d}/{request_id}.json`"""
    head = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    return f"{head}{exp_id}/{step:0{_STEP_WIDTH}d}/{request_id}.json"


def parse_result_key(key: str) -> ResultKey:
    """Inverse of `result_key`; ContractError for a key that is not a result key."""
    m = _KEY_RE.match(key)
    if not m:
        raise ContractError(f"object key {key!r} is not a rollout result key")
    return ResultKey(
        key=key,
        prefix=m["prefix"] or "",
        exp_id=m["exp_id"],
        step=int(m["step"]),
        request_id=m["request_id"],
    )


# --------------------------------------------------------------------------- notifications


class ObjectRef(_Model):
    """An object some notification says was created."""

    bucket: str
    key: str
    size: int | None = None


class DirectNotification(_Model):
    """What an agent may send to SQS itself, when bucket notifications are not configured."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    kind: Literal["rollout_result"] = "rollout_result"
    bucket: str
    key: str
    exp_id: str | None = None
    request_id: str | None = None


class _S3Object(BaseModel):
    key: str
    size: int | None = None


class _S3Bucket(BaseModel):
    name: str


class _S3Entity(BaseModel):
    bucket: _S3Bucket
    object: _S3Object


class _S3Record(BaseModel):
    eventSource: str
    eventName: str
    s3: _S3Entity


class _S3Event(BaseModel):
    Records: Annotated[list[_S3Record], Field(min_length=1)]


def parse_notification(body: str) -> list[ObjectRef]:
    """Turn an SQS message body into the objects it announces.

    Accepts S3 event notifications and `DirectNotification`s; returns [] for `s3:TestEvent`
    (sent once when a bucket notification is configured). Keys in S3 events are URL-encoded,
    spaces as '+', so they are decoded with `unquote_plus`.
    """
    data = _loads(body.encode() if isinstance(body, str) else body, "notification")
    if not isinstance(data, dict):
        raise ContractError("notification is not a JSON object")
    if data.get("Event") == "s3:TestEvent":
        return []
    if "Records" in data:
        event = _validate(_S3Event, data, "S3 event")
        return [
            ObjectRef(
                bucket=r.s3.bucket.name, key=unquote_plus(r.s3.object.key), size=r.s3.object.size
            )
            for r in event.Records
            if r.eventSource == "aws:s3" and r.eventName.startswith("ObjectCreated")
        ]
    if data.get("kind") == "rollout_result":
        _check_version(data, "direct notification")
        msg = _validate(DirectNotification, data, "direct notification")
        return [ObjectRef(bucket=msg.bucket, key=msg.key)]
    raise ContractError("notification is neither an S3 event nor a rollout_result message")


# --------------------------------------------------------------------------- helpers

_M = TypeVar("_M", bound=BaseModel)


def _loads(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ContractError(f"{what} is not valid JSON: {e}", "not_json") from None


def _check_version(data: Any, what: str) -> None:
    if isinstance(data, dict) and "v" in data and data["v"] != SCHEMA_VERSION:
        raise ContractError(
            f"{what} has schema version {data['v']!r}; this engine speaks v1", "version"
        )


def first_error(e: ValidationError) -> str:
    """A pydantic error in one line: `where.it.is: what is wrong (+N more)`."""
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(root)"
    more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _validate(model: type[_M], data: Any, what: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ContractError(f"{what}: {first_error(e)}") from None
