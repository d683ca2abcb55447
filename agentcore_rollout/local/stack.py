"""The embedded local stack: everything the engine talks to, on loopback, in one context.

moto (S3 + SQS, with the bucket notification the infra configures on AWS) and the AgentCore
Runtime emulator running an agent app. `engine_config()` returns an EngineConfig pointed at
them, so the same engine code runs here and on AWS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import EngineConfig
from .moto import LOCAL_CREDENTIALS, MotoServer, ResultsChannel, provision_results_channel
from .runtime import EmulatorConfig, RuntimeEmulator

LOCAL_REGION = "us-east-1"
LOCAL_RUNTIME_ARN = (
    "arn:aws:bedrock-agentcore:us-east-1:000000000000:runtime/local_agent-0000000000"
)


@dataclass
class LocalStackConfig:
    app: str = "examples.math_agent.app:app"
    mode: str = "process"
    bucket: str = "agentcore-rollout-local"
    prefix: str = "rollouts"
    queue: str = "agentcore-rollout-results"
    emulator: dict[str, Any] = field(default_factory=dict)
    """Extra EmulatorConfig fields (cold_start, max_sessions, throttle_every, ...)."""


class LocalStack:
    """`async with LocalStack(LocalStackConfig(app=...)) as stack: stack.engine_config()`"""

    def __init__(self, config: LocalStackConfig | None = None) -> None:
        self.config = config or LocalStackConfig()
        self.moto = MotoServer()
        self.channel: ResultsChannel | None = None
        self.emulator: RuntimeEmulator | None = None

    async def __aenter__(self) -> LocalStack:
        cfg = self.config
        for name, value in LOCAL_CREDENTIALS.items():  # the engine's clients need some
            os.environ.setdefault(name, value)
        self.moto.start()
        try:
            self.channel = provision_results_channel(
                self.moto.client("s3"),
                self.moto.client("sqs"),
                bucket=cfg.bucket,
                prefix=cfg.prefix,
                queue=cfg.queue,
            )
            if cfg.mode == "in_process":  # agents share this process and its environment
                os.environ.update({k: v for k, v in self.agent_env().items() if k != "PYTHONPATH"})
            emulator_cfg = EmulatorConfig(
                app=cfg.app,
                mode=cfg.mode,  # type: ignore[arg-type]
                runtime_arns=(LOCAL_RUNTIME_ARN,),
                env=self.agent_env(),
            )
            self.emulator = RuntimeEmulator(replace(emulator_cfg, **cfg.emulator))
            await self.emulator.start()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.emulator is not None:
            await self.emulator.stop()
        self.moto.stop()

    def agent_env(self) -> dict[str, str]:
        """What an agent process needs to reach the local S3 and SQS."""
        return {
            **LOCAL_CREDENTIALS,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_ENDPOINT_URL_S3": self.moto.url,
            "AWS_ENDPOINT_URL_SQS": self.moto.url,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])
            ),
        }

    def engine_config(self, **overrides: Any) -> EngineConfig:
        assert self.channel is not None and self.emulator is not None, "stack is not started"
        data: dict[str, Any] = {
            "region": LOCAL_REGION,
            "bucket": self.channel.bucket,
            "prefix": self.channel.prefix,
            "queue_url": self.channel.queue_url,
            "runtime_arn": LOCAL_RUNTIME_ARN,
            "endpoints": {
                "s3": self.moto.url,
                "sqs": self.moto.url,
                "agentcore": self.emulator.url,
            },
        }
        return EngineConfig.model_validate(data | overrides)
