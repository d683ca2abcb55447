"""Typed configuration, from YAML, then the environment (and `agentcore.env`), then overrides.

Later sources win. Every error names the dotted key it is about, in one line, because a
config error is the first thing a new user meets.

The engine's settings live here (`EngineConfig`, the file's `engine` section), with the one
loader: `load_config` gives a trainer its `EngineConfig`; `load_sections` reads any model of
the whole file, as the CLI reads its own (`cli/config.py`: the local stack's and the CLI's
sections too).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from dotenv import dotenv_values
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .contract import DEFAULT_MAX_RESULT_BYTES, ID_MAX, ID_PATTERN, LLMSettings, first_error

ENV_PREFIX = "AGENTCORE_ROLLOUT_"
DEFAULT_STOP_RATE = 25.0  # StopRuntimeSession calls per second (see EngineConfig.stop_rate)
# Variables of the same prefix that are not config keys: the CLI's config path, the parent pid
# children watch, and where local.models caches converted models (its CACHE_ENV).
_RESERVED_ENV = {
    "AGENTCORE_ROLLOUT_CONFIG",
    "AGENTCORE_ROLLOUT_PARENT_PID",
    "AGENTCORE_ROLLOUT_CACHE",
}

# AgentCore's runtime ARN; the id is the runtime name ([a-zA-Z][a-zA-Z0-9_]*) plus a suffix.
_RUNTIME_ARN = re.compile(
    r"arn:[a-z0-9-]+:bedrock-agentcore:[a-z0-9-]+:[0-9]{12}:runtime/[A-Za-z][A-Za-z0-9_-]*"
)
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_M = TypeVar("_M", bound=BaseModel)


class ConfigError(ValueError):
    """The configuration is missing a key, has an unknown one, or a value out of range."""


def _bucket_name(name: str) -> str:
    """S3's naming rules, checked here so a typo is a config error naming the key, not a
    botocore InvalidBucketName after the local stack has started."""
    if not _BUCKET_NAME.fullmatch(name) or ".." in name or _is_ip_address(name):
        raise PydanticCustomError(
            "bucket_name",
            "not a valid S3 bucket name (3-63 lowercase letters, digits, dots and hyphens; "
            "a letter or digit first and last; no '..'; not an IP address)",
        )
    return name


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def _runtime_arn(arn: str) -> str:
    """Checked at load, so a bad ARN fails before anything starts, not at the first invoke."""
    if not _RUNTIME_ARN.fullmatch(arn):
        raise PydanticCustomError(
            "runtime_arn",
            "not an AgentCore runtime ARN "
            "(arn:<partition>:bedrock-agentcore:<region>:<12-digit account>:runtime/<id>)",
        )
    return arn


BucketName = Annotated[str, AfterValidator(_bucket_name)]
_RuntimeArn = Annotated[str, AfterValidator(_runtime_arn)]


class Section(BaseModel):
    """A section of the config file (the local stack's and the CLI's too): an unknown key is an
    error, an assignment is checked, and a float is finite (inf and nan are never a sensible
    rate, timeout or fraction, and would only fail later)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ServiceUrls(Section):
    """Service URL overrides; None means the AWS default for the region."""

    s3: str | None = Field(default=None, description="S3's URL")
    sqs: str | None = Field(default=None, description="SQS's URL")
    agentcore: str | None = Field(default=None, description="AgentCore's data-plane URL")
    service_quotas: str | None = Field(
        default=None,
        description="Service Quotas' URL, where the engine reads AgentCore's quotas at "
        "start-up; None: AWS's, asked only for runtimes at AWS's own data plane",
    )


_PUBLIC_URL = "what agents call; default: the agents' URL the gateway reports (its own listener)"


class GatewayReplica(Section):
    """One gateway process: where the engine reaches its admin API, and what agents call."""

    url: str = Field(description="where the engine reaches its admin API")
    public_url: str | None = Field(default=None, description=_PUBLIC_URL)


class GatewayConfig(Section):
    """The token-capture gateway: the engine opens one session per request through its admin
    API and hands the agent that session's key. One gateway (`url`, `public_url`) or several
    replicas sharing one admin token (`replicas`): a session lives on the replica it was opened
    on (the least loaded), and its agent is given that replica's URL, so every turn lands where
    its state is. A replica that cannot be reached gets no new session for
    `dispatch.backoff_max` seconds; the sessions it held end `invalid_result` (trace lost)."""

    url: str | None = Field(
        default=None,
        description="the one gateway's admin listener, where the engine reaches its admin API",
    )
    admin_token: str = Field(
        repr=False, description="token of the admin API; every replica shares it"
    )
    public_url: str | None = Field(default=None, description=_PUBLIC_URL)
    replicas: list[GatewayReplica] = Field(
        default_factory=list, description="several gateway replicas, instead of url"
    )
    max_context: int | None = Field(
        default=None, ge=1, description="tokens a turn's prompt and answer may hold"
    )
    max_turns: int | None = Field(
        default=None, ge=1, description="turns a session may take; past it a turn ends `length`"
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        """From the environment, a string: `[{url: ..., public_url: ...}, ...]` as YAML, or
        admin URLs separated by commas (`AGENTCORE_ROLLOUT_GATEWAY__REPLICAS=http://a,http://b`)."""
        if not isinstance(value, str):
            return value
        if value.strip().startswith("["):
            return yaml.safe_load(value)
        return [{"url": url.strip()} for url in value.split(",") if url.strip()]

    @model_validator(mode="after")
    def _one_way(self) -> GatewayConfig:
        if (self.url is None) == (not self.replicas):
            raise PydanticCustomError("gateway", "set url (one gateway) or replicas, not both")
        if self.replicas and self.public_url is not None:
            raise PydanticCustomError("gateway", "with replicas, set each replica's public_url")
        return self

    @property
    def all_replicas(self) -> list[GatewayReplica]:
        """Every replica: `replicas`, or the one at `url`."""
        if self.replicas:
            return list(self.replicas)
        assert self.url is not None  # _one_way
        return [GatewayReplica(url=self.url, public_url=self.public_url)]


class RuntimeTarget(Section):
    """One runtime endpoint sessions start on: an AgentCore runtime ARN and endpoint qualifier,
    with its own live bound. Its account and region (the ARN's) hold the quotas it shares with
    every other endpoint there: new sessions, data-plane calls, live sessions."""

    arn: _RuntimeArn = Field(
        description="the runtime's ARN; its account and region name the quotas it shares with "
        "the account's other runtimes and endpoints there"
    )
    qualifier: str = Field(default="DEFAULT", min_length=1, description="the endpoint's name")
    max_live_sessions: int | None = Field(
        default=None,
        ge=1,
        description="sessions alive here at once; None: only the account's bound "
        "(engine.dispatch.max_live_sessions)",
    )
    environment: str | None = Field(
        default=None,
        min_length=1,
        description="the environment its image is (a Harbor task's environment id): once any "
        "runtime names one, each request starts only on runtimes of its payload's "
        "`environment`; None: no routing",
    )
    data_plane_url: str | None = Field(
        default=None,
        description="the data plane's URL for this runtime; None: engine.service_urls.agentcore, "
        "else AWS's for the ARN's region",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_rate_of_its_own(cls, data: Any) -> Any:
        if isinstance(data, dict) and "start_rate" in data:
            raise PydanticCustomError(
                "per_account",
                "start_rate: AgentCore's new-session quota is per account and region since "
                "August 2026, not per endpoint: set engine.dispatch.start_rate",
            )
        return data

    @property
    def name(self) -> str:
        """`<arn>#<qualifier>`: how stats and the run journal name the endpoint."""
        return f"{self.arn}#{self.qualifier}"

    @property
    def region(self) -> str:
        return self.arn.split(":")[3]

    @property
    def account(self) -> str:
        """`<account id>:<region>`: AgentCore's quotas are per account and region."""
        return f"{self.arn.split(':')[4]}:{self.region}"


class DispatchConfig(Section):
    """How sessions are started and stopped, within AgentCore's quotas, each per account and
    region and shared by its endpoints: new sessions per second, data-plane calls per second
    (invokes and stops), active sessions. None: the account's applied quota, read from Service
    Quotas at start-up, else the published default."""

    start_rate: float | None = Field(
        default=None,
        gt=0,
        description="new sessions per second in each pool of runtimes (AgentCore: an account "
        "and region, over all its endpoints); None: what the runtimes report (AgentCore: the "
        "account's quota)",
    )
    session_start_time: float = Field(default=2.0, gt=0, description="seconds a start may take")
    max_live_sessions: int | None = Field(
        default=None,
        ge=1,
        description="sessions alive at once in each pool of runtimes: with one runtime, its "
        "bound; None: what the runtimes report (AgentCore: the account's active-session "
        "quota). Mind your inference capacity",
    )
    stop_rate: float | None = Field(
        default=None,
        gt=0,
        description="StopRuntimeSession calls per second, with a second of burst; None: the "
        "larger of the pools' start rates summed and 25. Stops share each pool's call rate "
        "(AgentCore: its data-plane quota) with invokes. Below the start rate, stopped "
        "sessions would pile up in live slots",
    )
    warm: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        default="auto",
        description="sessions a trainer may have started ahead of their requests "
        "(RolloutEngine.warm), at most, per environment: a number, `auto` (as many as it asks, "
        "within the live bound) or None (off). Each idles until its request comes, billed for "
        "its memory (docs/limits.md#warm-sessions)",
    )
    warm_max_idle: float = Field(
        default=600.0,
        gt=0,
        description="seconds a warm session may wait for its request before it is stopped: "
        "below the runtime's idle timeout, which would end it (AgentCore's: 15 minutes unless "
        "set)",
    )
    max_retries: int = Field(default=8, ge=0, description="retries of 429, 402, 409 and 5xx")
    backoff_base: float = Field(
        default=0.2, gt=0, description="seconds; full-jitter exponential back-off"
    )
    backoff_max: float = Field(default=20.0, gt=0, description="seconds; the back-off's cap")


class LimitsConfig(Section):
    """How long a request may wait, run and fall behind."""

    queue_timeout: float | None = Field(
        default=None,
        gt=0,
        description="seconds a request may wait to be started: for a live-session slot, the "
        "start rate and retries; None: no limit",
    )
    rollout_timeout: float = Field(default=600.0, gt=0, description="seconds from session start")
    result_grace: float = Field(default=30.0, ge=0, description="wait past deadline for a write")
    reconcile_before: float = Field(default=5.0, ge=0, description="S3 lookup this long before")
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="steps a request may fall behind the current one: with stale_policy "
        "`end`, older requests still running end `stale` at `set_step`; with `keep`, the "
        "trainer's bound on what trains (each token against the version that sampled it)",
    )
    stale_policy: Literal["end", "keep"] = Field(
        default="end",
        description="`end`: a request more than max_staleness steps behind ends `stale`, its "
        "session stopped; `keep`: it runs to its end and is delivered, its turns resuming "
        "under newer weights, and the trainer decides what of it trains",
    )


class ResultsConfig(Section):
    """How results come back: SQS long polling, their size limit, the agents' own messages."""

    wait_time: int = Field(default=20, ge=0, le=20, description="SQS long-poll seconds")
    visibility_timeout: int = Field(
        default=60, ge=0, le=43200, description="seconds a received message stays invisible"
    )
    max_result_bytes: int = Field(
        default=DEFAULT_MAX_RESULT_BYTES,
        ge=1024,
        description="larger results become `invalid_result`",
    )
    notify_directly: bool = Field(
        default=False,
        description="agents also send to SQS after the put, a small result inside: no GetObject",
    )


class CostConfig(Section):
    """Prices for the estimated cost of each rollout (`RolloutOutcome.cost`): its sandbox
    session's seconds at AgentCore Runtime's prices, its gateway tokens at per-token prices.

    AgentCore bills the vCPUs a session actively uses (not while it waits on the LLM) and its
    peak memory, so the defaults, a whole session's 2 vCPU and 8 GB, make the sandbox estimate
    an upper bound: set what your agent uses. Token prices default to 0 (a self-hosted policy,
    paid for by its GPUs, not per token); set them for a policy billed per token."""

    # AgentCore Runtime's published prices (us-east-1; check your region's): per second (1 s
    # minimum), the vCPUs a session actively uses and the peak GB it holds; a session's
    # microVM (2 vCPU, 8 GB) is at most what it is billed for.
    vcpu_hour_usd: float = Field(default=0.0895, ge=0, description="AgentCore's, us-east-1")
    gb_hour_usd: float = Field(default=0.00945, ge=0, description="AgentCore's, us-east-1")
    session_vcpus: float = Field(
        default=2.0, ge=0, description="vCPUs a session is billed for, on average"
    )
    session_gb: float = Field(
        default=8.0, ge=0, description="GB of memory a session is billed for (its peak)"
    )
    prompt_usd_per_mtok: float = Field(default=0.0, ge=0, description="per million prompt tokens")
    completion_usd_per_mtok: float = Field(
        default=0.0, ge=0, description="per million completion tokens"
    )
    reused_usd_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="per million prompt tokens the gateway reused from earlier renders (the "
        "session's earlier turns, or the system prompt and tools another session sent: a prefix "
        "cache's hits); None: the prompt price",
    )

    @property
    def sandbox_usd_per_second(self) -> float:
        return (self.session_vcpus * self.vcpu_hour_usd + self.session_gb * self.gb_hour_usd) / 3600


class EngineConfig(Section):
    """Everything the engine needs to dispatch rollouts and collect their results."""

    exp_id: str = Field(
        default="default",
        pattern=ID_PATTERN,
        max_length=ID_MAX,
        description="experiment id: part of every result key; other ids are left alone",
    )
    region: str = Field(default="us-east-1", description="AWS region (also from AWS_REGION)")
    bucket: BucketName | None = Field(
        default=None, description="results bucket; required on AWS, filled in by the local stack"
    )
    prefix: str = Field(
        default="rollouts",
        description="results at s3://bucket/prefix/exp_id/step (8 digits)/request_id.json",
    )
    queue_url: str | None = Field(
        default=None,
        description="SQS queue the bucket notifies; required on AWS, filled in by the local stack",
    )
    runtime_arn: _RuntimeArn | None = Field(default=None, description="the one runtime")
    qualifier: str = Field(default="DEFAULT", description="the one runtime's endpoint")
    runtimes: list[RuntimeTarget] = Field(
        default_factory=list,
        description="several runtime endpoints, instead of runtime_arn + qualifier: each "
        "session starts on the least loaded one with a free start token and live slot",
    )
    service_urls: ServiceUrls = Field(default_factory=ServiceUrls)
    llm: LLMSettings | None = Field(default=None, description="the policy endpoint agents call")
    gateway: GatewayConfig | None = None
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    results: ResultsConfig = Field(default_factory=ResultsConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    run_secret: str | None = Field(
        default=None,
        min_length=16,
        repr=False,
        description="derives each request's signing key; set it to resume a run after a restart",
    )

    @model_validator(mode="after")
    def _one_way_to_name_runtimes(self) -> EngineConfig:
        if self.runtimes and (self.runtime_arn is not None or self.qualifier != "DEFAULT"):
            raise PydanticCustomError(
                "runtimes", "set runtime_arn (and qualifier) for one runtime, or runtimes, not both"
            )
        names = [r.name for r in self.runtimes]
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise PydanticCustomError(
                "runtimes", "runtimes: {name} is listed twice", {"name": twice}
            )
        return self

    @property
    def all_runtimes(self) -> list[RuntimeTarget]:
        """Every runtime endpoint: `runtimes`, or the one of `runtime_arn` + `qualifier`."""
        if self.runtimes or self.runtime_arn is None:
            return list(self.runtimes)
        return [RuntimeTarget(arn=self.runtime_arn, qualifier=self.qualifier)]

    def require_targets(self, *, runtime_arn: bool = True) -> None:
        """Raise ConfigError naming the first of bucket/queue_url/runtime_arn left unset (the
        runtime only where the engine was given none)."""
        for name in ("bucket", "queue_url", "runtime_arn")[: 3 if runtime_arn else 2]:
            unset = not self.all_runtimes if name == "runtime_arn" else not getattr(self, name)
            if unset:
                env = f"{ENV_PREFIX}{name.upper()}"
                also = " or engine.runtimes" if name == "runtime_arn" else ""
                raise ConfigError(
                    f"config: engine.{name}{also} is not set (in the config or {env})"
                )


class _EngineFile(Section):
    """A config file as a trainer reads it: its `engine` section. The others (`stack`, `local`,
    `run`, `train`) are the CLI's, left to it."""

    model_config = ConfigDict(extra="ignore")
    engine: EngineConfig = Field(default_factory=EngineConfig)


def load_config(
    path: str | Path | None = None,
    *,
    env_file: str | Path | None = "agentcore.env",
    environ: Mapping[str, str] | None = None,
    overrides: Iterable[str] | Mapping[str, Any] = (),
) -> EngineConfig:
    """The engine's config: the `engine` section of the YAML at `path`, then environment
    variables, then `engine.key.path=value` overrides (`load_sections`)."""
    file = load_sections(_EngineFile, path, env_file=env_file, environ=environ, overrides=overrides)
    return file.engine


def load_sections(
    model: type[_M],
    path: str | Path | None = None,
    *,
    env_file: str | Path | None = "agentcore.env",
    environ: Mapping[str, str] | None = None,
    overrides: Iterable[str] | Mapping[str, Any] = (),
) -> _M:
    """`model`, the sections of a whole config file: YAML at `path`, then environment
    variables (`env_file`'s, then `environ`'s, by default the process's), then `key.path=value`
    overrides; any error a ConfigError of one line naming its dotted key."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    env = _read_env_file(Path(env_file)) if env_file and Path(env_file).is_file() else {}
    env.update(os.environ if environ is None else environ)
    for dotted, value in _env_overrides(env):
        _set_dotted(data, dotted, value)
    items = overrides.items() if isinstance(overrides, Mapping) else map(_split_override, overrides)
    for dotted, value in items:
        _set_dotted(data, dotted, value)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"config: {first_error(e)}") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except OSError as e:  # a directory, no permission
        raise ConfigError(f"config: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {path} is not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping at the top level")
    return data


def _read_env_file(path: Path) -> dict[str, str | None]:
    try:
        return dict(dotenv_values(path, encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"config: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {path} is not UTF-8 text (byte {e.start})") from None


def _env_overrides(env: Mapping[str, str | None]) -> list[tuple[str, Any]]:
    """`AGENTCORE_ROLLOUT_DISPATCH__START_RATE=5` -> `engine.dispatch.start_rate`; `__` nests
    (`AGENTCORE_ROLLOUT_SERVICE_URLS__S3`). `AWS_REGION` sets the region. An empty variable is
    unset, so the blanks left in a copy of agentcore.env.example mean the defaults."""
    out: list[tuple[str, Any]] = []
    if env.get("AWS_REGION"):
        out.append(("engine.region", env["AWS_REGION"]))
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX) and value:
            field = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            if name not in _RESERVED_ENV:
                out.append((f"engine.{field}", value))
    return out


def _split_override(text: str) -> tuple[str, Any]:
    """`engine.dispatch.start_rate=5`. Scalars stay strings (pydantic converts them by field
    type, so `exp_id=0001` keeps its zeros); `[...]` and `{...}` are read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"config: override {text!r} is not of the form key.path=value")
    if value.strip()[:1] in ("[", "{"):
        try:
            return key.strip(), yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"config: override {key.strip()}: value is not valid YAML") from None
    return key.strip(), value


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = value
