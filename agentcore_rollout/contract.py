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
import math
import re
import secrets
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

SCHEMA_VERSION = 1
CONTROL_KEY = "_rollout"
ENVIRONMENT_KEY = "environment"
"""A payload's environment (a Harbor task's environment id): once a runtime of the engine's
names an environment (`RuntimeTarget.environment`), the request starts only on runtimes of
its payload's."""
VERIFIER_KEY = "verifier"
"""A payload key the engine takes out before the agent sees the payload: the payload of the
rollout's verifier, invoked in a session of its own (of its own `environment`) once the
agent's session ended `ok`, with `AGENT_ARTIFACTS_KEY` added; the verifier's rewards are the
rollout's, and a verifier that cannot judge ends it `verifier_error`."""
AGENT_ARTIFACTS_KEY = "agent_artifacts"
ARTIFACTS_KEY = "artifacts"
"""In an agent's result's trajectory: what its session handed over for the verifier,
`{"key", "sha256", "bytes"}`, at `artifacts_key` of its result key."""
DEFAULT_MAX_RESULT_BYTES = 8 * 1024 * 1024
SESSION_ID_MIN, SESSION_ID_MAX = 33, 256  # AgentCore's runtimeSessionId rule
WARM_KEY = "_warm"
"""A payload of only this key starts a session and nothing else: the agent answers at once
(`{"status": "accepted", "warm": true}`), and a later invocation of the same session runs the
rollout, its reply saying `"warm": true` too while the session is the one warmed."""
WARM_UP_PAYLOAD = json.dumps({WARM_KEY: {"v": SCHEMA_VERSION}}).encode()
_ID_CHARS = r"[A-Za-z0-9._-]+"
ID_PATTERN, ID_MAX = rf"^{_ID_CHARS}$", 128  # exp_id and request_id: safe in a key and a URL
MAX_DEPTH = 64
"""How deeply arrays and objects may nest in a result, counting the result object itself.

Real trajectories nest under 10 levels (messages, content parts, tool-call arguments), so 64
refuses none of them; and it keeps every recursive reader of a result (json, pydantic, the
trainer's own code) far below Python's default recursion limit of 1000, which a 10,000-deep
object would blow in the agent, the engine or the trainer instead of failing as one named
error."""


class ContractError(ValueError):
    """A payload, result object or notification does not follow the wire contract.

    `reason` names the kind of fault in one word (`schema`, `not_json`, `version`, `too_large`,
    `signature`, `wrong_object`, `not_finite`, `too_deep`), so invalid results can be counted
    by cause.
    """

    def __init__(self, message: str, reason: str = "schema") -> None:
        super().__init__(message)
        self.reason = reason


class Outcome(StrEnum):
    """The terminal outcome of one rollout request. Every request ends in exactly one."""

    OK = "ok"
    AGENT_ERROR = "agent_error"
    VERIFIER_ERROR = "verifier_error"
    """The agent ran, but what judges it could not (a task's tests missing, crashing or past
    their time, no reward written): no reward at all, rather than a 0 that would train."""
    TIMEOUT = "timeout"
    SUBMIT_FAILED = "submit_failed"
    INVALID_RESULT = "invalid_result"
    CANCELLED = "cancelled"
    STALE = "stale"
    """Still running when the engine's step moved more than `max_staleness` past its own: its
    session is stopped, and a result it writes anyway is kept apart (`take_late`)."""
    ENGINE_ERROR = "engine_error"
    """A bug in the engine itself ended it (logged with its traceback): neither the agent's
    failure nor the platform's."""


AgentStatus = Literal["ok", "agent_error", "verifier_error", "timeout", "cancelled"]
"""The subset of outcomes an agent may write into its own result: `Outcome` values (the
agent side writes the members)."""


class _Model(BaseModel):
    # No NaN or infinity in any number field: JSON has no such values, and a trainer must not
    # get one as a reward. `ser_json_inf_nan="constants"` keeps a non-finite number in untyped
    # data (a trajectory) a number when dumped, so `canonical_json` refuses it rather than
    # pydantic silently turning it into null.
    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, ser_json_inf_nan="constants"
    )


# --------------------------------------------------------------------------- request


INLINE_RESULT_MAX_BYTES = 64 * 1024
"""The largest result an agent sends in its own SQS message besides writing it to S3 (SQS
bills each 64 KiB of a message as a request; its messages hold 256 KiB at least)."""


class ResultTarget(_Model):
    """Where the agent writes its result, and optionally which queue it notifies itself.

    With `queue_url`, after its put succeeds the agent sends a `DirectNotification` there,
    carrying the signed result itself when its bytes are at most `inline_max_bytes`: the
    engine verifies it as it would the object and needs no GetObject. S3 stays the record:
    the message is sent only after the object is written, and the bucket's own notification
    still arrives, so a message that is lost or fails verification loses nothing."""

    bucket: str = Field(min_length=3)
    key: str = Field(min_length=1)
    queue_url: str | None = None
    inline_max_bytes: int = Field(default=0, ge=0)


class LLMSettings(_Model):
    """How the agent reaches the policy: an OpenAI-compatible endpoint and a per-session key."""

    base_url: str
    model: str = "policy"
    api_key: str = "EMPTY"
    sampling: dict[str, Any] = Field(default_factory=dict)

    def __repr__(self) -> str:  # keep the key out of logs and tracebacks
        return f"LLMSettings(base_url={self.base_url!r}, model={self.model!r}, api_key='***')"


TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
"""W3C Trace Context's `traceparent`: version, trace id, parent span id, flags."""


class RolloutControl(_Model):
    """The `_rollout` block the engine adds to the user's payload."""

    v: Literal[1] = SCHEMA_VERSION
    exp_id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    step: int = Field(ge=0)
    request_id: str
    input_id: str
    sample_index: int
    session_id: str = Field(min_length=SESSION_ID_MIN, max_length=SESSION_ID_MAX)
    result: ResultTarget
    llm: LLMSettings | None = None
    deadline: float = Field(description="unix seconds, from the invocation: cold start counts")
    sig_key: str = Field(min_length=16, repr=False)
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, ge=1024)
    """The largest result object the engine accepts, so the agent can refuse a bigger one as
    its own error instead of writing an object the engine would throw away."""
    traceparent: str | None = Field(default=None, pattern=TRACEPARENT_PATTERN)
    """The W3C trace context of the rollout's `agent` span, when the engine exports traces
    (OpenTelemetry): the agent's own spans, and its LLM calls' `traceparent` header, join it."""

    @model_validator(mode="after")
    def _request_fields(self) -> RolloutControl:
        check_request(self.request_id, self.input_id, self.sample_index)
        return self


def check_request(request_id: Any, input_id: Any, sample_index: Any, payload: Any = None) -> None:
    """The rules every request meets, in one line of ContractError (a ValueError): applied by
    the engine's `submit` and `resume` before anything is taken, and by the agent to the
    control block it receives. `payload` (the user's, before the engine adds its block) is
    checked when given."""
    id_like = isinstance(request_id, str) and len(request_id) <= ID_MAX
    if not id_like or not re.match(ID_PATTERN, request_id):
        raise ContractError(
            f"request_id {request_id!r}: 1-{ID_MAX} characters of letters, digits, '.', '_', '-'"
        )
    if not isinstance(input_id, str) or not input_id:
        raise ContractError(f"input_id {input_id!r}: must be a non-empty string")
    if isinstance(sample_index, bool) or not isinstance(sample_index, int):
        raise ContractError(f"sample_index {sample_index!r}: must be an integer")
    if sample_index < 0:
        raise ContractError(f"sample_index {sample_index}: must be >= 0")
    if payload is None:
        return
    if not isinstance(payload, dict):
        raise ContractError(f"payload must be a dict (a JSON object), got {type(payload).__name__}")
    if CONTROL_KEY in payload:
        raise ContractError(f"payload must not hold the {CONTROL_KEY!r} key: the engine writes it")
    verifier = payload.get(VERIFIER_KEY)
    if verifier is not None and (not isinstance(verifier, dict) or VERIFIER_KEY in verifier):
        raise ContractError(f"payload {VERIFIER_KEY!r}: a payload (a dict) without one of its own")
    if verifier is not None and len(verifier_request_id(request_id)) > ID_MAX:
        raise ContractError(f"request_id {request_id!r}: too long for a verifier's id")
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ContractError(f"payload is not JSON: {e}", "not_json") from None


def session_id(exp_id: str, step: int, request_id: str) -> str:
    """The AgentCore session of one request: readable, unique, and padded to the service's
    minimum length."""
    sid = f"{exp_id}-{step}-{request_id}"[-SESSION_ID_MAX:]
    return sid if len(sid) >= SESSION_ID_MIN else f"{sid}-".ljust(SESSION_ID_MIN, "0")


def warm_session_id(exp_id: str) -> str:
    """A session started ahead of its request (`WARM_KEY`): unique, readable as warm."""
    return f"{exp_id}-warm-{secrets.token_hex(16)}"[-SESSION_ID_MAX:]


def is_warm_up(payload: Any) -> bool:
    """The payload only warms its session up (`WARM_KEY`)."""
    return isinstance(payload, dict) and WARM_KEY in payload and CONTROL_KEY not in payload


def new_run_secret() -> str:
    """A fresh run secret, for a run that configured none."""
    return secrets.token_hex(32)


def signing_key(run_secret: str, exp_id: str, request_id: str) -> str:
    """A request's signing key, derived from the run secret rather than stored: an engine with
    the same secret verifies results of requests an earlier engine submitted. The secret
    itself never leaves the engine."""
    message = f"{exp_id}/{request_id}".encode()
    return hmac.new(run_secret.encode(), message, hashlib.sha256).hexdigest()


def split_payload(payload: dict[str, Any]) -> tuple[dict[str, Any], RolloutControl]:
    """Separate the user's payload from the control block, validating the latter."""
    if not isinstance(payload, dict):
        raise ContractError(f"payload must be a JSON object, got {type(payload).__name__}")
    raw = payload.get(CONTROL_KEY)
    if raw is None:
        raise ContractError(f"payload has no {CONTROL_KEY!r} control block")
    _check_version(raw, "control block")
    _check(raw, "control block")  # its strings come back in the result, which must encode
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

    @field_validator("rewards")
    @classmethod
    def _finite_scalar(cls, v: Rewards | None) -> Rewards | None:
        """Each reward is finite by type; their sum, the training scalar, must be too."""
        total = scalar_reward(v)
        if total is not None and not math.isfinite(total):
            what = "sum of per-step rewards overflows to" if isinstance(v, list) else "reward is"
            raise PydanticCustomError(
                "not_finite", "{what} {total}", {"what": what, "total": total}
            )
        return v

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
    """Parse a result object, enforcing the size limit before reading it as JSON, and the
    rules of `check_json` before the schema, so an object a hostile agent wrote by hand (NaN,
    a lone surrogate, 10,000 levels deep) is a ContractError, not a crash in the engine."""
    if len(body) > max_bytes:
        raise ContractError(
            f"result object is {len(body)} bytes, over the {max_bytes} limit", "too_large"
        )
    return _result_from_json(_loads(body, "result object"), "result object")


def _result_from_json(data: Any, what: str) -> RolloutResult:
    _check_version(data, what)
    _check(data, what)
    return _validate(RolloutResult, data, what)


_Where = tuple[Any, Any] | None  # (key, where the parent is), linked up to the root: None
_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def check_json(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise ContractError unless `value` can go on the wire as interoperable JSON: every float
    finite (`not_finite`), every string and key valid Unicode, that is without a lone
    surrogate, which UTF-8 cannot encode (`not_json`), and arrays and objects nested at most
    `max_depth` deep, `value` itself being level 1 (`too_deep`). The message says where, as
    `trajectory.messages[3].content: invalid unicode (lone surrogate)`.

    Walks without recursion, so a 10,000-deep or cyclic value is refused at level
    `max_depth + 1` rather than overflowing the stack. Mappings, lists, tuples and pydantic
    models are walked into; any other object is left to the serializer. Both sides call it on
    every result, so the loop dispatches on exact classes first.
    """
    # The root rides in a one-item list at level 0, so it is checked like any other item;
    # `_path` drops that list's index.
    stack: list[tuple[Any, int, _Where]] = [([value], 0, None)]
    while stack:
        container, level, where = stack.pop()
        if level > max_depth:
            raise ContractError(
                f"{_path(where)}: nested deeper than {max_depth} levels", "too_deep"
            )
        if container.__class__ is dict:
            pairs = container.items()
        elif isinstance(container, list | tuple):
            pairs = enumerate(container)
        else:
            pairs = container.items() if isinstance(container, Mapping) else iter(container)
        for key, item in pairs:
            if key.__class__ is str and not key.isascii() and _SURROGATE.search(key):
                raise ContractError(
                    f"{_path(where)}: key {key!r} is invalid unicode (lone surrogate)",
                    "not_json",
                )
            kind = item.__class__
            if kind not in _JSON_CLASSES:  # a subclass or another object: classify it slowly
                kind = _json_class(item)
            if kind is str:
                if not item.isascii() and _SURROGATE.search(item):
                    raise ContractError(
                        f"{_path((key, where))}: invalid unicode (lone surrogate)", "not_json"
                    )
            elif kind is float:
                if not -math.inf < item < math.inf:
                    raise ContractError(
                        f"{_path((key, where))}: non-finite number {item}", "not_finite"
                    )
            elif kind is dict or kind is list:
                stack.append((item, level + 1, (key, where)))


_JSON_CLASSES = frozenset({str, float, int, bool, type(None), dict, list})


def _json_class(item: Any) -> type:
    """What `check_json` treats `item` as: str, float, dict, list, or (not checked) None."""
    if isinstance(item, str | float):
        return str if isinstance(item, str) else float
    if isinstance(item, Mapping | BaseModel):
        return dict
    return list if isinstance(item, list | tuple) else type(None)


def _path(where: _Where) -> str:
    """`trajectory.messages[3].content` for the linked keys. Odd keys are quoted, in full:
    cut short, a secret in one would escape the writer's scrubbing."""
    keys: list[Any] = []
    while where is not None:
        key, where = where
        keys.append(key)
    out = ""
    for key in reversed(keys[:-1]):  # the last is the root's index in its one-item list
        if isinstance(key, int) and not isinstance(key, bool):
            out += f"[{key}]"
        elif _PLAIN_KEY.fullmatch(key := str(key)):
            out += f".{key}" if out else key
        else:
            out += f"[{key!r}]"
    return out or "(root)"


# --------------------------------------------------------------------------- S3 key layout

_STEP_WIDTH = 8
_KEY_RE = re.compile(
    rf"^(?:(?P<prefix>.+)/)?(?P<exp_id>{_ID_CHARS})/(?P<step>\d{{{_STEP_WIDTH},}})"
    rf"/(?P<request_id>{_ID_CHARS})\.json$"
)


class ResultKey(_Model):
    """A parsed result key; `key` is the object key exactly as it was given."""

    key: str
    prefix: str
    exp_id: str
    step: int
    request_id: str


def normal_prefix(prefix: str) -> str:
    """The result prefix as keys hold it: no leading or trailing slash (`/rollouts/` ->
    `rollouts`; `/` -> none)."""
    return prefix.strip("/")


def listing_prefix(prefix: str) -> str:
    """What to list every result under: `rollouts/` for prefix `rollouts`, the root for none."""
    return f"{normal_prefix(prefix)}/" if normal_prefix(prefix) else ""


def verifier_request_id(request_id: str) -> str:
    """The request id of a rollout's verifier (`VERIFIER_KEY`)."""
    return f"{request_id}{_VERIFIER_SUFFIX}"


def agent_request_id(request_id: str) -> str:
    """Inverse of `verifier_request_id`."""
    return request_id.removesuffix(_VERIFIER_SUFFIX)


_VERIFIER_SUFFIX = ".verify"


def artifacts_key(result_key: str) -> str:
    """Where an agent's session puts what it hands to the verifier: beside its result, under
    a suffix no result notification matches."""
    return f"{result_key.removesuffix('.json')}.artifacts.tar.gz"


def result_key(prefix: str, exp_id: str, step: int, request_id: str) -> str:
    """`{prefix}/{exp_id}/{step:08d}/{request_id}.json`"""
    return f"{listing_prefix(prefix)}{exp_id}/{step:0{_STEP_WIDTH}d}/{request_id}.json"


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
    """An object some notification says was created; `result`, the object itself as the
    agent's own message carried it (unverified: its reader checks it as it would the
    object)."""

    bucket: str
    key: str
    size: int | None = None
    result: RolloutResult | None = None


class DirectNotification(_Model):
    """What an agent sends to SQS itself, after writing its result (`ResultTarget`): where
    the object is and, if small, the signed object (`result`), as written."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    kind: Literal["rollout_result"] = "rollout_result"
    bucket: str
    key: str
    exp_id: str | None = None
    request_id: str | None = None
    result: dict[str, Any] | None = None


def direct_notification(target: ResultTarget, exp_id: str, request_id: str, body: bytes) -> str:
    """The message an agent sends after putting `body` at `target`: the signed object spliced
    in whole (no re-encoding) when it is at most `target.inline_max_bytes`."""
    note = DirectNotification(
        bucket=target.bucket, key=target.key, exp_id=exp_id, request_id=request_id
    ).model_dump_json(exclude={"result"})
    if len(body) > target.inline_max_bytes:
        return note
    return f'{note[:-1]},"result":{body.decode()}}}'


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
        inline = data.pop("result", None)  # checked as a result object, not as a dict
        msg = _validate(DirectNotification, data, "direct notification")
        result = None if inline is None else _result_from_json(inline, "inline result")
        return [ObjectRef(bucket=msg.bucket, key=msg.key, result=result)]
    raise ContractError("notification is neither an S3 event nor a rollout_result message")


# --------------------------------------------------------------------------- helpers

_M = TypeVar("_M", bound=BaseModel)


def _loads(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ContractError(f"{what} is not valid JSON: {e}", "not_json") from None
    except RecursionError:
        raise ContractError(f"{what} is nested too deeply to parse", "too_deep") from None


def _check(data: Any, what: str) -> None:
    try:
        check_json(data)
    except ContractError as e:
        raise ContractError(f"{what}: {e}", e.reason) from None


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
        finite = e.errors()[0]["type"] in ("finite_number", "not_finite")
        raise ContractError(
            f"{what}: {first_error(e)}", "not_finite" if finite else "schema"
        ) from None
