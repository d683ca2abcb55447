"""The CLI's config file: every section in one YAML (`stack`, `engine`, `local`, `run`,
`train`, `harbor`), read by the core's one loader (`config.load_sections`: YAML < environment
and `agentcore.env` < overrides, each error one line naming its key). The engine's section is
the core's, `local` and `train` the local stack's; `stack`, `run` and `harbor` the CLI's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from ..config import EngineConfig, Section, load_sections
from ..harbor.agents import agent_named
from ..local.config import LocalConfig, TrainConfig
from .trackers import LoggerName

_LOGGERS = (
    "experiment trackers to log to, under engine.exp_id in the output folder (each its own "
    "extra; `--logger`)"
)


class RunConfig(Section):
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
    loggers: list[LoggerName] = Field(default_factory=list, description=_LOGGERS)


class TrainSection(TrainConfig):
    __doc__ = TrainConfig.__doc__  # the local stack's section, and the trackers `train` logs to

    loggers: list[LoggerName] = Field(default_factory=list, description=_LOGGERS)


class HarborConfig(Section):
    """Harbor tasks (`run.data` a folder of task folders): what runs them."""

    agent: str = Field(
        default="oracle",
        description="the agent each task's image runs: oracle (its solve.sh), nop, or a "
        "coding agent",
    )

    @field_validator("agent")
    @classmethod
    def _known(cls, v: str) -> str:
        return agent_named(v).name


class Config(Section):
    stack: Literal["local", "aws"] = Field(
        default="local",
        description="`local`: start the embedded stack; `aws`: use engine's bucket, queue and "
        "runtimes",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    local: LocalConfig = Field(default_factory=LocalConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    train: TrainSection = Field(default_factory=TrainSection)
    harbor: HarborConfig = Field(default_factory=HarborConfig)

    @field_validator("train", mode="before")
    @classmethod
    def _train_section(cls, v: object) -> object:
        """The local stack's own `TrainConfig` is taken as it is: no tracker."""
        return v.model_dump() if type(v) is TrainConfig else v


def load_config(path: str | Path | None = None, **options: Any) -> Config:
    """The whole file at `path`, then the environment, then `key.path=value` overrides
    (`load_sections`' keywords: `env_file`, `environ`, `overrides`)."""
    return load_sections(Config, path, **options)
