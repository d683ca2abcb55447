"""GRPO groups: every request of one `input_id` at one step, rolled out and judged together.

Failures are counted, never trained; a group trains on its first `n` members to end ok, and is
reported, not trained, when too few ended ok, when their rewards are all equal (zero advantage),
or when it is stale (`GroupStatus`). `GroupRollout` over-provisions to cut the straggler tail,
which favours fast rollouts; with `extra=0` nothing is dropped."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .. import Outcome, RolloutEngine, RolloutHandle, RolloutOutcome, RolloutRequest


class GroupStatus(StrEnum):
    TRAIN = "train"
    TOO_FEW_OK = "too_few_ok"
    ALL_EQUAL = "all_equal"
    STALE = "stale"


@dataclass(frozen=True)
class GroupPolicy:
    """`n` members trained per group, `extra` more submitted and cancelled once `n` are ok,
    and at least `min_ok` ok members for a group to be trained at all."""

    n: int
    extra: int = 0
    min_ok: int = 2

    def __post_init__(self) -> None:
        if self.n < 1 or self.extra < 0:
            raise ValueError(f"GroupPolicy: n must be >= 1 and extra >= 0, got {self}")
        if not 1 <= self.min_ok <= self.n:
            raise ValueError(f"GroupPolicy: min_ok must be in [1, n={self.n}], got {self.min_ok}")

    @property
    def size(self) -> int:
        """Requests submitted per group."""
        return self.n + self.extra


@dataclass(frozen=True)
class Group:
    """One prompt's members at one step, in the order they ended."""

    input_id: str
    step: int
    members: tuple[RolloutOutcome, ...]
    kept: tuple[RolloutOutcome, ...]
    """The ok members it trains on: the first `n` to end ok."""
    status: GroupStatus

    @property
    def rewards(self) -> list[float]:
        """The kept members' scalar rewards, in the order of `kept`."""
        return [_reward(o) for o in self.kept]

    @property
    def counts(self) -> dict[str, int]:
        """Members by outcome (every outcome named, zeros included)."""
        return {str(k): sum(m.outcome is k for m in self.members) for k in Outcome}

    @classmethod
    def judge(
        cls,
        members: Iterable[RolloutOutcome],
        policy: GroupPolicy,
        *,
        current_step: int | None = None,
        max_staleness: int | None = 0,
    ) -> Group:
        """The group of `members` (ended, of one input_id and step, in the order they ended).
        With `current_step`, a group more than `max_staleness` behind it (None: no bound) is
        `stale`."""
        ordered = tuple(members)
        if not ordered:
            raise ValueError("a group needs at least one member")
        input_id, step = ordered[0].request.input_id, ordered[0].step
        if others := {(m.request.input_id, m.step) for m in ordered} - {(input_id, step)}:
            raise ValueError(
                f"one group is one input_id at one step: got (input_id, step) {sorted(others)} "
                f"with {(input_id, step)}"
            )
        kept = tuple(m for m in ordered if m.outcome is Outcome.OK)[: policy.n]
        too_old = (
            current_step is not None
            and max_staleness is not None
            and step < current_step - max_staleness
        )
        if too_old or any(m.outcome is Outcome.STALE for m in ordered):
            status = GroupStatus.STALE
        elif len(kept) < policy.min_ok:
            status = GroupStatus.TOO_FEW_OK
        elif max(r := [_reward(o) for o in kept]) - min(r) <= 1e-12:
            status = GroupStatus.ALL_EQUAL
        else:
            status = GroupStatus.TRAIN
        return cls(input_id, step, ordered, kept, status)


def collect_groups(
    outcomes: Iterable[RolloutOutcome],
    policy: GroupPolicy,
    *,
    current_step: int | None = None,
    max_staleness: int | None = 0,
) -> list[Group]:
    """Group ended outcomes (a `RolloutBatch`'s, say) by input_id and step, in order of first
    appearance; members are taken in the order they ended (`finished_at`)."""
    by_key: dict[tuple[str, int], list[RolloutOutcome]] = {}
    for o in outcomes:
        by_key.setdefault((o.request.input_id, o.step), []).append(o)
    bound = {"current_step": current_step, "max_staleness": max_staleness}
    ordered = (sorted(members, key=lambda m: m.finished_at) for members in by_key.values())
    return [Group.judge(members, policy, **bound) for members in ordered]


class GroupRollout:
    """Runs groups on an engine with over-provisioning and yields each as it resolves:

        async with GroupRollout(engine, GroupPolicy(n=8, extra=2)) as groups:
            for input_id, payload in prompts:
                groups.submit(input_id, payload)
            async for group in groups:  # until every submitted group has resolved
                ...

    A group resolves once `n` members ended ok (the rest are cancelled, and awaited) or all
    members ended. Its status is judged against the engine's step at that moment (and its
    `limits`: a group is never stale by its step under `stale_policy` `keep`). Of the groups
    resolved and not yet taken, `next` hands out the oldest step's first, so newer groups never
    starve older ones. Leaving the context cancels whatever is still running.
    """

    def __init__(
        self, engine: RolloutEngine, policy: GroupPolicy, *, timeout: float | None = None
    ) -> None:
        self._engine = engine
        self._policy = policy
        self._timeout = timeout
        self._watchers: set[asyncio.Task[None]] = set()
        # (step, arrival, group): the oldest step first, then in the order they resolved
        self._resolved: asyncio.PriorityQueue[tuple[int, int, Group]] = asyncio.PriorityQueue()
        self._arrivals = itertools.count()
        self._pending = 0

    @property
    def pending(self) -> int:
        """Groups submitted and not yet taken (running, or resolved and waiting in line)."""
        return self._pending

    def submit(self, input_id: str, payload: dict[str, Any], *, step: int | None = None) -> None:
        """Submit one group: `n + extra` requests of `payload`, sample indexes 0, 1, ..."""
        requests = [RolloutRequest(payload, input_id, k) for k in range(self._policy.size)]
        handles = [self._engine.submit(r, step=step, timeout=self._timeout) for r in requests]
        watcher = asyncio.create_task(self._watch(handles))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        self._pending += 1

    async def next(self) -> Group:
        """The next group to resolve."""
        if self._pending == 0:
            raise RuntimeError("no group is pending: submit one first")
        _, _, group = await self._resolved.get()
        self._pending -= 1
        return group

    async def __aiter__(self) -> AsyncIterator[Group]:
        while self._pending:
            yield await self.next()

    async def __aenter__(self) -> GroupRollout:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel every group still running and wait until each request has ended."""
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _watch(self, handles: list[RolloutHandle]) -> None:
        members: list[RolloutOutcome] = []
        ok = 0
        try:
            for next_done in asyncio.as_completed(handles):
                outcome = await next_done
                members.append(outcome)
                ok += outcome.outcome is Outcome.OK
                if ok == self._policy.n:  # enough: the rest are extras, cancelled
                    for h in handles:
                        h.cancel()
        finally:
            if len(members) < len(handles):  # cancelled ourselves: end them all first
                for h in handles:
                    h.cancel()
                await asyncio.gather(*handles, return_exceptions=True)
        limits = self._engine.config.limits
        group = Group.judge(
            members,
            self._policy,
            current_step=self._engine.step,
            max_staleness=None if limits.stale_policy == "keep" else limits.max_staleness,
        )
        self._resolved.put_nowait((group.step, next(self._arrivals), group))


def _reward(outcome: RolloutOutcome) -> float:
    reward = outcome.reward
    if reward is None:  # an ok result always has one; this would be a contract bug
        raise ValueError(f"request {outcome.request.request_id} ended ok without a reward")
    return reward
