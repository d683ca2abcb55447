"""The embedded local stack: everything the engine talks to, on loopback, in one context: moto,
the AgentCore Runtime emulator, and agents -> gateway -> sglang-router -> policy workers.

`engine_config()` points an EngineConfig at them, so the same engine code runs here and on AWS.
Every blocking call (a child's start and stop, provisioning) runs in a thread, so a stack started
inside a trainer's event loop never stalls it. docs/local-stack.md."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import subprocess
import sys
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

from ..config import ConfigError, EngineConfig, GatewayConfig, GatewayReplica
from ..contract import LLMSettings
from ..serving.flags import to_flags
from ..serving.process import ServiceProcess
from .config import DEFAULT_RUNTIME_ARN as LOCAL_RUNTIME_ARN  # the emulator's default
from .config import ContainerLimits, EmulatorSettings, LocalConfig
from .containers import container_engine, container_url, ensure_image
from .models import model_of
from .moto import LOCAL_CREDENTIALS, MotoServer, ResultsChannel, provision_results_channel
from .policy.server import TOKEN_ENV as POLICY_TOKEN_ENV
from .policy.worker import MODEL_NAME as TOY_MODEL_NAME

LOCAL_REGION = "us-east-1"
CHAR_RENDERER = "agentcore_rollout.local.policy.render:CharRenderer"  # the gateway's --renderer
TOY = "toy"  # local.policy's value for the toy


class LocalStack:
    """`async with LocalStack(LocalConfig(...)) as stack: stack.engine_config(base)`"""

    def __init__(
        self,
        config: LocalConfig | None = None,
        *,
        prefix: str = "rollouts",
        environments: Mapping[str, str] | None = None,
        limits: Mapping[str, ContainerLimits] | None = None,
    ) -> None:
        """`environments`: environment id -> image (`local.mode: container`): one runtime per
        environment, its sessions containers of its image, and the engine's `runtimes` each
        of its environment, so a request starts in its payload's (Harbor tasks). `limits`:
        environment id -> what its containers are given (cpus, memory, disk, network); an
        environment without: unbounded, public."""
        self.config = config or LocalConfig()
        self.prefix = prefix
        self.environments = dict(environments or {})
        self.limits = {e: lim for e, lim in (limits or {}).items() if e in self.environments}
        if self.environments and self.config.mode != "container":
            raise ValueError("tasks with environments run in their images: local.mode: container")
        self.moto = MotoServer()
        self.moto.stall, self.moto.limit = self._bounds["stall"], self._bounds["limit"]
        self.model_dir: str | None = None  # the served model's directory; None: the toy
        self.workers: list[ServiceProcess] = []  # made on entry, once the model is resolved
        self.router: Any = None
        self.gateways: list[ServiceProcess] = []  # the gateway's replicas
        self._admin_token = secrets.token_urlsafe(24)
        self._policy_token = secrets.token_urlsafe(24)  # the workers' admin routes
        self.channel: ResultsChannel | None = None
        self.emulator: ServiceProcess | None = None
        self._container_host: str | None = None  # the host as session containers see it

    async def __aenter__(self) -> LocalStack:
        for name, value in LOCAL_CREDENTIALS.items():  # the engine's clients need some
            os.environ.setdefault(name, value)
        try:
            # Found before anything starts: an app that does not load, a model that cannot.
            checks = [] if self._containers else [asyncio.to_thread(self._check_app)]
            if self.config.policy != TOY:  # a known name may convert first (once, ~30 s)
                checks.append(asyncio.to_thread(self._resolve_model))
            await _together(*checks)
            if self._containers:  # built once, before anything starts
                engine = await asyncio.to_thread(container_engine, self.config.container_engine)
                self._container_host = engine.host
                cfg = self.config
                if not self.environments:
                    await asyncio.to_thread(ensure_image, cfg.dockerfile, cfg.image, engine)
            self.workers = self._workers()
            await _together(
                asyncio.to_thread(self.moto.start),
                *(asyncio.to_thread(worker.start) for worker in self.workers),
            )
            # The emulator needs moto's URL (as the channel does), and with containers the
            # policy path's too: Docker's containers reach those through its relay.
            starts = [self._start_policy_path(), asyncio.to_thread(self._provision)]
            if not self._containers:
                starts.append(asyncio.to_thread(self._start_emulator))
            await _together(*starts)
            if self._containers:
                await asyncio.to_thread(self._start_emulator)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        # The emulator first: it stops every session's agent, and an agent may still write to S3.
        try:
            if self.emulator is not None:
                await asyncio.to_thread(self.emulator.stop)
        finally:
            await _together(
                *(asyncio.to_thread(gateway.stop) for gateway in self.gateways),
                *([self.router.stop()] if self.router is not None else []),
                *(asyncio.to_thread(worker.stop) for worker in self.workers),
                asyncio.to_thread(self.moto.stop),
            )

    def dead(self) -> str | None:
        """The first of its children that died, and how (None: all run): what a caller that
        outlives a step (the trainer) says in one line rather than failing on."""
        children = [self.moto, *self.workers, *self.gateways]
        children += [self.emulator] if self.emulator is not None else []
        for child in children:
            code = child.exit_code
            if code is not None:
                return f"{child.name} (pid {child.pid}) exited with code {code}"
        return None

    def _check_app(self) -> None:
        """Load `local.app` in a process of its own, with the path its agents get, so an app
        that cannot load is one line now rather than a failed start for every request."""
        env = {**os.environ, "PYTHONPATH": _agent_path()}
        argv = [sys.executable, "-m", "agentcore_rollout.local.host", self.config.app, "--check"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            said = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
            raise ConfigError(f"config: local.app: {said[-1]}")

    def _resolve_model(self) -> None:
        self.model_dir = str(model_of(self.config.policy))

    def _workers(self) -> list[ServiceProcess]:
        cfg = self.config
        if self.model_dir is not None:
            serves = ["--model", self.model_dir, "--threads", str(cfg.policy_threads)]
        else:
            serves = ["--params", cfg.policy_params] if cfg.policy_params else []
            serves += ["--token-delay", str(cfg.token_delay)] if cfg.token_delay else []
        serves += ["--record"] if cfg.record_samples else []
        return [
            ServiceProcess(
                f"policy worker {i}",
                "agentcore_rollout.local.policy",
                *("--seed", str(cfg.policy_seed), "--worker-id", f"worker-{i}", *serves),
                env={POLICY_TOKEN_ENV: self._policy_token},
                **self._bounds,
            )
            for i in range(cfg.policy_workers)
        ]

    def _start_emulator(self) -> None:
        cfg = self.config
        containers = ["--image", cfg.image]
        for environment, image in self.environments.items():
            arn = environment_arn(environment)
            containers += ["--runtime-image", f"{arn}={image}"]
            if (limits := self.limits.get(environment)) and limits.text():
                containers += ["--runtime-limits", f"{arn}={limits.text()}"]
        # What agents call for their turns, and nothing else of the host: with a gateway in
        # front, the policy's port is not relayed to containers (moto's comes with its URLs).
        for url in [gateway.url for gateway in self.gateways] or [self.policy_url]:
            containers += ["--host-url", url]
        self.emulator = ServiceProcess(
            "runtime emulator",
            "agentcore_rollout.local.runtime",
            cfg.app,
            *(arg for arn in self.runtime_arns for arg in ("--runtime-arn", arn)),
            *(arg for q in self.qualifiers for arg in ("--qualifier", q)),
            *to_flags(cfg, EmulatorSettings),  # `local.*`'s emulator settings, every one
            *(containers if self._containers else []),
            env=self.agent_env(),  # agents inherit the emulator's environment
            **self._bounds,
        )
        self.emulator.start()

    def _provision(self) -> None:
        """The bucket, queue and notification on moto (blocking boto3 calls)."""
        self.channel = provision_results_channel(
            self.moto.client("s3"),
            self.moto.client("sqs"),
            bucket=self.config.bucket,
            prefix=self.prefix,
            queue=self.config.queue,
        )

    async def _start_policy_path(self) -> None:
        """sglang-router in front of the workers (if more than one), the gateway in front."""
        if len(self.workers) > 1:
            if importlib.util.find_spec("sglang_router") is None:
                raise RuntimeError(
                    "local.policy_workers > 1 needs sglang-router (the [gateway] extra); "
                    "install it or set local.policy_workers=1"
                )
            from ..gateway.router import SGLangRouter

            self.router = SGLangRouter([w.url for w in self.workers])
            await self.router.start()
        if not self.config.gateway:
            return
        renderer = self.model_dir or CHAR_RENDERER  # a model dir: HFRenderer, family detected
        cert, key = self.config.gateway_tls_cert, self.config.gateway_tls_key
        tls = ["--tls-cert", cert, "--tls-key", key] if cert and key else []
        self.gateways = [
            ServiceProcess(
                f"gateway {i}",
                "agentcore_rollout.gateway",
                *("--backend", "sglang", "--backend-url", self.policy_url, "--renderer", renderer),
                *tls,
                env={"AGENTCORE_GATEWAY_ADMIN_TOKEN": self._admin_token},
                **self._bounds,
            )
            for i in range(self.config.gateway_replicas)
        ]
        await _together(*(asyncio.to_thread(gateway.start) for gateway in self.gateways))

    @property
    def _bounds(self) -> dict[str, float]:
        """How long a child's start is waited for (`local.start_*_seconds`)."""
        return {"stall": self.config.start_stall_seconds, "limit": self.config.start_limit_seconds}

    @property
    def policy_url(self) -> str:
        """Where the policy is served: the router, or the one worker."""
        return self.router.url if self.router is not None else self.workers[0].url

    @property
    def policy_headers(self) -> dict[str, str]:
        """What a caller of the workers' admin routes sends (weight loads, aborts,
        /debug/samples): the stack's token for them, which agents are never given."""
        return {"Authorization": f"Bearer {self._policy_token}"}

    @property
    def _containers(self) -> bool:
        """Agents run in containers: they reach the host's loopback at another address."""
        return self.config.mode == "container"

    def _public_url(self, url: str) -> str | None:
        """A loopback `url` as agents in containers reach it (None: agents reach it as is)."""
        if not self._containers:
            return None
        assert self._container_host is not None, "stack is not started"
        return container_url(url, self._container_host)

    def agent_env(self) -> dict[str, str]:
        """What an agent process needs to reach the local S3 and SQS."""
        return {
            **LOCAL_CREDENTIALS,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_ENDPOINT_URL_S3": self.moto.url,
            "AWS_ENDPOINT_URL_SQS": self.moto.url,
            "PYTHONPATH": _agent_path(),
        }

    @property
    def runtime_arns(self) -> list[str]:
        """The emulator's runtimes: one per environment, else the one local runtime."""
        return [environment_arn(e) for e in self.environments] or [LOCAL_RUNTIME_ARN]

    @property
    def qualifiers(self) -> list[str]:
        """The emulator's runtime endpoints (`local.runtime_endpoints`)."""
        count = self.config.runtime_endpoints
        return ["DEFAULT", *(f"endpoint_{i}" for i in range(2, count + 1))]

    def engine_config(self, base: EngineConfig | None = None, **overrides: Any) -> EngineConfig:
        """`base` with the stack's bucket, queue, runtime (each of its endpoints) and service
        URLs filled in."""
        assert self.channel is not None and self.emulator is not None, "stack is not started"
        base = base or EngineConfig()
        fill: dict[str, Any] = {
            "region": LOCAL_REGION,
            "bucket": self.channel.bucket,
            "prefix": self.prefix,
            "queue_url": self.channel.queue_url,
            "service_urls": {
                "s3": self.moto.url,
                "sqs": self.moto.url,
                "agentcore": self.emulator.url,
                "service_quotas": self.emulator.url,  # its quotas, as Service Quotas tells them
            },
        }
        if self.environments:
            fill["runtimes"] = [
                {"arn": environment_arn(e), "qualifier": q, "environment": e}
                for e in self.environments
                for q in self.qualifiers
            ]
        elif len(self.qualifiers) == 1:
            fill["runtime_arn"] = LOCAL_RUNTIME_ARN
        else:
            fill["runtimes"] = [{"arn": LOCAL_RUNTIME_ARN, "qualifier": q} for q in self.qualifiers]
        if self.gateways and base.gateway is None:  # the engine calls each one's admin listener
            replicas = [
                GatewayReplica(url=g.urls[1], public_url=self._public_url(g.url))
                for g in self.gateways
            ]
            one = replicas[0].model_dump() if len(replicas) == 1 else {"replicas": replicas}
            fill["gateway"] = GatewayConfig(  # the engine points agents at one, per session
                **one, admin_token=self._admin_token, max_context=self.config.max_context
            )
        elif base.llm is None:
            model = Path(self.model_dir).name if self.model_dir else TOY_MODEL_NAME
            base_url = f"{self.policy_url}/v1"
            fill["llm"] = LLMSettings(base_url=self._public_url(base_url) or base_url, model=model)
        return EngineConfig.model_validate(base.model_dump() | fill | overrides)

    def env_lines(self) -> list[str]:
        """Environment variables that point the engine (and boto3) at this stack."""
        cfg = self.engine_config()
        lines = [
            *(f"{k}={v}" for k, v in LOCAL_CREDENTIALS.items()),
            f"AWS_REGION={LOCAL_REGION}",
            f"AGENTCORE_ROLLOUT_BUCKET={cfg.bucket}",
            f"AGENTCORE_ROLLOUT_PREFIX={cfg.prefix}",
            f"AGENTCORE_ROLLOUT_QUEUE_URL={cfg.queue_url}",
            f"AGENTCORE_ROLLOUT_RUNTIME_ARN={LOCAL_RUNTIME_ARN}",  # its DEFAULT endpoint
            f"AGENTCORE_ROLLOUT_SERVICE_URLS__S3={self.moto.url}",
            f"AGENTCORE_ROLLOUT_SERVICE_URLS__SQS={self.moto.url}",
            f"AGENTCORE_ROLLOUT_SERVICE_URLS__AGENTCORE={cfg.service_urls.agentcore}",
            f"AGENTCORE_ROLLOUT_SERVICE_URLS__SERVICE_QUOTAS={cfg.service_urls.service_quotas}",
        ]
        if cfg.llm:
            lines.append(f"AGENTCORE_ROLLOUT_LLM__BASE_URL={cfg.llm.base_url}")
        if cfg.gateway:  # an ephemeral token of this local stack, printed so a shell can use it
            if cfg.gateway.url is not None:
                lines.append(f"AGENTCORE_ROLLOUT_GATEWAY__URL={cfg.gateway.url}")
            else:
                urls = ",".join(replica.url for replica in cfg.gateway.replicas)
                lines.append(f"AGENTCORE_ROLLOUT_GATEWAY__REPLICAS={urls}")
            lines.append(f"AGENTCORE_ROLLOUT_GATEWAY__ADMIN_TOKEN={cfg.gateway.admin_token}")
        return lines


def _agent_path() -> str:
    """Agents import their app from the current directory (the repository's examples)."""
    return os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))


async def _together(*steps: Awaitable[object]) -> None:
    """Run `steps` concurrently, wait until every one has finished, then raise the first error.

    Unlike `gather`, neither a failure nor a cancellation returns early: a start running in a
    thread cannot be interrupted, and whatever it starts must exist before `__aexit__` stops it,
    or it would be left running.
    """
    tasks = [asyncio.ensure_future(step) for step in steps]
    pending = set(tasks)
    cancelled: asyncio.CancelledError | None = None
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            cancelled = exc
    errors = [error for task in tasks if (error := task.exception()) is not None]
    if cancelled is not None:
        raise cancelled
    if errors:
        raise errors[0]


def environment_arn(environment: str) -> str:
    """The local runtime of one environment (its id is the runtime's name)."""
    return LOCAL_RUNTIME_ARN.rsplit("/", 1)[0] + f"/env_{environment}"
