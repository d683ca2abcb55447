"""The `run` command: roll out a dataset (or take over a crashed run with `--resume OUT`),
write each outcome to rollouts.jsonl as it arrives and summary.json once at the end, and pick
the exit code. Everything the user's input can get wrong is checked before the stack starts."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

from .. import Config, RolloutBatch, RolloutEngine, RolloutHandle, RolloutOutcome
from .dataset import build_requests, read_dataset
from .errors import EXIT_INTERRUPTED, EXIT_TOO_FEW_OK, UsageError
from .journal import JOURNAL, ROLLOUTS, Journal, Journaled, left_open, run_secret
from .summary import SUMMARY, RunSummary
from .views import console, print_summary, progress_bar, run_async


def run_command(config: Config, resume: str | None) -> int:
    """`run`, fresh or `--resume OUT`: the exit code."""
    if resume is None:
        out = Path(config.run.out)
        requests = build_requests(read_dataset(Path(config.run.data)), config.run.n)
        prepare_out(out, fresh=True)
        jobs = [Journaled(r, config.run.step) for r in requests]
        ended_before: list[str] = []
    else:
        out = Path(resume)
        prepare_out(out, fresh=False)
        jobs, ended_before = left_open(out)
    secret = run_secret(out, config.engine.run_secret, resume=resume is not None)
    config = config.model_copy(
        update={"engine": config.engine.model_copy(update={"run_secret": secret})}
    )
    summary = run_async(
        lambda stop: roll_out(config, jobs, out, resumed=resume is not None, interrupted=stop)
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
    jobs: list[Journaled],
    out: Path,
    *,
    resumed: bool = False,
    interrupted: asyncio.Event,
) -> RunSummary:
    """Roll out `jobs` (fresh requests, journaled before any starts, or what a resumed run left
    open): submit or resume each, write rollouts.jsonl as outcomes arrive."""
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
        if not resumed:
            journal.submitted([j.request for j in jobs], config.run.step)
        handles = [
            engine.resume(
                j.request,
                step=j.step,
                deadline=j.deadline,
                gateway_session_id=j.gateway_session_id,
                timeout=config.run.timeout,
                on_start=journal.started,
            )
            if resumed
            else engine.submit(j.request, timeout=config.run.timeout, on_start=journal.started)
            for j in jobs
        ]
        outcomes = await _collect(engine, handles, out / ROLLOUTS, interrupted)
        wall_time = time.monotonic() - began
        batch = RolloutBatch(engine.step, outcomes, engine.stats().since(before), wall_time)
    return RunSummary.of(batch, interrupted=interrupted.is_set())


def exit_code(summary: RunSummary, min_ok_fraction: float) -> int:
    """130 if interrupted; else 3 if fewer than `min_ok_fraction` of the requests ended `ok`,
    so a script or CI job notices a run that produced little or nothing; else 0."""
    if summary.interrupted:
        return EXIT_INTERRUPTED
    ok_fraction = summary.ok / summary.requests
    return 0 if ok_fraction >= min_ok_fraction else EXIT_TOO_FEW_OK


async def _collect(
    engine: RolloutEngine, handles: list[RolloutHandle], path: Path, interrupted: asyncio.Event
) -> list[RolloutOutcome]:
    """Write each outcome as it arrives; an interrupt cancels what is left."""
    stop_all = asyncio.create_task(_cancel_on(interrupted, handles))
    by_id: dict[str, RolloutOutcome] = {}
    try:
        with progress_bar(len(handles)) as update, path.open("a") as sink:
            for next_done in asyncio.as_completed(handles):
                outcome = await next_done
                by_id[outcome.request.request_id] = outcome
                sink.write(json.dumps(outcome.to_dict()) + "\n")
                sink.flush()
                update(outcome, engine.stats().live_sessions)
    finally:
        stop_all.cancel()
        await asyncio.gather(stop_all, return_exceptions=True)
    return [by_id[h.request.request_id] for h in handles]


async def _cancel_on(event: asyncio.Event, handles: list[RolloutHandle]) -> None:
    await event.wait()
    for h in handles:
        h.cancel()
