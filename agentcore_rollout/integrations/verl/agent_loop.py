"""`AgentCoreAgentLoop`: a veRL agent loop whose trajectories run as AgentCore sessions.

veRL calls `run()` once per trajectory; the loop submits one `RolloutRequest` to the engine and
returns its outcome's rows (`convert`). A failure raises, so veRL tags the group `failure` and no
row is fabricated; a group below `min_group_ok` raises for every member, so no group of one
trains on its raw reward. One engine serves every worker (`EngineService`, a named Ray actor):
one SQS poller per experiment, so no worker churns another's notifications. Settings, async
trainers and restarts: docs/verl.md."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from ... import (
    EngineStats,
    RolloutEngine,
    RolloutOutcome,
    RolloutRequest,
    RolloutTally,
    load_config,
)
from ...config import GatewayConfig, LimitsConfig
from ...contract import ENVIRONMENT_KEY, new_run_secret
from ...training import Group, GroupPolicy, staleness_report
from .convert import OnFailure, agent_loop_outputs
from .replicas import HostedGateways, check_replicas

SERVICE_NAME = "agentcore_rollout_engine"
_WHERE = "actor_rollout_ref.rollout.custom.agentcore"
_GATEWAY_KEYS = ("host", "port", "public_url", "renderer", "replicas", "tls_cert", "tls_key")


class GroupFailed(RuntimeError):
    """Too few members of a group ended ok for it to train."""


@dataclass(frozen=True)
class AgentCoreSettings:
    """`actor_rollout_ref.rollout.custom.agentcore`, checked (see the module's docstring)."""

    config: str | None = None
    payload_key: str = "extra_info"
    min_group_ok: int = 2
    on_failure: OnFailure = "raise"
    timeout: float | None = None
    gateway: dict[str, Any] | None = None

    @classmethod
    def from_rollout_config(cls, rollout: Any) -> AgentCoreSettings:
        values = dict((rollout.get("custom") or {}).get("agentcore") or {})
        _known_keys(_WHERE, values, cls.__dataclass_fields__)
        if values.get("gateway") is not None:
            values["gateway"] = dict(values["gateway"])
            _known_keys(f"{_WHERE}.gateway", values["gateway"], _GATEWAY_KEYS)
        settings = cls(**values)
        if settings.on_failure not in ("raise", "empty") or settings.min_group_ok < 1:
            raise ValueError(
                f"{_WHERE}: on_failure must be raise or empty, min_group_ok >= 1; got {settings}"
            )
        return settings

    @property
    def config_path(self) -> str:
        path = self.config or os.environ.get("AGENTCORE_ROLLOUT_CONFIG")
        if not path:
            raise ValueError(
                f"the engine's config: set +{_WHERE}.config=PATH or AGENTCORE_ROLLOUT_CONFIG"
            )
        return path


@dataclass(frozen=True)
class HostedGateway:
    """A gateway for the engine service to start, sampling through veRL's server manager."""

    server_manager: Any
    renderer: str
    host: str = "127.0.0.1"
    port: int = 0
    public_url: str | tuple[str, ...] | None = None  # with replicas, one per replica
    replicas: int = 1  # 1: in the engine service's process; N >= 2: N Ray actors (`replicas`)
    tls_cert: str | None = None  # with tls_key: the agents' API on HTTPS
    tls_key: str | None = None

    def __post_init__(self) -> None:
        n = self.replicas  # as the YAML gives it
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{_WHERE}.gateway.replicas: an integer >= 1; got {n!r}")
        if self.replicas == 1 and not isinstance(self.public_url, tuple):
            return
        if self.replicas == 1 or isinstance(self.public_url, str):
            raise ValueError(
                f"{_WHERE}.gateway.public_url: one URL for one replica, a list of one per "
                f"replica for several; got replicas={self.replicas}, public_url={self.public_url}"
            )
        try:
            check_replicas(self.replicas, self.port, self.public_url or ())
        except ValueError as e:
            raise ValueError(f"{_WHERE}.{e}") from None


class EngineService:
    """One `RolloutEngine` shared by every agent loop of a run, and the group gate."""

    def __init__(
        self,
        config_path: str,
        hosted: HostedGateway | None = None,
        limits: dict[str, Any] | None = None,
        reissue: Reissue | None = None,
    ) -> None:
        self._config_path = config_path
        self._hosted = hosted
        self._limits = limits  # an async trainer's staleness (`engine_limits`); None: sync
        self._reissue = reissue  # an async trainer's restarts (`reissue_settings`); None: sync
        self._first_step: int | None = None
        self._engine: RolloutEngine | None = None
        self._gateway: Any = None
        self._starting = asyncio.Lock()
        # (input_id, step) -> its members ended so far (None: not even submitted), its verdict
        self._groups: dict[tuple[str, int], tuple[list[RolloutOutcome | None], asyncio.Future]] = {}
        # The window `take_figures` empties: counts and sums, never the outcomes themselves.
        self._tally = RolloutTally()
        self._staleness: Counter[str] = Counter()  # "<lag>/delivered|dropped"
        self._stats_taken: EngineStats | None = None
        # step -> its members submitted, by environment (a Harbor task's; None: any), and
        # how many have not ended yet: the next step's warm sessions (`_ended`)
        self._members: dict[int, Counter[str | None]] = {}
        self._running: Counter[int] = Counter()
        self._last_batch: Counter[str | None] = Counter()  # the last step's, all ended

    async def rollout(
        self, request: RolloutRequest, step: int, policy: GroupPolicy, timeout: float | None
    ) -> tuple[RolloutOutcome, bool]:
        """Run one member; return its outcome and whether its group has `policy.min_ok` ok
        members (known once all `policy.size` members ended)."""
        key = (request.input_id, step)
        if key not in self._groups:
            self._groups[key] = ([], asyncio.get_running_loop().create_future())
        ended, verdict = self._groups[key]
        outcome: RolloutOutcome | None = None
        try:
            engine = await self._started()
            if self._first_step is None:
                self._first_step = step
            if step > engine.step:
                engine.set_step(step)
                self._warm_next(step)
            self._members.setdefault(step, Counter())[self._environment(request)] += 1
            self._running[step] += 1
            outcome = await self._reclaimed(engine, request, step, timeout)
            if outcome is None:
                outcome = await engine.submit(request, step=step, timeout=timeout)
            self._tally.add(outcome)
        finally:  # a member that could not even be submitted still counts, as not ok
            self._ended(step, self._environment(request))
            ended.append(outcome)
            if len(ended) >= policy.size:
                del self._groups[key]
                try:
                    verdict.set_result(self._judged([o for o in ended if o is not None], policy))
                except ValueError as e:  # an ok member without a reward: fail, hang no member
                    verdict.set_exception(GroupFailed(str(e)))
        return outcome, await asyncio.shield(verdict)

    def _environment(self, request: RolloutRequest) -> str | None:
        """Where its session starts: its payload's environment once runtimes are routed by one
        (a Harbor run's), else any runtime."""
        routed = self._engine is not None and any(
            t.environment for t in self._engine.config.all_runtimes
        )
        return request.payload.get(ENVIRONMENT_KEY) if routed else None

    def _ended(self, step: int, environment: str | None) -> None:
        """A member ended. Under the synchronous trainer, the last of its step's makes the
        step's batch known whole: the next step's sessions are asked for (`_warm_next`). Under
        an async trainer, rollouts start all the time: a few sessions of the member's
        environment stay ready, one cold start's worth at the start rate."""
        if self._running[step] == 0 or self._engine is None:
            return
        self._running[step] -= 1
        engine = self._engine
        if self._limits is not None:
            ready = engine.stats().start_rate * engine.config.dispatch.session_start_time
            engine.warm(math.ceil(ready), environment=environment)
        elif self._running[step] == 0 and step == engine.step:
            del self._running[step]
            self._last_batch = self._members.pop(step, Counter())
            self._warm_next(step)

    def _warm_next(self, step: int) -> None:
        """Under the synchronous trainer, the next step's batch is the last one again (veRL's
        are one size, of the same environments): its sessions are asked for as soon as a step
        begins, and again once it ended (the first step's), to be ready as the next begins."""
        if self._limits is None and self._engine is not None:
            for each, members in self._last_batch.items():
                self._engine.warm(members, environment=each, step=step + 1)

    def _judged(self, members: list[RolloutOutcome], policy: GroupPolicy) -> bool:
        """Whether the group has `policy.min_ok` kept (ok) members, not its status: a stale
        member must not hide too few ok, and veRL trains an all-equal group too. Its members'
        staleness, against the engine's step now, goes into the figures' window."""
        if not members:
            return False
        group = Group.judge(members, policy)
        now = self._engine.step if self._engine is not None else group.step
        for lag, verdicts in staleness_report([group], now)["by_staleness"].items():
            self._staleness.update({f"{lag}/{v}": n for v, n in verdicts.items()})
        return len(group.kept) >= policy.min_ok

    async def _reclaimed(
        self, engine: RolloutEngine, request: RolloutRequest, step: int, timeout: float | None
    ) -> RolloutOutcome | None:
        """A member of the first step after a restart: the ok outcome of its earlier session,
        if an earlier engine started it at most `reissue.steps` steps back and the engine can
        still take it over (`RolloutEngine.reclaim`); None: run it anew."""
        if self._reissue is None or step != self._first_step:
            return None
        uid, index = request.input_id, request.sample_index
        for earlier in range(step - 1, max(0, step - self._reissue.steps - 1), -1):
            again = replace(request, request_id=request_id(uid, index, earlier))
            handle = await engine.reclaim(again, step=earlier, timeout=timeout)
            if handle is not None:
                outcome = await handle
                return outcome if outcome.outcome == "ok" else None
        return None

    def stats(self) -> dict[str, Any]:
        """The engine's `EngineStats` as a dict (empty before the first rollout)."""
        return asdict(self._engine.stats()) if self._engine is not None else {}

    def take_figures(self) -> dict[str, float]:
        """The `rollout/...` figures of what ended since the last take (outcomes, failure
        reasons, latency, cost, tokens, staleness) and of what the engine did meanwhile
        (`rollout/engine/...`: retries, throttles, ...), then a fresh window. Empty before
        the first rollout. What veRL's step metrics get (`figures`)."""
        if self._engine is None:
            return {}
        tally, self._tally = self._tally, RolloutTally()
        staleness, self._staleness = self._staleness, Counter()
        stats = self._engine.stats()
        since = stats if self._stats_taken is None else stats.since(self._stats_taken)
        self._stats_taken = stats
        out = tally.metrics() | {f"rollout/staleness/{k}": v for k, v in staleness.items()}
        return {k: float(v) for k, v in (out | since.metrics()).items()}

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()
            self._engine = None
            self._stats_taken = None
        if self._gateway is not None:
            await self._gateway.stop()
            self._gateway = None

    async def _started(self) -> RolloutEngine:
        async with self._starting:
            if self._engine is None:
                config = load_config(self._config_path)
                update: dict[str, Any] = {}
                if self._reissue is not None and config.run_secret is None:
                    update["run_secret"] = _run_secret(Path(self._reissue.secret_dir))
                if self._limits is not None:
                    limits = config.limits.model_dump() | self._limits
                    update["limits"] = LimitsConfig(**limits)
                try:
                    if self._hosted is not None:
                        update["gateway"] = await self._host(self._hosted)
                    engine = RolloutEngine(config.model_copy(update=update))
                    await engine.start()
                except BaseException:
                    await self.close()  # the next call starts anew: nothing hosted may leak
                    raise
                self._engine = engine
        return self._engine

    async def _host(self, hosted: HostedGateway) -> GatewayConfig:
        tls = {"tls_cert": hosted.tls_cert, "tls_key": hosted.tls_key}
        if hosted.replicas > 1:
            self._gateway = replicas = await HostedGateways.start(
                hosted.replicas,
                hosted.server_manager,
                hosted.renderer,
                host=hosted.host,
                port=hosted.port,
                public_urls=hosted.public_url or (),
                tls=tls,
            )
            return replicas.config
        from .backend import start_gateway

        self._gateway = gateway = await start_gateway(
            hosted.server_manager, hosted.renderer, host=hosted.host, port=hosted.port, **tls
        )
        return GatewayConfig(  # agents: public_url, else the URL each session's answer gives
            url=gateway.admin_url,  # loopback: the engine is in this process
            admin_token=gateway.admin_token,
            public_url=hosted.public_url,
        )


def engine_limits(config: Any) -> dict[str, Any] | None:
    """The engine's staleness under veRL's async trainer in `config` (see the module's
    docstring); None for the sync trainer, whose steps never overlap."""
    v1 = (config.get("trainer") or {}).get("v1") or {}
    if v1.get("trainer_mode", "sync") == "sync":
        return None
    sampler = v1.get("sampler") or {}
    threshold = sampler.get("max_off_policy_threshold")
    if threshold is not None and sampler.get("max_off_policy_strategy", "drop") == "drop":
        return {"max_staleness": int(threshold) - 1, "stale_policy": "end"}
    return {"stale_policy": "keep"}


@dataclass(frozen=True)
class Reissue:
    """What the engine service needs to take over the prompts an async trainer re-issues after
    a restart (see the module's docstring)."""

    steps: int  # how many steps back a re-issued prompt's earlier session may have started
    secret_dir: str  # veRL's checkpoint folder, where the run secret is kept


# With no off-policy bound, how far back re-issued prompts are looked for: veRL's default bound.
_UNBOUNDED_REISSUE_STEPS = 8


def reissue_settings(config: Any) -> Reissue | None:
    """How far back the engine looks for a re-issued prompt's earlier session: veRL's
    `max_off_policy_threshold` (a prompt older than that was evicted, not checkpointed in
    flight). None for the sync trainer, which re-issues nothing."""
    trainer = config.get("trainer") or {}
    v1 = trainer.get("v1") or {}
    if v1.get("trainer_mode", "sync") == "sync":
        return None
    threshold = (v1.get("sampler") or {}).get("max_off_policy_threshold")
    steps = _UNBOUNDED_REISSUE_STEPS if threshold is None else int(threshold)
    return Reissue(steps, str(trainer.get("default_local_dir") or "checkpoints"))


def _run_secret(folder: Path) -> str:
    """The run's secret, kept in `folder` (0600) so an engine after a restart can verify the
    results an earlier one's agents signed; made by the first engine of the run."""
    path = folder / "agentcore_run_secret"
    folder.mkdir(parents=True, exist_ok=True)
    exclusive = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # FileExistsError: an earlier engine's
    with suppress(FileExistsError), os.fdopen(os.open(path, exclusive, 0o600), "w") as f:
        f.write(new_run_secret())
    return path.read_text().strip()


def request_id(uid: str, session_id: int, step: int) -> str:
    """The same trajectory of the same prompt and step gets the same id, in any process."""
    return hashlib.sha256(f"{uid}/{session_id}/{step}".encode()).hexdigest()[:32]


def _known_keys(where: str, given: Iterable[str], known: Iterable[str]) -> None:
    if unknown := set(given) - set(known):
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")


_local_services: dict[str, EngineService] = {}
_actors: dict[str, Any] = {}  # config path -> the engine actor's handle, under Ray


async def close_services() -> None:
    """Close this process's engines and forget its engine actors' handles (an actor ends
    with its Ray job, or with its last handle)."""
    _actors.clear()
    while _local_services:
        await _local_services.popitem()[1].close()


async def _call_service(
    path: str,
    hosted: HostedGateway | None,
    limits: dict[str, Any] | None,
    reissue: Reissue | None,
    *args: Any,
) -> tuple[RolloutOutcome, bool]:
    """The run's shared engine: a named Ray actor under Ray, else one per process; the call
    that creates it gives it `hosted`, `limits` and `reissue`."""
    import ray

    if ray.is_initialized():
        if path not in _actors:  # held: an actor whose last handle is dropped is killed
            _actors[path] = (
                ray.remote(EngineService)
                # num_cpus=0: it waits on the network, and must not take a CPU veRL planned for
                .options(name=SERVICE_NAME, get_if_exists=True, max_concurrency=10_000, num_cpus=0)
                .remote(path, hosted, limits, reissue)
            )
        return await _actors[path].rollout.remote(*args)
    if path not in _local_services:
        _local_services[path] = EngineService(path, hosted, limits, reissue)
    return await _local_services[path].rollout(*args)


class AgentCoreAgentLoop(AgentLoopBase):
    """Register it in `agent_loop_config_path` (`name: agentcore`, `_target_:` this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = s = AgentCoreSettings.from_rollout_config(self.rollout_config)
        self._policy = GroupPolicy(n=int(self.rollout_config.n), min_ok=s.min_group_ok)
        self._limits = engine_limits(self.config)
        self._reissue = reissue_settings(self.config)
        self._hosted: HostedGateway | None = None
        if (gateway := s.gateway) is not None:
            public_url = gateway.get("public_url")
            if public_url is not None and not isinstance(public_url, str):
                public_url = tuple(str(url) for url in public_url)
            self._hosted = HostedGateway(
                self.server_manager,  # the service is given it once, by the loop that creates it
                gateway.get("renderer") or str(self.config.actor_rollout_ref.model.path),
                host=gateway.get("host") or "127.0.0.1",
                port=int(gateway.get("port") or 0),
                public_url=public_url,
                replicas=gateway.get("replicas", 1),
                tls_cert=gateway.get("tls_cert"),
                tls_key=gateway.get("tls_key"),
            )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        s = self.settings
        payload = _jsonable(kwargs.get(s.payload_key))
        if not isinstance(payload, dict):
            raise ValueError(
                f"dataset column {s.payload_key!r} must hold a JSON object (the agent's payload)"
            )
        uid, session_id = str(kwargs["uid"]), int(kwargs["session_id"])
        step = int(_jsonable(kwargs.get("global_steps", 0)) or 0)
        rid = request_id(uid, session_id, step)
        request = RolloutRequest(payload, input_id=uid, sample_index=session_id, request_id=rid)
        service = (s.config_path, self._hosted, self._limits, self._reissue)
        outcome, group_ok = await _call_service(*service, request, step, self._policy, s.timeout)
        if not group_ok:
            raise GroupFailed(
                f"group {request.input_id} (step {step}): fewer than min_group_ok="
                f"{self._policy.min_ok} of its {self._policy.n} members ended ok"
            )
        return agent_loop_outputs(
            outcome,
            max_prompt_length=int(self.rollout_config.prompt_length),
            max_response_length=int(self.rollout_config.response_length),
            on_failure=s.on_failure,
        )


def _jsonable(value: Any) -> Any:
    """numpy arrays and scalars (what veRL's batches hold) as plain JSON values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
