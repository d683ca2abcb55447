"""The `run` command: roll out a dataset (or take over a crashed run with `--resume OUT`),
write each outcome to rollouts.jsonl as it arrives and summary.json once at the end, and pick
the exit code. Everything the user's input can get wrong is checked before the stack starts."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from .. import Config, RolloutEngine, RolloutHandle
from .dataset import journal_requests
from .errors import EXIT_INTERRUPTED, EXIT_TOO_FEW_OK, UsageError
from .feed import Feed
from .journal import JOURNAL, ROLLOUTS, Journal, Journaled, left_open, run_secret
from .journal import journaled_requests as journaled
from .summary import SUMMARY, RunSummary, Tally
from .views import console, print_summary, progress_bar, run_async


def run_command(config: Config, resume: str | None) -> int:
    """`run`, fresh or `--resume OUT`: the exit code."""
    if resume is None:
        out = Path(config.run.out)
        prepare_out(out, fresh=True)
        total = journal_dataset(config, out / JOURNAL)
        jobs: Iterable[Journaled] = journaled(out / JOURNAL, total)
        ended_before: list[str] = []
    else:
        out = Path(resume)
        prepare_out(out, fresh=False)
        jobs, ended_before = left_open(out)
        total = len(jobs)
    secret = run_secret(out, config.engine.run_secret, resume=resume is not None)
    config = config.model_copy(
        update={"engine": config.engine.model_copy(update={"run_secret": secret})}
    )
    summary = run_async(
        lambda stop: roll_out(
            config, jobs, total, out, resumed=resume is not None, interrupted=stop
        )
    ).counting_in(ended_before)
    (out / SUMMARY).write_text(summary.to_json())
    print_summary(summary)
    console.print(f"wrote {out / ROLLOUTS} and {out / SUMMARY}")
    code = exit_code(summary, config.run.min_ok_fraction)
    if code == EXIT_INTERRUPTED:
        console.print("[yellow]interrupted: unfinished requests were cancelled")
    elif code == EXIT_TOO_FEW_OK:
        print(
            f"error: {summary.ok} of {summary.requests} requests ended ok, fewer than "
            f"run.min_ok_fraction={config.run.min_ok_fraction}",
            file=sys.stderr,
        )
    return code


def journal_dataset(config: Config, path: Path) -> int:
    """Check the dataset and journal its requests before anything starts (one pass, a line at a
    time); how many. A bad dataset leaves the journal empty, as prepare_out made it."""
    data = Path(config.run.data)
    try:
        with path.open("w") as sink, console.status(f"checking and journaling {data}"):
            return journal_requests(data, config.run.n, config.run.step, Journal(sink))
    except OSError as e:
        path.open("w").close()
        raise UsageError(f"run.out: cannot write {path}: {e.strerror}") from None
    except UsageError:
        path.open("w").close()
        raise


def prepare_out(out: Path, *, fresh: bool) -> None:
    """Create the output directory and its files once, so a run never fails at its end (or
    after the local stack started) for want of a place to write. A fresh run starts them
    empty; a resumed one appends."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in (ROLLOUTS, SUMMARY, JOURNAL):
            (out / name).open("w" if fresh else "a").close()
    except FileExistsError:
        raise UsageError(f"run.out: {out} exists and is not a directory") from None
    except OSError as e:
        raise UsageError(f"run.out: cannot write {e.filename}: {e.strerror}") from None


async def roll_out(
    config: Config,
    jobs: Iterable[Journaled],
    total: int,
    out: Path,
    *,
    resumed: bool = False,
    interrupted: asyncio.Event,
) -> RunSummary:
    """Roll out the `total` `jobs` (fresh requests, journaled before any starts, or what a
    resumed run left open): submit or resume each as earlier ones end (`Feed`, a window of
    twice the live sessions), write rollouts.jsonl as outcomes arrive."""
    async with AsyncExitStack() as stack:
        engine_config = config.engine
        if config.stack == "local":
            from ..local.stack import LocalStack  # lazily: it loads moto, numpy, the gateway

            with console.status("starting the local stack (moto, emulator, policy, gateway)"):
                local = await stack.enter_async_context(LocalStack(config.local))
            engine_config = local.engine_config(config.engine)
        engine = await stack.enter_async_context(RolloutEngine(engine_config, step=config.run.step))
        began, before = time.monotonic(), engine.stats()
        journal = Journal(stack.enter_context((out / JOURNAL).open("a")))

        def submit(j: Journaled) -> RolloutHandle:
            started: dict[str, Any] = {"timeout": config.run.timeout, "on_start": journal.started}
            if not resumed:
                return engine.submit(j.request, **started)
            return engine.resume(
                j.request,
                step=j.step,
                deadline=j.deadline,
                gateway_session_id=j.gateway_session_id,
                **started,
            )

        feed = Feed(jobs, submit, window=2 * engine_config.dispatch.max_live_sessions)
        tally = await _collect(engine, feed, total, out / ROLLOUTS, interrupted)
        stats, wall_time = engine.stats().since(before), time.monotonic() - began
    return RunSummary.of(tally, stats, wall_time, interrupted=interrupted.is_set())


def exit_code(summary: RunSummary, min_ok_fraction: float) -> int:
    """130 if interrupted; else 3 if fewer than `min_ok_fraction` of the requests ended `ok`,
    so a script or CI job notices a run that produced little or nothing; else 0."""
    if summary.interrupted:
        return EXIT_INTERRUPTED
    ok_fraction = summary.ok / summary.requests
    return 0 if ok_fraction >= min_ok_fraction else EXIT_TOO_FEW_OK


async def _collect(
    engine: RolloutEngine, feed: Feed, total: int, path: Path, interrupted: asyncio.Event
) -> Tally:
    """Write each outcome as it arrives; an interrupt cancels what is left."""
    stop_all = asyncio.create_task(_cancel_on(interrupted, feed))
    tally = Tally()
    try:
        with progress_bar(total) as update, path.open("a") as sink:
            async for outcome in feed:
                tally.add(outcome)
                sink.write(json.dumps(outcome.to_dict()) + "\n")
                sink.flush()
                update(outcome, engine.stats().live_sessions)
    finally:
        stop_all.cancel()
        await asyncio.gather(stop_all, return_exceptions=True)
    return tally


async def _cancel_on(event: asyncio.Event, feed: Feed) -> None:
    await event.wait()
    feed.cancel()
