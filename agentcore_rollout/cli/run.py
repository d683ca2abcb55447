"""The `run` command: roll out a dataset (or take over a crashed run with `--resume OUT`),
write each outcome to rollouts.jsonl as it arrives and summary.json once at the end, and pick
the exit code. Everything the user's input can get wrong is checked before the stack starts."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .. import EngineStats, Outcome, RolloutEngine, RolloutHandle, RolloutOutcome
from ..contract import ENVIRONMENT_KEY, VERIFIER_KEY, new_run_secret
from ..harbor.agents import agent_named
from ..harbor.tasks import is_task_source
from .config import Config
from .dataset import journal_requests, read_task_source
from .errors import EXIT_INTERRUPTED, EXIT_TOO_FEW_OK, EXIT_WRITE_FAILED, Interrupted, UsageError
from .feed import Feed
from .journal import (
    INTERRUPTED,
    JOURNAL,
    ROLLOUTS,
    STAGED_JOURNAL,
    Journal,
    Journaled,
    LeftOpen,
    Lines,
    journaled_requests,
    left_open,
    run_secret,
)
from .outdir import begin_fresh, check_fresh, check_not_an_output, check_writable, locked
from .summary import SUMMARY, RunSummary, Tally
from .terminal import console, print_summary, progress_bar, run_async
from .trackers import Trackers

if TYPE_CHECKING:
    from ..local.config import ContainerLimits

PROGRESS_EVERY_S = 2.0  # how often the trackers get the figures so far


def run_command(config: Config, resume: str | None, overwrite: bool = False) -> int:
    """`run`, fresh or `--resume OUT`: the exit code."""
    out = Path(config.run.out if resume is None else resume)
    trackers = Trackers(config.run.loggers, out, config.engine.exp_id, fresh=resume is None)
    with locked(out, "run.out" if resume is None else "--resume"):
        begin = _fresh(config, out, overwrite) if resume is None else _resumed(config, out)
        run = RunState(out, begin.left, trackers)
        try:
            summary = run_async(
                lambda stop: roll_out(config, begin, run, interrupted=stop), forced=run.forced
            )
            trackers.log(summary.metrics(), config.run.step)
        finally:
            (out / STAGED_JOURNAL).unlink(missing_ok=True)  # the journal of a run never begun
            trackers.close()
        embedded_unwritten = run.unwritten if config.stack == "local" else None
        return _finish(summary, out, config.run.min_ok_fraction, embedded_unwritten)


@dataclass
class Begin:
    """How a run begins once its stack is up: `commit()` makes the run's files and returns its
    jobs. Until then the folder holds no run (a stack that fails to start leaves nothing behind
    to resume or overwrite)."""

    total: int
    secret: str
    commit: Callable[[], Iterable[Journaled]]
    left: LeftOpen | None = None  # a resumed run's: what its crashed run left open


def _fresh(config: Config, out: Path, overwrite: bool) -> Begin:
    """Check the folder and the dataset, and journal its requests into a staged journal: what
    the user's input can get wrong is found here, before anything starts."""
    check_fresh(out, overwrite=overwrite)
    staged = out / STAGED_JOURNAL
    total = journal_dataset(config, staged)
    secret = config.engine.run_secret or new_run_secret()

    def commit() -> Iterable[Journaled]:
        begin_fresh(out, staged, None if config.engine.run_secret else secret)
        return journaled_requests(out / JOURNAL, total)

    return Begin(total, secret, commit)


def _resumed(config: Config, out: Path) -> Begin:
    left = left_open(out)
    check_writable(out)
    secret = run_secret(out, config.engine.run_secret)

    def commit() -> Iterable[Journaled]:
        left.keep_rows(out)
        return left.jobs

    return Begin(len(left.jobs), secret, commit, left)


def journal_dataset(config: Config, path: Path) -> int:
    """Check the dataset and journal its requests into `path` before anything starts (one
    pass, a line at a time); how many. A bad dataset, an interrupt, or a journal that cannot
    take it leaves no journal, and is one line."""

    def cannot(_: Path, error: OSError) -> NoReturn:  # named as the journal it would become
        raise UsageError(f"run.out: cannot write {path.parent / JOURNAL}: {error.strerror}")

    data = Path(config.run.data)
    check_not_an_output(data, path.parent)
    try:
        path.unlink(missing_ok=True)  # an earlier run's, cut short
        lines = Lines(path, cannot)
    except OSError as e:
        cannot(path, e)
    try:
        with console.status(f"checking and journaling {data}"):
            solution = agent_named(config.harbor.agent).needs_solution  # oracle's alone
            return journal_requests(
                data, config.run.n, config.run.step, Journal(lines), solution=solution
            )
    except KeyboardInterrupt:
        path.unlink(missing_ok=True)
        raise Interrupted(f"interrupted while reading {data}: nothing started") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        lines.close()


class RunState:
    """What a run has so far, so that even a forced exit writes its summary: the figures of the
    outcomes (in rollouts.jsonl as they arrive), the first write error, the engine's figures."""

    def __init__(self, out: Path, left: LeftOpen | None, trackers: Trackers) -> None:
        self.out, self.left, self.trackers = out, left, trackers
        self._logged = -math.inf  # when the trackers were last given the figures so far
        self.tally = Tally()
        self.write_error: str | None = None
        self.unwritten = 0  # outcomes that ended after a write failed
        self.write_failed = asyncio.Event()
        self.figures: Callable[[], tuple[EngineStats, float]] = lambda: (EngineStats(), 0.0)

    def failed(self, path: Path, error: OSError) -> None:
        if self.write_error is None:
            self.write_error = f"cannot write {path}: {error.strerror}"
            said = f"{self.write_error}: starting no more sessions; the running ones finish"
            console.print(said, style="red", markup=False, soft_wrap=True)
            self.write_failed.set()

    def progress(self, *, last: bool = False) -> None:
        """Give the trackers the figures so far: at the first outcome, then every few seconds,
        and the `last` time."""
        now = time.monotonic()
        if self.trackers.names and (last or now - self._logged >= PROGRESS_EVERY_S):
            self._logged = now
            self.trackers.log(self.tally.progress(), len(self.tally.latencies))

    def summary(self, *, interrupted: bool) -> RunSummary:
        """The figures so far, written to summary.json if it can be."""
        stats, wall_time = self.figures()
        summary = RunSummary.of(self.tally, stats, wall_time, interrupted=interrupted)
        if self.left is not None:  # resumed: the whole run's counts
            summary = replace(summary.counting_in(self.left.ended), run_again=self.left.run_again)
        summary = replace(summary, write_error=self.write_error)
        try:
            (self.out / SUMMARY).write_text(summary.to_json())
        except OSError as e:
            self.failed(self.out / SUMMARY, e)
        return replace(summary, write_error=self.write_error)

    def forced(self) -> str:
        """A second Ctrl-C: the summary of what ended."""
        return f"; {self.summary(interrupted=True).requests} requests ended, in {SUMMARY}"


def _finish(
    summary: RunSummary, out: Path, min_ok_fraction: float, embedded_unwritten: int | None
) -> int:
    """Print the tables and the exit code's one line; the exit code. `embedded_unwritten`: on
    the embedded stack (whose S3 ends with the run), the outcomes that ended unwritten."""
    print_summary(summary)
    code = exit_code(summary, min_ok_fraction)
    if code == EXIT_WRITE_FAILED:
        if embedded_unwritten is None:
            kept = "no result is lost (they are in S3)"
        else:  # moto ran inside this run: what it held ends with it
            kept = (
                f"the embedded stack's S3 ended with this run, and with it the results of the "
                f"{embedded_unwritten} requests that ended after the write failed (--resume "
                "ends them as timeouts; `agentcore-rollout local up` keeps a stack between runs)"
            )
        print(
            f"error: {summary.write_error}; {kept}: once {out} is writable, "
            f"agentcore-rollout run --resume {out}",
            file=sys.stderr,
        )
        return code
    console.print(f"wrote {out / ROLLOUTS} and {out / SUMMARY}")
    if code == EXIT_INTERRUPTED:
        console.print(
            f"[yellow]interrupted: unfinished requests were cancelled; --resume {out} runs "
            "them again"
        )
    elif code == EXIT_TOO_FEW_OK:
        print(
            f"error: {summary.ok} of {summary.requests} requests ended ok, fewer than "
            f"run.min_ok_fraction={min_ok_fraction}",
            file=sys.stderr,
        )
    return code


async def roll_out(
    config: Config, begin: Begin, run: RunState, *, interrupted: asyncio.Event
) -> RunSummary:
    """Start the stack and the engine, then begin the run (its files made, its jobs: fresh
    requests journaled before any starts, or what a resumed run left open) and roll the jobs
    out a window at a time: submit or resume each, write rollouts.jsonl as outcomes arrive."""
    async with AsyncExitStack() as stack:
        engine_config = config.engine.model_copy(update={"run_secret": begin.secret})
        unbuilt: dict[str, str] = {}  # environments whose image did not build: their rows fail
        if config.stack == "local":
            from ..local.stack import LocalStack  # lazily: it loads moto, numpy, the gateway

            environments, unbuilt, limits = await asyncio.to_thread(task_environments, config)
            with console.status("starting the local stack (moto, emulator, policy, gateway)"):
                local = await stack.enter_async_context(
                    LocalStack(config.local, environments=environments, limits=limits)
                )
            engine_config = local.engine_config(engine_config)
        engine = await stack.enter_async_context(RolloutEngine(engine_config, step=config.run.step))
        console.print(engine.quotas, style="dim", markup=False, soft_wrap=True)
        jobs = begin.commit()
        began, before = time.monotonic(), engine.stats()
        run.figures = lambda: (engine.stats().since(before), time.monotonic() - began)
        lines = Lines(run.out / JOURNAL, run.failed)
        stack.callback(lines.close)
        journal = Journal(lines)

        def submit(j: Journaled) -> RolloutHandle:
            started: dict[str, Any] = {"timeout": config.run.timeout, "on_start": journal.started}
            if (why := _unbuilt(j.request.payload, unbuilt)) is not None:
                return _ended(j, Outcome.SUBMIT_FAILED, why)
            if begin.left is None:
                return engine.submit(j.request, **started)
            if j.start is None:  # its session's start was never recorded
                return engine.resume(j.request, step=j.step, **started)
            return engine.resume(j.start, **started)

        feed = Feed(jobs, submit, window=2 * engine.stats().max_live_sessions)
        await _collect(engine, feed, begin.total, run, journal, interrupted)
        summary = run.summary(interrupted=interrupted.is_set())
    return summary


def task_environments(
    config: Config,
) -> tuple[dict[str, str], dict[str, str], dict[str, ContainerLimits]]:
    """A dataset of Harbor tasks: each environment's image (environment id -> image, with
    `harbor.agent` in it), built where missing, why each that did not build failed (its
    tasks' rows end `submit_failed` saying so, the others run), and what each environment's
    containers are given (its tasks' cpus, memory_mb, storage_mb, network_mode); any other
    dataset: none. With no environment built there is nothing to run: a UsageError naming
    every failure. (Where the engine cannot bound a container's disk and a task asks it to,
    the emulator says so in one warning line.)"""
    data = Path(config.run.data)
    if not is_task_source(data):
        return {}, {}, {}
    from ..local.config import ContainerLimits
    from ..local.containers import container_engine  # lazily: subprocesses only
    from .harbor import task_images

    engine = container_engine(config.local.container_engine)
    built = task_images(read_task_source(data), config.harbor.agent, engine)
    if built.failed and not built.images:
        reasons = [why.partition("\n")[0] for why in built.failed.values()]
        raise UsageError("no task environment built:\nerror: " + "\nerror: ".join(reasons))
    limits = {
        env: ContainerLimits(
            cpus=r.cpus, memory_mb=r.memory_mb, storage_mb=r.storage_mb, network=r.network_mode
        )
        for env, r in built.resources.items()
    }
    return built.images, built.failed, limits


def _unbuilt(payload: dict[str, Any], unbuilt: dict[str, str]) -> str | None:
    """Why the row cannot start: its environment, or its verifier's, did not build."""
    verifier = payload.get(VERIFIER_KEY) or {}
    for environment in (payload.get(ENVIRONMENT_KEY), verifier.get(ENVIRONMENT_KEY)):
        if environment in unbuilt:
            return f"its image did not build: {unbuilt[environment]}"
    return None


def _ended(job: Journaled, outcome: Outcome, error: str) -> RolloutHandle:
    """A handle already ended with `outcome`: a row that never reached the engine."""
    now = time.time()
    ended = RolloutOutcome(
        job.request, job.step, outcome, "", error=error, submitted_at=now, finished_at=now
    )

    async def end() -> RolloutOutcome:
        return ended

    return RolloutHandle(asyncio.ensure_future(end()), job.request, end)


def exit_code(summary: RunSummary, min_ok_fraction: float) -> int:
    """4 if a write failed; 130 if interrupted; else 3 if fewer than `min_ok_fraction` of the
    requests ended `ok`, so a script or CI job notices a run that produced little or nothing;
    else 0."""
    if summary.write_error:
        return EXIT_WRITE_FAILED
    if summary.interrupted:
        return EXIT_INTERRUPTED
    return 0 if summary.ok / summary.requests >= min_ok_fraction else EXIT_TOO_FEW_OK


async def _collect(
    engine: RolloutEngine,
    feed: Feed,
    total: int,
    run: RunState,
    journal: Journal,
    interrupted: asyncio.Event,
) -> None:
    """Write each outcome as it arrives, until a write fails (then none: --resume takes the
    rest from S3 and the journal); an interrupt cancels what is left."""
    watchers = [
        asyncio.create_task(_cancel_on(interrupted, feed)),
        asyncio.create_task(_stop_starting(run.write_failed, engine, feed, journal)),
    ]
    rows = Lines(run.out / ROLLOUTS, run.failed)
    try:
        with progress_bar(total) as update:
            async for outcome in feed:
                run.tally.add(outcome)
                if run.write_error is None:
                    row = outcome.to_dict()
                    if interrupted.is_set() and outcome.outcome is Outcome.CANCELLED:
                        row[INTERRUPTED] = True  # --resume runs it again
                    rows.write(row)
                if run.write_error is not None:  # that write, or an earlier one, failed
                    run.unwritten += 1
                update(outcome, engine.stats().live_sessions)
                run.progress()
    finally:
        run.progress(last=True)
        rows.close()
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)


async def _cancel_on(event: asyncio.Event, feed: Feed) -> None:
    await event.wait()
    feed.cancel()


async def _stop_starting(
    failed: asyncio.Event, engine: RolloutEngine, feed: Feed, journal: Journal
) -> None:
    """After a write error, submit no more and cancel the requests whose sessions have not
    started; the running ones finish, their results going to S3. Cancelled during its
    invocation, a session would be stopped unjournaled and --resume would run its agent again,
    so this waits for a moment no invocation is in flight (invoked, less started, less
    failed)."""
    await failed.wait()
    feed.close()
    while _invoking(engine.stats(), journal):  # noqa: ASYNC110 (no event marks their end)
        await asyncio.sleep(0.05)
    for handle in list(feed.running.values()):
        if handle.request.request_id not in journal.started_ids:
            handle.cancel()


def _invoking(stats: EngineStats, journal: Journal) -> bool:
    return stats.invokes > len(journal.started_ids) + sum(stats.invoke_errors.values())
