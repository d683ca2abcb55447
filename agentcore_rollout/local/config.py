"""The local stack's settings: the `local` and `train` sections of the CLI's config file, and the
emulator's.

`EmulatorSettings` is the one definition of what the emulator simulates and how it runs agents:
`LocalConfig` inherits it (its keys are `local.<key>`), and the emulator's flags derive from the
same fields, so the stack writes them from its own values."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..config import BucketName, Section
from ..runtimes.agentcore.published import (
    DATA_PLANE_TPS,
    IDLE_TIMEOUT_S,
    MAX_LIFETIME_S,
    NEW_SESSIONS_PER_SECOND,
    SYNC_TIMEOUT_S,
)

DEFAULT_RUNTIME_ARN = "arn:aws:bedrock-agentcore:us-east-1:000000000000:runtime/local_agent-0000"
STREAM_TIMEOUT = 60 * 60.0  # the service's cap on a streaming invocation
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")


def _queue_name(name: str) -> str:
    if not _QUEUE_NAME.fullmatch(name):
        raise PydanticCustomError(
            "queue_name", "not a valid SQS queue name (1-80 letters, digits, hyphens, underscores)"
        )
    return name


QueueName = Annotated[str, AfterValidator(_queue_name)]


class ContainerLimits(BaseModel):
    """What one runtime's session containers are given (mode container): cpus and memory
    (`--cpus`, `--memory`), disk (`--storage-opt size=`, where the engine's storage supports
    it), and their network: `public`, or `no-network` (an internal network, reaching only
    what the emulator relays). Written `cpus=1,memory_mb=1024,network=no-network`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    storage_mb: int | None = Field(default=None, gt=0)
    network: Literal["public", "no-network"] = "public"

    def text(self) -> str:
        """`key=value,...` of what is set (`parse` reads it back)."""
        return ",".join(f"{k}={v}" for k, v in self.model_dump(exclude_defaults=True).items())

    @classmethod
    def parse(cls, text: str) -> ContainerLimits:
        pairs = [p.partition("=") for p in text.split(",") if p]
        if bad := [k for k, eq, _ in pairs if not eq]:
            raise ValueError(f"{bad[0]!r} is not key=value")
        return cls(**{k: v for k, _, v in pairs})


class EmulatorSettings(Section):
    """What the AgentCore Runtime emulator simulates and how it runs each session's agent. Its
    quotas are per account, shared by its runtimes and endpoints, as AgentCore counts them; the
    defaults are the published ones but for `max_sessions`, sized for one machine."""

    mode: Literal["process", "in_process", "container"] = Field(
        default="process",
        description="`process`: an agent process per session; `in_process`: one shared app (fast, "
        "for tests); `container`: a container of `image` per session",
    )
    container_engine: Literal["auto", "podman", "docker"] = Field(
        default="auto", description="mode container: podman or docker (auto: podman if present)"
    )
    cold_start: float = Field(
        default=0.0,
        ge=0,
        description="simulated seconds before a new session's agent starts: added to its first "
        "invocation, before it reaches the agent (which then starts as the mode starts it)",
    )
    cold_start_per_gb: float = Field(
        default=0.0,
        ge=0,
        description="mode container: simulated seconds more per GB (10^9 bytes) of the "
        "session's image, its size as the container engine reports it (uncompressed), read "
        "once at the emulator's start: a larger image starts slower",
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
    idle_timeout: float = Field(
        default=IDLE_TIMEOUT_S, gt=0, description="seconds after which an idle session is ended"
    )
    max_lifetime: float = Field(
        default=MAX_LIFETIME_S,
        gt=0,
        description="seconds after which any session is ended, busy or not",
    )
    agent_log_dir: str | None = Field(
        default=None, description="write each agent process's output here"
    )
    agent_ready_timeout: float = Field(
        default=60.0,
        gt=0,
        description="seconds a new session's agent may take to answer /ping on an idle "
        "machine; while more agents start at once than there are cores, times the starts "
        "per core",
    )


class EmulatorConfig(EmulatorSettings):
    """What the emulator runs: the simulated service's settings (`EmulatorSettings`, those of
    `local.*`), the agent, its runtimes, and what tests vary. Each field but `app`, `command`
    and `env` is also a flag of its `main`."""

    app: str = Field(
        default="",
        description="module:attr of the app each session runs: any BedrockAgentCoreApp "
        "(RolloutApp included) or ASGI app serving POST /invocations and GET /ping",
    )
    command: tuple[str, ...] = Field(
        default=(), description="instead of app: a command serving the contract on $PORT"
    )
    image: str = Field(
        default="",
        description="the image each session runs as a container (mode container; app unused)",
    )
    runtime_images: tuple[str, ...] = Field(
        default=(),
        description="mode container: ARN=IMAGE, the image a runtime's sessions run instead of "
        "`image` (one runtime per environment, each its own image: Harbor tasks)",
        json_schema_extra={"flag": "--runtime-image"},
    )
    runtime_limits: tuple[str, ...] = Field(
        default=(),
        description="mode container: ARN=LIMITS, what a runtime's session containers are "
        "given (`cpus=1,memory_mb=1024,storage_mb=2048,network=no-network`; any key may be "
        "left out); a runtime without: unbounded, public",
        json_schema_extra={"flag": "--runtime-limits"},
    )
    host_urls: tuple[str, ...] = Field(
        default=(),
        description="loopback services of the host agents are told of in their invocations "
        "(the gateway, or the policy without one), besides the URLs of their environment: "
        "containers reach these ports alone, through the emulator's relay",
        json_schema_extra={"flag": "--host-url"},
    )
    runtime_arns: tuple[str, ...] = Field(
        default=(),
        description="the runtimes that exist (none: DEFAULT_RUNTIME_ARN alone); others are "
        "not found",
        json_schema_extra={"flag": "--runtime-arn"},
    )
    qualifiers: tuple[str, ...] = Field(
        default=("DEFAULT",),
        description="endpoint names each runtime has; a request without one means DEFAULT",
        json_schema_extra={"flag": "--qualifier"},
    )
    service_quotas: bool = Field(
        default=True,
        description="answer ListServiceQuotas (no: AccessDeniedException, as for a caller "
        "without servicequotas:ListServiceQuotas)",
    )
    sync_timeout: float = Field(default=SYNC_TIMEOUT_S, gt=0, description="a reply's cap, s")
    stream_timeout: float = Field(default=STREAM_TIMEOUT, gt=0, description="a stream's cap, s")
    throttle_every: int = Field(
        default=0, ge=0, description="fault injection: every k-th invocation answers 429 (0: never)"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment of agent processes"
    )

    def image_of(self, runtime_arn: str) -> str:
        """The image the sessions of `runtime_arn` run (mode container)."""
        images = dict(i.split("=", 1) for i in self.runtime_images)
        return images.get(runtime_arn, self.image)

    def limits_of(self, runtime_arn: str) -> ContainerLimits:
        """What the sessions of `runtime_arn` are given (mode container)."""
        limits = dict(i.split("=", 1) for i in self.runtime_limits)
        return ContainerLimits.parse(limits.get(runtime_arn, ""))

    @model_validator(mode="after")
    def _runnable(self) -> EmulatorConfig:
        """A config no emulator can run is refused when made."""
        if self.mode == "container":
            if not (self.image or self.runtime_images) or self.command:
                raise ValueError("mode='container' needs an image and no command")
            if bad := [i for i in self.runtime_images if "=" not in i]:
                raise ValueError(f"runtime_images: {bad[0]!r} is not ARN=IMAGE")
            for entry in self.runtime_limits:
                _, eq, limits = entry.partition("=")
                try:
                    if not eq:
                        raise ValueError("not ARN=LIMITS")
                    ContainerLimits.parse(limits)
                except ValidationError as e:
                    first = e.errors()[0]
                    where = ".".join(str(p) for p in first["loc"])
                    raise ValueError(f"runtime_limits {entry!r}: {where}: {first['msg']}") from None
                except ValueError as e:
                    raise ValueError(f"runtime_limits {entry!r}: {e}") from None
            return self
        if bool(self.app) == bool(self.command):
            raise ValueError("EmulatorConfig needs exactly one of app and command")
        if self.command and self.mode != "process":
            raise ValueError("a command agent needs mode='process'")
        return self


class LocalConfig(EmulatorSettings):
    """The embedded stack (`stack: local`): moto, the AgentCore Runtime emulator, the local
    policy. The emulator's settings come first: its flags
    (`python -m agentcore_rollout.local.runtime --help`) are the same, with the same defaults."""

    app: str = Field(
        default="examples.math_agent.app:app",
        description="module:attribute of the RolloutApp each session runs",
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
    bucket: BucketName = Field(
        default="agentcore-rollout-local", description="the local stack's results bucket"
    )
    queue: QueueName = Field(
        default="agentcore-rollout-results", description="the local stack's results queue"
    )
    runtime_endpoints: int = Field(
        default=1,
        ge=1,
        description="endpoints of the emulator's runtime (DEFAULT, endpoint_2, ...), sharing "
        "its account's quotas; the engine starts sessions on all",
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
    gateway_tls_cert: str | None = Field(
        default=None,
        description="PEM certificate (chain) the gateway's agents' API serves HTTPS with (its "
        "names must include the host agents call); None: plain HTTP",
    )
    gateway_tls_key: str | None = Field(
        default=None, description="PEM private key of gateway_tls_cert"
    )
    max_context: int = Field(default=2048, ge=16, description="gateway context limit, tokens")
    # A start is waited for while it makes progress (a line on its stderr, CPU time used): a
    # model loading on a busy machine can take minutes (serving/process.py).
    start_stall_seconds: float = Field(
        default=60.0,
        gt=0,
        description="seconds a starting moto, policy worker, gateway or emulator may go with no "
        "progress (no output, no CPU time used) before it is killed",
    )
    start_limit_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="seconds a starting process may take to print its URL however busy it is",
    )

    @model_validator(mode="after")
    def _params_for_the_toy(self) -> LocalConfig:
        if (self.gateway_tls_cert is None) != (self.gateway_tls_key is None):
            raise ValueError("set both gateway_tls_cert and gateway_tls_key, or neither")
        if self.policy_params and self.policy != "toy":
            raise ValueError(
                "policy_params is the toy's .npz; a model's weights are its directory "
                f"(local.policy={self.policy!r})"
            )
        if self.token_delay and self.policy != "toy":
            raise ValueError(f"token_delay paces the toy, not local.policy={self.policy!r}")
        return self


class TrainConfig(Section):
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
