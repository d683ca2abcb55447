"""`deploy`, `destroy` and `infra env`: create, update and delete the AgentCore Runtime
(boto3's ``bedrock-agentcore-control``; invoking is the dispatcher's), and turn a CloudFormation
stack's outputs into ``agentcore.env``. boto3 (the ``[local]`` and ``[infra]`` extras) is imported
when a command runs. Every failure is an `InfraError` with a one-line message."""

from __future__ import annotations

import argparse
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import ConfigError
from ..runtimes.agentcore.published import (
    IDLE_TIMEOUT_S,
    LIFECYCLE_MAX_S,
    LIFECYCLE_MIN_S,
    MAX_LIFETIME_S,
)
from .terminal import console

log = logging.getLogger(__name__)

NetworkMode = Literal["PUBLIC", "VPC"]

# Patterns and bounds of the bedrock-agentcore-control API model, checked here so a bad value
# fails before any call, with a message that names the field.
RUNTIME_NAME_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9_]{0,47}")
ROLE_ARN_RE = re.compile(r"arn:aws(-[^:]+)?:iam::[0-9]{12}:role/.+")
CONTAINER_URI_RE = re.compile(
    r"(([0-9]{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?|public\.ecr\.aws)/"
    r"((?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*)"
    r"(?::([^:@]{1,300}))?(?:@(.+))?"
)
SUBNET_RE = re.compile(r"subnet-[0-9a-zA-Z]{8,17}")
SECURITY_GROUP_RE = re.compile(r"sg-[0-9a-zA-Z]{8,17}")
MAX_ENV_VARS = 50
READY_TIMEOUT_S = 900.0  # how long `deploy` waits for READY (not a session's idle timeout)

# agentcore.env keys (read by agentcore_rollout.config) from the stack outputs they come from.
STACK_OUTPUT_ENV = {
    "BucketName": "AGENTCORE_ROLLOUT_BUCKET",
    "ResultPrefix": "AGENTCORE_ROLLOUT_PREFIX",
    "QueueUrl": "AGENTCORE_ROLLOUT_QUEUE_URL",
}
# Passed to the agent containers: the config key engine.llm.base_url (the gateway).
ENV_GATEWAY_URL = "AGENTCORE_ROLLOUT_LLM__BASE_URL"


class InfraError(RuntimeError):
    """An infrastructure operation failed; ``code`` is the AWS error code if an AWS call did
    (e.g. ``ResourceNotFoundException``)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code


@dataclass(frozen=True)
class RuntimeSpec:
    """What `deploy_runtime` makes an AgentCore Runtime look like."""

    name: str
    container_uri: str
    role_arn: str
    network_mode: NetworkMode = "PUBLIC"
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()
    idle_timeout_s: int = IDLE_TIMEOUT_S
    max_lifetime_s: int = MAX_LIFETIME_S
    environment: Mapping[str, str] = field(default_factory=dict)
    gateway_url: str | None = None
    description: str = "agentcore-rollout agent runtime"

    def validate(self) -> None:
        """Raise `InfraError` for the first value the API would reject (or that makes no sense)."""
        _check_name(self.name)
        if not self.role_arn:
            raise InfraError("runtime role is missing: pass the RoleArn output of the stack")
        if not ROLE_ARN_RE.fullmatch(self.role_arn):
            raise InfraError(f"role ARN {self.role_arn!r} is not an IAM role ARN")
        if not CONTAINER_URI_RE.fullmatch(self.container_uri):
            raise InfraError(
                f"container URI {self.container_uri!r} is not an ECR image (REPO_URI:TAG)"
            )
        self._validate_network()
        lifecycle = {"idle timeout": self.idle_timeout_s, "max lifetime": self.max_lifetime_s}
        for label, value in lifecycle.items():
            if not LIFECYCLE_MIN_S <= value <= LIFECYCLE_MAX_S:
                raise InfraError(
                    f"{label} {value}s is outside {LIFECYCLE_MIN_S}..{LIFECYCLE_MAX_S}s"
                )
        if self.idle_timeout_s > self.max_lifetime_s:
            raise InfraError(
                f"idle timeout {self.idle_timeout_s}s exceeds max lifetime {self.max_lifetime_s}s"
            )
        env = self.environment_variables()
        if len(env) > MAX_ENV_VARS:
            raise InfraError(f"{len(env)} environment variables; AgentCore allows {MAX_ENV_VARS}")

    def _validate_network(self) -> None:
        if self.network_mode == "PUBLIC":
            if self.subnets or self.security_groups:
                raise InfraError("subnets and security groups need network mode VPC")
            return
        if self.network_mode != "VPC":
            raise InfraError(f"network mode {self.network_mode!r} is not PUBLIC or VPC")
        for label, values, pattern in (
            ("subnet", self.subnets, SUBNET_RE),
            ("security group", self.security_groups, SECURITY_GROUP_RE),
        ):
            if not values:
                raise InfraError(f"network mode VPC needs at least one {label}")
            if bad := [v for v in values if not pattern.fullmatch(v)]:
                raise InfraError(f"invalid {label} id {bad[0]!r}")

    def environment_variables(self) -> dict[str, str]:
        """The container's environment: the user's variables plus the gateway URL, if any."""
        env = dict(self.environment)
        if self.gateway_url:
            env[ENV_GATEWAY_URL] = self.gateway_url
        return env

    def request(self) -> dict[str, Any]:
        """The fields CreateAgentRuntime and UpdateAgentRuntime share."""
        network: dict[str, Any] = {"networkMode": self.network_mode}
        if self.network_mode == "VPC":
            network["networkModeConfig"] = {
                "subnets": list(self.subnets),
                "securityGroups": list(self.security_groups),
            }
        return {
            "agentRuntimeArtifact": {
                "containerConfiguration": {"containerUri": self.container_uri}
            },
            "roleArn": self.role_arn,
            "networkConfiguration": network,
            "lifecycleConfiguration": {
                "idleRuntimeSessionTimeout": self.idle_timeout_s,
                "maxLifetime": self.max_lifetime_s,
            },
            "environmentVariables": self.environment_variables(),
            "description": self.description,
        }


@dataclass(frozen=True)
class RuntimeInfo:
    """A runtime as the control plane reports it."""

    name: str
    runtime_id: str
    arn: str
    version: str
    status: str


def _check_name(name: str) -> None:
    if not RUNTIME_NAME_RE.fullmatch(name):
        raise InfraError(
            f"runtime name {name!r} is invalid: a letter, then up to 47 letters, digits or '_'"
        )


@contextmanager
def _aws(action: str) -> Iterator[None]:
    """Turn botocore errors into one-line `InfraError`s that say what was being done."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Error")
        message = error.get("Message", "")
        raise InfraError(f"{action}: {code}: {message}".rstrip(": "), code=code) from exc
    except BotoCoreError as exc:
        raise InfraError(f"{action}: {exc}") from exc


def aws_client(service: str, region: str | None = None, endpoint_url: str | None = None) -> Any:
    """A boto3 client; the region falls back to the usual AWS configuration chain."""
    import boto3

    with _aws(f"create {service} client"):
        return boto3.client(service, region_name=region, endpoint_url=endpoint_url)


def find_runtime(client: Any, name: str) -> dict[str, Any] | None:
    """The summary of the runtime called ``name``, or None (names are unique per region)."""
    _check_name(name)
    token: str | None = None
    while True:
        with _aws("list agent runtimes"):
            page = client.list_agent_runtimes(**({"nextToken": token} if token else {}))
        for summary in page.get("agentRuntimes", []):
            if summary.get("agentRuntimeName") == name:
                return dict(summary)
        token = page.get("nextToken")
        if not token:
            return None


def _get_runtime(client: Any, runtime_id: str) -> dict[str, Any]:
    with _aws(f"get agent runtime {runtime_id}"):
        return dict(client.get_agent_runtime(agentRuntimeId=runtime_id))


def wait_until_ready(
    client: Any,
    runtime_id: str,
    name: str,
    *,
    timeout_s: float = READY_TIMEOUT_S,
    poll_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> RuntimeInfo:
    """Poll until the runtime is READY; raise `InfraError` if it fails or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        runtime = _get_runtime(client, runtime_id)
        status = str(runtime.get("status", ""))
        if status == "READY":
            version = str(runtime.get("agentRuntimeVersion", ""))
            return RuntimeInfo(name, runtime_id, str(runtime["agentRuntimeArn"]), version, status)
        if status in ("CREATE_FAILED", "UPDATE_FAILED", "DELETE_FAILED"):
            reason = runtime.get("failureReason") or "no reason given"
            raise InfraError(f"runtime {name} ({runtime_id}) is {status}: {reason}")
        if time.monotonic() >= deadline:
            raise InfraError(
                f"runtime {name} ({runtime_id}) not READY after {timeout_s:g}s "
                f"(status {status or 'unknown'})"
            )
        sleep(poll_s)


def _check_role_exists(iam: Any, role_arn: str) -> None:
    """Fail early on a role that does not exist; skip the check if IAM refuses to tell."""
    try:
        with _aws(f"check runtime role {role_arn}"):
            iam.get_role(RoleName=role_arn.rsplit("/", 1)[-1])
    except InfraError as exc:
        if exc.code == "NoSuchEntity":
            raise InfraError(f"runtime role {role_arn} does not exist") from exc
        if exc.code is None:  # no answer from IAM (credentials, network): a real failure
            raise
        log.info("could not check role %s (%s); AgentCore will", role_arn, exc.code)


def deploy_runtime(
    spec: RuntimeSpec,
    *,
    client: Any = None,
    iam_client: Any = None,
    region: str | None = None,
    check_role: bool = True,
    timeout_s: float = READY_TIMEOUT_S,
    poll_s: float = 5.0,
) -> RuntimeInfo:
    """Create the runtime, or update it if one with this name differs (an update makes a new
    version, so a runtime that matches is left alone); wait until READY and return it. Clients
    not passed are made for ``region``."""
    spec.validate()
    client = client or aws_client("bedrock-agentcore-control", region)
    if check_role:
        _check_role_exists(iam_client or aws_client("iam", region), spec.role_arn)
    wanted = spec.request()
    if (existing := find_runtime(client, spec.name)) is None:
        with _aws(f"create agent runtime {spec.name}"):
            created = client.create_agent_runtime(agentRuntimeName=spec.name, **wanted)
        runtime_id = str(created["agentRuntimeId"])
        log.info("creating runtime %s (%s)", spec.name, runtime_id)
    else:
        runtime_id = str(existing["agentRuntimeId"])
        current = _get_runtime(client, runtime_id)
        if current.get("status") in ("CREATING", "UPDATING"):
            wait_until_ready(client, runtime_id, spec.name, timeout_s=timeout_s, poll_s=poll_s)
            current = _get_runtime(client, runtime_id)
        if any(current.get(key) != value for key, value in wanted.items()):
            with _aws(f"update agent runtime {spec.name}"):
                client.update_agent_runtime(agentRuntimeId=runtime_id, **wanted)
            log.info("updating runtime %s (%s)", spec.name, runtime_id)
        else:
            log.info("runtime %s (%s) is up to date", spec.name, runtime_id)
    return wait_until_ready(client, runtime_id, spec.name, timeout_s=timeout_s, poll_s=poll_s)


def destroy_runtime(
    name: str,
    *,
    client: Any = None,
    region: str | None = None,
    missing_ok: bool = False,
    timeout_s: float = 300.0,
    poll_s: float = 5.0,
) -> bool:
    """Delete the runtime called ``name`` (AgentCore ends its sessions) and wait until it is
    gone. False if there was none and ``missing_ok``; otherwise a missing runtime is an error."""
    client = client or aws_client("bedrock-agentcore-control", region)
    existing = find_runtime(client, name)
    if existing is None:
        if missing_ok:
            return False
        raise InfraError(f"no AgentCore runtime named {name!r} in {client.meta.region_name}")
    runtime_id = str(existing["agentRuntimeId"])
    with _aws(f"delete agent runtime {name}"):
        client.delete_agent_runtime(agentRuntimeId=runtime_id)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = _get_runtime(client, runtime_id).get("status")
        except InfraError as exc:
            if exc.code == "ResourceNotFoundException":
                return True
            raise
        if status == "DELETE_FAILED":
            raise InfraError(f"runtime {name} ({runtime_id}) is DELETE_FAILED")
        if time.monotonic() >= deadline:
            raise InfraError(f"runtime {name} ({runtime_id}) still {status} after {timeout_s:g}s")
        time.sleep(poll_s)


def stack_outputs(
    stack_name: str, *, client: Any = None, region: str | None = None
) -> dict[str, str]:
    """The outputs of a deployed (or updated) CloudFormation stack."""
    client = client or aws_client("cloudformation", region)
    with _aws(f"describe stack {stack_name}"):
        stack = client.describe_stacks(StackName=stack_name)["Stacks"][0]
    status = str(stack.get("StackStatus", ""))
    if not status.endswith("_COMPLETE") or status.startswith(("ROLLBACK", "DELETE")):
        raise InfraError(f"stack {stack_name} is {status}, not deployed")
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def env_from_outputs(
    outputs: Mapping[str, str], region: str, runtime_arn: str | None = None
) -> dict[str, str]:
    """The agentcore.env entries for a stack's outputs. ``runtime_arn`` (from `deploy_runtime`)
    wins over the stack's RuntimeArn output; with neither, the runtime entry is left out."""
    if missing := [key for key in STACK_OUTPUT_ENV if not outputs.get(key)]:
        raise InfraError(
            f"stack outputs lack {', '.join(missing)}: is it an agentcore-rollout stack?"
        )
    env = {name: outputs[key] for key, name in STACK_OUTPUT_ENV.items()}
    if arn := runtime_arn or outputs.get("RuntimeArn"):
        env["AGENTCORE_ROLLOUT_RUNTIME_ARN"] = arn
    return env | {"AWS_REGION": region}


def _env_line(key: str, value: str) -> str:
    if "\n" in value or "\r" in value:
        raise InfraError(f"value of {key} spans lines")
    if re.fullmatch(r"[\w.:/@+,=-]*", value):
        return f"{key}={value}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{key}="{escaped}"'


def write_env_file(path: str | Path, values: Mapping[str, str]) -> Path:
    """Set ``values`` in a KEY=VALUE file, keeping its other lines; written atomically."""
    path = Path(path)
    pending = dict(values)
    lines: list[str] = []
    if path.exists():
        for line in path.read_text().splitlines():
            key = line.split("=", 1)[0].strip().removeprefix("export ").strip()
            if "=" in line and key in pending:
                lines.append(_env_line(key, pending.pop(key)))
            else:
                lines.append(line)
    lines.extend(_env_line(key, value) for key, value in pending.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def write_stack_env(
    stack_name: str,
    path: str | Path = "agentcore.env",
    *,
    region: str | None = None,
    runtime_arn: str | None = None,
    client: Any = None,
) -> dict[str, str]:
    """Write the agentcore.env entries of a deployed stack into ``path``; return them."""
    client = client or aws_client("cloudformation", region)
    outputs = stack_outputs(stack_name, client=client)
    env = env_from_outputs(outputs, client.meta.region_name, runtime_arn)
    write_env_file(path, env)
    return env


def infra_command(args: argparse.Namespace) -> int:
    """deploy / destroy / infra env: one line of output each."""
    if args.command == "infra":
        client = aws_client("cloudformation", args.region, args.endpoint_url)
        values = write_stack_env(args.stack, args.out, runtime_arn=args.runtime_arn, client=client)
        console.print(f"wrote {len(values)} entries to {args.out}")
        return 0
    client = aws_client("bedrock-agentcore-control", args.region, args.endpoint_url)
    check_runtime_args(args)
    if args.command == "destroy":
        gone = destroy_runtime(args.name, client=client, missing_ok=args.missing_ok)
        console.print(f"deleted runtime {args.name}" if gone else f"no runtime {args.name}")
        return 0
    spec = runtime_spec(args)
    iam = aws_client("iam", args.region, args.endpoint_url)
    with console.status(f"deploying runtime {args.name} (waiting for READY)"):
        info = deploy_runtime(spec, client=client, iam_client=iam, timeout_s=args.timeout)
    print(info.arn, flush=True)  # stdout: the one thing scripts want
    return 0


def runtime_spec(args: argparse.Namespace) -> RuntimeSpec:
    """The runtime `deploy`'s flags describe (with --tasks, the template of each one's)."""
    return RuntimeSpec(
        name=args.name or "",
        container_uri=args.image or "",
        role_arn=args.role,
        network_mode=args.network,
        subnets=tuple(args.subnet),
        security_groups=tuple(args.security_group),
        idle_timeout_s=args.idle_timeout,
        max_lifetime_s=args.max_lifetime,
        environment=dict(_key_value(item) for item in args.env),
        gateway_url=args.gateway_url,
    )


def check_runtime_args(args: argparse.Namespace) -> None:
    """One runtime (--name, --image) or a folder of Harbor tasks (--tasks; a manifest for
    destroy), not a mix: a usage error in one line."""
    if args.command == "destroy":
        if bool(args.name) == bool(args.manifest):
            raise ConfigError("destroy needs --name NAME or --manifest FILE (one of them)")
        return
    if args.tasks is None:
        if not (args.name and args.image):
            raise ConfigError("deploy needs --name and --image, or --tasks DIR with --agent")
        return
    if args.image or not (args.agent and args.repository):
        raise ConfigError(
            "deploy --tasks needs --agent and --repository (ECR), and takes no --image"
        )


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--env {item!r} is not KEY=VALUE")
    return key, value
