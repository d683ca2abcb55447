"""Typed configuration, from YAML, then the environment (and `agentcore.env`), then overrides.

Later sources win. Every error names the dotted key it is about, in one line, because a
config error is the first thing a new user meets.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

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

from ._agentcore import (
    DATA_PLANE_TPS,
    GB_HOUR_USD,
    IDLE_TIMEOUT_S,
    MAX_LIFETIME_S,
    NEW_SESSIONS_PER_SECOND,
    SESSION_GB,
    SESSION_VCPUS,
    VCPU_HOUR_USD,
)
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
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")


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


def _queue_name(name: str) -> str:
    if not _QUEUE_NAME.fullmatch(name):
        raise PydanticCustomError(
            "queue_name", "not a valid SQS queue name (1-80 letters, digits, hyphens, underscores)"
        )
    return name


_BucketName = Annotated[str, AfterValidator(_bucket_name)]
_QueueName = Annotated[str, AfterValidator(_queue_name)]
_RuntimeArn = Annotated[str, AfterValidator(_runtime_arn)]


class _Section(BaseModel):
    # inf and nan are never a sensible rate, timeout or fraction, and would only fail later.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class Endpoints(_Section):
    """Endpoint overrides; None means the AWS default for the region."""

    s3: str | None = Field(default=None, description="S3's endpoint URL")
    sqs: str | None = Field(default=None, description="SQS's endpoint URL")
    agentcore: str | None = Field(default=None, description="AgentCore's data-plane endpoint URL")
    service_quotas: str | None = Field(
        default=None,
        description="Service Quotas' endpoint URL, where the engine reads AgentCore's quotas at "
        "start-up; None: AWS's, asked only for runtimes at AWS's own data plane",
    )


class GatewayReplica(_Section):
    """One gateway process: where the engine reaches its admin API, and what agents call."""

    url: str = Field(description="where the engine reaches its admin API")
    public_url: str | None = Field(default=None, description="what agents call; default url")

    @property
    def agent_url(self) -> str:
        return self.public_url or self.url


class GatewayConfig(_Section):
    """The token-capture gateway: the engine opens one session per request through its admin
    API and hands the agent that session's key. One gateway (`url`, `public_url`) or several
    replicas sharing one admin token (`replicas`): a session lives on the replica it was opened
    on (the least loaded), and its agent is given that replica's URL, so every turn lands where
    its state is. A replica that cannot be reached gets no new session for
    `dispatch.backoff_max` seconds; the sessions it held end `invalid_result` (trace lost)."""

    url: str | None = Field(
        default=None, description="the one gateway's URL, where the engine reaches its admin API"
    )
    admin_token: str = Field(
        repr=False, description="token of the admin API; every replica shares it"
    )
    public_url: str | None = Field(default=None, description="what agents call; default url")
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


class RuntimeTarget(_Section):
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
    endpoint_url: str | None = Field(
        default=None,
        description="the data plane's URL for this runtime; None: engine.endpoints.agentcore, "
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


class DispatchConfig(_Section):
    """How sessions are started and stopped, within AgentCore's quotas, each per account and
    region and shared by its endpoints: new sessions per second, data-plane calls per second
    (invokes and stops), active sessions. None: the account's applied quota, read from Service
    Quotas at start-up, else the published default."""

    start_rate: float | None = Field(
        default=None,
        gt=0,
        description="new sessions per second in each account and region, over all its "
        f"endpoints; None: the account's quota (published: {NEW_SESSIONS_PER_SECOND}/s)",
    )
    session_start_time: float = Field(default=2.0, gt=0, description="seconds a start may take")
    max_live_sessions: int | None = Field(
        default=None,
        ge=1,
        description="sessions alive at once in each account and region: with one runtime, its "
        "bound; None: the account's active-session quota (published: 5,000 in us-east-1 and "
        "us-west-2, 2,500 elsewhere). Mind your inference capacity",
    )
    stop_rate: float | None = Field(
        default=None,
        gt=0,
        description="StopRuntimeSession calls per second, with a second of burst; None: the "
        "larger of the accounts' start rates summed and 25. Stops share each account's "
        f"data-plane quota (published: {DATA_PLANE_TPS:,}/s) with invokes. Below the start "
        "rate, stopped sessions would pile up in live slots",
    )
    max_retries: int = Field(default=8, ge=0, description="retries of 429, 402, 409 and 5xx")
    backoff_base: float = Field(
        default=0.2, gt=0, description="seconds; full-jitter exponential back-off"
    )
    backoff_max: float = Field(default=20.0, gt=0, description="seconds; the back-off's cap")


class LimitsConfig(_Section):
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


class ResultsConfig(_Section):
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


class CostConfig(_Section):
    """Prices for the estimated cost of each rollout (`RolloutOutcome.cost`): its sandbox
    session's seconds at AgentCore Runtime's prices, its gateway tokens at per-token prices.

    AgentCore bills the vCPUs a session actively uses (not while it waits on the LLM) and its
    peak memory, so the defaults, a whole session's 2 vCPU and 8 GB, make the sandbox estimate
    an upper bound: set what your agent uses. Token prices default to 0 (a self-hosted policy,
    paid for by its GPUs, not per token); set them for a policy billed per token."""

    vcpu_hour_usd: float = Field(default=VCPU_HOUR_USD, ge=0, description="AgentCore's, us-east-1")
    gb_hour_usd: float = Field(default=GB_HOUR_USD, ge=0, description="AgentCore's, us-east-1")
    session_vcpus: float = Field(
        default=SESSION_VCPUS, ge=0, description="vCPUs a session is billed for, on average"
    )
    session_gb: float = Field(
        default=SESSION_GB, ge=0, description="GB of memory a session is billed for (its peak)"
    )
    prompt_usd_per_mtok: float = Field(default=0.0, ge=0, description="per million prompt tokens")
    completion_usd_per_mtok: float = Field(
        default=0.0, ge=0, description="per million completion tokens"
    )
    reused_usd_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="per million prompt tokens the gateway reused from the session's earlier "
        "turns (a prefix cache's hits); None: the prompt price",
    )

    @property
    def sandbox_usd_per_second(self) -> float:
        return (self.session_vcpus * self.vcpu_hour_usd + self.session_gb * self.gb_hour_usd) / 3600


_SECTIONS = {"dispatch": DispatchConfig, "limits": LimitsConfig, "results": ResultsConfig}


class EngineConfig(_Section):
    """Everything the engine needs to dispatch rollouts and collect their results."""

    exp_id: str = Field(
        default="default",
        pattern=ID_PATTERN,
        max_length=ID_MAX,
        description="experiment id: part of every result key; other ids are left alone",
    )
    region: str = Field(default="us-east-1", description="AWS region (also from AWS_REGION)")
    bucket: _BucketName | None = Field(
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
    endpoints: Endpoints = Field(default_factory=Endpoints)
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

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """A key of a section written at the top (as before sections existed): one line that
        names where it lives now."""
        if isinstance(data, dict):
            for key in data:
                for name, section in _SECTIONS.items():
                    if key in section.model_fields:
                        raise PydanticCustomError(
                            "moved",
                            "{key} moved: write engine.{name}.{key}",
                            {"key": key, "name": name},
                        )
        return data

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

    def require_targets(self) -> None:
        """Raise ConfigError naming the first of bucket/queue_url/runtime_arn left unset."""
        for name in ("bucket", "queue_url", "runtime_arn"):
            unset = not self.all_runtimes if name == "runtime_arn" else not getattr(self, name)
            if unset:
                env = f"{ENV_PREFIX}{name.upper()}"
                also = " or engine.runtimes" if name == "runtime_arn" else ""
                raise ConfigError(
                    f"config: engine.{name}{also} is not set (in the config or {env})"
                )


class LocalConfig(_Section):
    """The embedded stack (`stack: local`): moto, the runtime emulator, the local policy."""

    app: str = Field(
        default="examples.math_agent.app:app",
        description="module:attribute of the RolloutApp each session runs",
    )
    mode: Literal["process", "in_process", "container"] = Field(
        default="process",
        description="`process`: an agent process per session; `in_process`: one shared app (fast, "
        "for tests); `container`: a container of `image` per session",
    )
    image: str = Field(
        default="localhost/agentcore-rollout-agent:local",
        min_length=1,
        description="mode container: the agent's image, built from `dockerfile` when missing "
        "(`app` is then the image's)",
    )
    dockerfile: str = Field(
        default="examples/math_agent/Dockerfile",
        description="what `agentcore-rollout local build` builds `image` from",
    )
    container_engine: Literal["auto", "podman", "docker"] = Field(
        default="auto", description="mode container: podman or docker (auto: podman if present)"
    )
    bucket: _BucketName = Field(
        default="agentcore-rollout-local", description="the local stack's results bucket"
    )
    queue: _QueueName = Field(
        default="agentcore-rollout-results", description="the local stack's results queue"
    )
    cold_start: float = Field(
        default=0.0, ge=0, description="simulated seconds before a new session's agent starts"
    )
    new_sessions_per_second: float | None = Field(
        default=NEW_SESSIONS_PER_SECOND,
        gt=0,
        description="emulator's new sessions per second per account, all its endpoints "
        "together (429 above it); None: none",
    )
    data_plane_tps: float | None = Field(
        default=DATA_PLANE_TPS,
        gt=0,
        description="emulator's data-plane calls per second per account, invokes and stops "
        "together (429 above it); None: none",
    )
    max_sessions: int = Field(
        default=64,
        ge=1,
        description="emulator's live sessions per account (402 above it), which the engine reads "
        "as the account's quota: as many agents as this machine runs at once (AgentCore: 5,000)",
    )
    endpoints: int = Field(
        default=1,
        ge=1,
        description="endpoints of the emulator's runtime (DEFAULT, endpoint_2, ...), sharing "
        "its account's quotas; the engine starts sessions on all",
    )
    idle_timeout: float = Field(
        default=IDLE_TIMEOUT_S, gt=0, description="seconds after which an idle session is ended"
    )
    max_lifetime: float = Field(
        default=MAX_LIFETIME_S,
        gt=0,
        description="seconds after which any session is ended, busy or not",
    )
    # What the workers serve: the toy (numpy, char tokenizer), or a Hugging Face causal LM on
    # CPU, named (a known model, converted once into a cache) or a model directory; the gateway
    # then renders with that model's tokenizer and chat template. Resolved by the stack (core
    # knows no model names).
    policy: str = Field(
        default="toy", min_length=1, description="toy | a known model name | a model directory"
    )
    policy_seed: int = Field(
        default=0, description="seed of the toy policy (and the workers' sampling)"
    )
    policy_params: str | None = Field(default=None, description=".npz of trained toy parameters")
    policy_workers: int = Field(default=2, ge=1, description="behind sglang-router when > 1")
    # One by default: on cores shared with other work, a worker's pool of 2 threads measured 6x
    # slower than 1 (SmolLM2, 32 sequences, 2 cores under load 6: 5.5 vs 33 tokens/s).
    policy_threads: int = Field(default=1, ge=1, description="torch threads per model worker")
    record_samples: bool = Field(default=False, description="workers keep /debug/samples")
    token_delay: float = Field(
        default=0.0,
        ge=0,
        description="seconds the toy takes per token, so its generations are in flight to "
        "abort and resume, as a real model's are (a model policy is paced by its compute)",
    )
    gateway: bool = Field(default=True, description="token-capture gateway in front of the policy")
    gateway_replicas: int = Field(
        default=1, ge=1, description="gateway processes; each session on one (engine.gateway)"
    )
    max_context: int = Field(default=2048, ge=16, description="gateway context limit, tokens")
    agent_log_dir: str | None = Field(
        default=None, description="write each agent process's output here"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """The emulator's rates as they were before AgentCore counted them per account."""
        old = {"invoke_tps": "data_plane_tps", "new_sessions_per_minute": "new_sessions_per_second"}
        for key in old.keys() & (data if isinstance(data, dict) else {}):
            raise PydanticCustomError(
                "renamed",
                "{key} is now local.{new}, per account as AgentCore counts it since August 2026",
                {"key": key, "new": old[key]},
            )
        return data

    @model_validator(mode="after")
    def _params_for_the_toy(self) -> LocalConfig:
        if self.policy_params and self.policy != "toy":
            raise ValueError(
                "policy_params is the toy's .npz; a model's weights are its directory "
                f"(local.policy={self.policy!r})"
            )
        if self.token_delay and self.policy != "toy":
            raise ValueError(f"token_delay paces the toy, not local.policy={self.policy!r}")
        return self


class RunConfig(_Section):
    """What `agentcore-rollout run` rolls out."""

    data: str = Field(
        default="examples/math_agent/data/train.jsonl",
        description="JSONL, one payload per line; `id` names its group",
    )
    n: int = Field(default=4, ge=1, description="samples per prompt (a GRPO group)")
    out: str = Field(default="out", description="rollouts.jsonl and summary.json go here")
    step: int = Field(default=0, ge=0, description="policy version written into every request")
    timeout: float | None = Field(
        default=None, gt=0, description="default: engine.limits.rollout_timeout"
    )
    min_ok_fraction: float = Field(
        default=0.5, ge=0, le=1, description="below it, the run exits 3 (outputs still written)"
    )


class TrainConfig(_Section):
    """What `agentcore-rollout train` does: GRPO on the local policy (`local.policy`: the toy or
    a Hugging Face model), each step a batch of groups rolled out through the whole pipeline."""

    data: str = Field(
        default="examples/math_agent/data/train.jsonl",
        description="JSONL, one prompt per line (ids as for run)",
    )
    out: str = Field(
        default="out/train",
        description="metrics.jsonl, reward_curve.png and the weights of every step",
    )
    steps: int = Field(default=20, ge=1, description="training steps")
    n: int = Field(default=8, ge=1, description="members trained per group")
    extra: int = Field(default=0, ge=0, description="more submitted, cancelled once n are ok")
    min_ok: int = Field(default=2, ge=1, description="fewer ok members: the group is skipped")
    groups_per_step: int | None = Field(default=None, ge=1, description="default: one per row")
    lr: float = Field(default=8.0, gt=0, description="learning rate of the policy-gradient step")
    clip: float = Field(default=0.2, gt=0, description="PPO ratio clip")
    asynchronous: bool = Field(
        default=False,
        description="rollouts never wait for an update: each resolved group is replaced at "
        "once, and a weight push aborts the turns in flight, which resume under the new "
        "weights; needs engine.limits.max_staleness >= 1 (`train --async`)",
    )


class Config(_Section):
    stack: Literal["local", "aws"] = Field(
        default="local",
        description="`local`: start the embedded stack; `aws`: use the configured endpoints",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)


def load_config(
    path: str | Path | None = None,
    *,
    env_file: str | Path | None = "agentcore.env",
    environ: Mapping[str, str] | None = None,
    overrides: Iterable[str] | Mapping[str, Any] = (),
) -> Config:
    """Load YAML at `path`, apply environment variables, then `key.path=value` overrides."""
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
        return Config.model_validate(data)
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
    (`AGENTCORE_ROLLOUT_ENDPOINTS__S3`). `AWS_REGION` sets the region. An empty variable is
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
