"""`agentcore-rollout`: run rollouts, keep the local stack up, deploy the runtime.

    agentcore-rollout run                     # the example dataset on the embedded local stack
    agentcore-rollout run --config configs/aws.yaml --n 8 engine.start_rate=5
    agentcore-rollout train [--steps 20] [--max-staleness 1]   # GRPO on the local toy policy
    agentcore-rollout verl [--config-path D --config-name N] [HYDRA OVERRIDES]  # veRL, agentcore
    agentcore-rollout local up                # keep the stack running; prints its endpoints
    agentcore-rollout deploy --name NAME --image URI --role ARN   # prints the runtime ARN
    agentcore-rollout infra env --stack NAME  # agentcore.env from the stack's outputs

Without --config (or $AGENTCORE_ROLLOUT_CONFIG), `run` and `local up` load configs/local.yaml
and `train` configs/train.yaml from the current directory if it is there (the repository's
root), else the built-in defaults that configs/engine.yaml lists. Dotted overrides
(`engine.key=value`) may go anywhere.

Exit codes: 0 when at least `run.min_ok_fraction` of the requests ended `ok`; 3 when fewer
did (rollouts.jsonl and summary.json are still written, the summary still printed); 130 when
interrupted, after writing every request's outcome (the unfinished ones as `cancelled`); 2 for
a usage, config, dataset or output-directory error, which is one line on stderr and is found
before anything starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import (
    Config,
    ConfigError,
    Outcome,
    RolloutBatch,
    RolloutEngine,
    RolloutHandle,
    RolloutOutcome,
    RolloutRequest,
    load_config,
)
from ._journal import JOURNAL, Journal, Journaled, JournalError, ended, read_journal, run_secret

EXIT_ERROR, EXIT_TOO_FEW_OK, EXIT_INTERRUPTED = 2, 3, 130
DEFAULT_CONFIG = Path("configs/local.yaml")  # relative to the current directory
TRAIN_CONFIG = Path("configs/train.yaml")
ROLLOUTS, SUMMARY = "rollouts.jsonl", "summary.json"

console = Console(stderr=True)


class UsageError(ValueError):
    """Input the CLI cannot use: its arguments, the dataset, the output directory."""


def read_dataset(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(input_id, payload) per non-empty line. The id names the row's group (its `n` samples):
    the row's `id`, as text (`7` -> "7"), or `line-<N>` if it has none (absent, null or "").
    Two rows with one id are an error, not one bigger group: a group's rewards are compared
    with each other, so mixing two prompts in one would be silently wrong."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: an editor's BOM is not data
    except OSError as e:
        raise UsageError(f"data: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"data: {path} is not UTF-8 text (byte {e.start})") from None
    rows: list[tuple[str, dict[str, Any]]] = []
    first_seen: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"data: {path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UsageError(f"data: {path}:{number}: expected a JSON object")
        input_id = _row_id(row.get("id"), number)
        if input_id is None:
            raise UsageError(f"data: {path}:{number}: id must be a string or a number")
        if input_id in first_seen:
            raise UsageError(
                f"data: {path}:{number}: duplicate id {input_id!r} (first on line "
                f"{first_seen[input_id]}); ids name groups, one row each"
            )
        first_seen[input_id] = number
        rows.append((input_id, row))
    if not rows:
        raise UsageError(f"data: {path} has no rows")
    return rows


def _row_id(value: Any, number: int) -> str | None:
    """The row's group id, or None if its `id` is of a kind that cannot be one (a list...)."""
    if value is None or value == "":
        return f"line-{number}"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


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


def build_requests(rows: list[tuple[str, dict[str, Any]]], n: int) -> list[RolloutRequest]:
    return [
        RolloutRequest(payload=row, input_id=input_id, sample_index=k)
        for input_id, row in rows
        for k in range(n)
    ]


def summarize(batch: RolloutBatch) -> dict:
    """The figures `summary.json` holds and the tables show: the batch's, plus per group."""
    groups: dict[str, list[RolloutOutcome]] = defaultdict(list)
    for o in batch.outcomes:
        groups[o.request.input_id].append(o)
    return {
        "requests": len(batch.outcomes),
        "outcomes": batch.counts,
        "reward_mean": batch.reward_mean,
        "groups": {
            gid: {
                "n": len(members),
                "ok": sum(m.outcome is Outcome.OK for m in members),
                "reward_mean": _mean([m.reward for m in members if m.reward is not None]),
            }
            for gid, members in groups.items()
        },
        "latency_s": batch.latency(),
        "wall_time_s": batch.wall_time,
        "throughput_per_s": batch.throughput,
        "api_calls": batch.api_calls,
        "api_calls_per_rollout": batch.api_calls_per_rollout,
        "engine": asdict(batch.stats),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------- run


async def run(
    config: Config,
    jobs: list[Journaled],
    out: Path,
    *,
    resumed: bool = False,
    interrupted: asyncio.Event,
) -> dict:
    """Roll out `jobs` (fresh requests, or what a resumed run left open); journal them, write
    rollouts.jsonl as outcomes arrive and summary.json last (into `out`, which `prepare_out`
    made)."""
    async with AsyncExitStack() as stack:
        engine_config = config.engine
        if config.stack == "local":
            from .local.stack import LocalStack

            with console.status("starting the local stack (moto, emulator, policy, gateway)"):
                local = await stack.enter_async_context(LocalStack(config.local))
            engine_config = local.engine_config(config.engine)
        engine = await stack.enter_async_context(RolloutEngine(engine_config, step=config.run.step))
        began, before = time.monotonic(), engine.stats()
        outcomes = await _roll_out(engine, jobs, config, out, resumed, interrupted)
        wall_time = time.monotonic() - began
        stats = engine.stats().since(before)
        summary = summarize(RolloutBatch(engine.step, outcomes, stats, wall_time))
    summary["interrupted"] = interrupted.is_set()
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def exit_code(summary: dict, min_ok_fraction: float) -> int:
    """130 if interrupted; else 3 if fewer than `min_ok_fraction` of the requests ended `ok`,
    so a script or CI job notices a run that produced little or nothing; else 0."""
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    ok_fraction = summary["outcomes"][str(Outcome.OK)] / summary["requests"]
    return 0 if ok_fraction >= min_ok_fraction else EXIT_TOO_FEW_OK


async def _roll_out(
    engine: RolloutEngine,
    jobs: list[Journaled],
    config: Config,
    out: Path,
    resumed: bool,
    interrupted: asyncio.Event,
) -> list[RolloutOutcome]:
    with Journal(out) as journal:
        if not resumed:
            journal.submitted([j.request for j in jobs], config.run.step)
        handles = [
            engine.resume(
                j.request,
                step=j.step,
                deadline=j.running_until,
                gateway_session_id=j.gateway_session_id,
                timeout=config.run.timeout,
                on_start=journal.started,
            )
            if resumed
            else engine.submit(j.request, timeout=config.run.timeout, on_start=journal.started)
            for j in jobs
        ]
        return await _collect(engine, handles, out / ROLLOUTS, interrupted)


async def _collect(
    engine: RolloutEngine, handles: list[RolloutHandle], path: Path, interrupted: asyncio.Event
) -> list[RolloutOutcome]:
    """Write each outcome as it arrives; an interrupt cancels what is left."""
    stop_all = asyncio.create_task(_cancel_on(interrupted, handles))
    by_id: dict[str, RolloutOutcome] = {}
    try:
        with _ProgressBar(len(handles)) as update, path.open("a") as sink:
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


class _ProgressBar:
    """A rich progress bar: submitted / running / done / failed."""

    def __init__(self, total: int) -> None:
        self._total = total
        self._bar = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task = self._bar.add_task("rollouts", total=total, status="")
        self._done = self._failed = 0

    def __enter__(self) -> Callable[[RolloutOutcome, int], None]:
        self._bar.start()
        return self._update

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def _update(self, finished: RolloutOutcome, running: int) -> None:
        self._done += 1
        self._failed += finished.outcome is not Outcome.OK
        status = (
            f"submitted {self._total}  running {running}  done {self._done}  failed {self._failed}"
        )
        self._bar.update(self._task, completed=self._done, status=status)


def print_summary(summary: dict, out: Path) -> None:
    table = Table(title=f"rollouts: {summary['requests']} requests", title_justify="left")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for name, count in summary["outcomes"].items():
        table.add_row(name, str(count))
    console.print(table)
    lat = summary["latency_s"]
    figures = Table(show_header=False, title="figures", title_justify="left")
    for name, value in [
        ("reward mean", _fmt(summary["reward_mean"])),
        (
            "latency p50 / p95 / p99 (s)",
            " / ".join(_fmt(lat.get(k)) for k in ("p50", "p95", "p99")),
        ),
        ("throughput (rollouts/s)", _fmt(summary["throughput_per_s"])),
        ("API calls per rollout", _fmt(summary["api_calls_per_rollout"])),
        ("wall time (s)", _fmt(summary["wall_time_s"])),
    ]:
        figures.add_row(name, value)
    console.print(figures)
    groups = Table(title="reward mean per group", title_justify="left")
    for col in ("group", "n", "ok", "reward mean"):
        groups.add_column(col, justify="left" if col == "group" else "right")
    items = list(summary["groups"].items())
    for gid, g in items[:20]:
        groups.add_row(gid, str(g["n"]), str(g["ok"]), _fmt(g["reward_mean"]))
    if len(items) > 20:
        groups.add_row(f"... {len(items) - 20} more in summary.json", "", "", "")
    console.print(groups)
    console.print(f"wrote {out / ROLLOUTS} and {out / SUMMARY}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# ---------------------------------------------------------------------- local up


async def local_up(config: Config, *, interrupted: asyncio.Event) -> None:
    from .local.stack import LocalStack

    async with LocalStack(config.local) as local:
        engine_cfg = local.engine_config(config.engine)
        table = Table(title="local stack (Ctrl-C to stop)", show_header=False, title_justify="left")
        table.add_row("S3 + SQS (moto)", local.moto.url)
        table.add_row("AgentCore Runtime emulator", engine_cfg.endpoints.agentcore or "")
        table.add_row("policy (router or worker)", local.policy_url)
        if engine_cfg.gateway is not None:
            table.add_row("token-capture gateway", engine_cfg.gateway.url)
        table.add_row("bucket / prefix", f"{engine_cfg.bucket} / {engine_cfg.prefix}")
        table.add_row("queue", engine_cfg.queue_url or "")
        table.add_row("runtime ARN", engine_cfg.runtime_arn or "")
        console.print(table)
        print("\n".join(local.env_lines()), flush=True)
        await interrupted.wait()


# ---------------------------------------------------------------------- entry point


class _Parser(argparse.ArgumentParser):
    """argparse that raises usage errors, so they are one line like every other error (not
    the usage text and an exit from inside the parser)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """Dotted overrides may go anywhere on the line. argparse gives a `nargs="*"` positional
    only the words before the first option, and `parse_intermixed_args` refuses subcommands,
    so the words it leaves over become overrides if they look like `key=value`."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    takes_overrides = hasattr(args, "overrides")
    unknown = [a for a in extra if not takes_overrides or a.startswith("-") or "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agentcore-rollout", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="roll out a dataset and write rollouts.jsonl + summary.json")
    _config_args(run_p)
    run_p.add_argument("--data", help="JSONL dataset, one payload per line")
    run_p.add_argument("--n", type=int, help="samples per prompt (group size)")
    run_p.add_argument("--out", help="output directory")
    run_p.add_argument(
        "--resume",
        metavar="OUT",
        help="take over the run that wrote OUT (after a crash): collect what its agents wrote, "
        "wait for what still runs, start only what never started",
    )
    train_p = sub.add_parser(
        "train", help="GRPO on the local toy policy through the whole pipeline; draws its curve"
    )
    _config_args(train_p)
    train_p.add_argument("--data", help="JSONL dataset, one prompt per line")
    train_p.add_argument("--steps", type=int, help="training steps")
    train_p.add_argument("--out", help="output directory")
    train_p.add_argument(
        "--max-staleness",
        type=int,
        help="steps a group may lag the policy and still be trained (importance-weighted); "
        "1 overlaps the next step's rollouts with this step's update",
    )
    sub.add_parser(  # main() hands its arguments to the switch before this parser sees them
        "verl",
        help="veRL's main_ppo with rollout.mode=agentcore translated into native settings "
        "(the [verl] extra): verl [--config-path DIR --config-name NAME] [HYDRA OVERRIDES]",
    )
    local_p = sub.add_parser("local", help="the embedded local stack")
    local_sub = local_p.add_subparsers(dest="local_command", required=True)
    _config_args(local_sub.add_parser("up", help="start the stack and keep it running"))
    _infra_args(sub)
    return parser


def _infra_args(sub: Any) -> None:
    deploy = sub.add_parser("deploy", help="create or update the AgentCore runtime; print its ARN")
    deploy.add_argument("--name", required=True, help="runtime name ([a-zA-Z][a-zA-Z0-9_]{0,47})")
    deploy.add_argument("--image", required=True, help="container image URI in ECR (arm64)")
    deploy.add_argument("--role", required=True, help="execution role ARN (stack output RoleArn)")
    deploy.add_argument("--network", choices=["PUBLIC", "VPC"], default="PUBLIC")
    deploy.add_argument("--subnet", action="append", default=[], help="VPC subnet (repeat)")
    deploy.add_argument("--security-group", action="append", default=[], help="VPC SG (repeat)")
    deploy.add_argument("--idle-timeout", type=int, default=900, help="seconds")
    deploy.add_argument("--max-lifetime", type=int, default=28_800, help="seconds")
    deploy.add_argument("--env", action="append", default=[], help="KEY=VALUE for the agent")
    deploy.add_argument("--gateway-url", help="the policy gateway's /v1 URL agents call")
    deploy.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for READY")
    destroy = sub.add_parser("destroy", help="delete the AgentCore runtime")
    destroy.add_argument("--name", required=True)
    destroy.add_argument("--missing-ok", action="store_true", help="no runtime is not an error")
    infra = sub.add_parser("infra", help="the provisioned AWS stack")
    infra_sub = infra.add_subparsers(dest="infra_command", required=True)
    env = infra_sub.add_parser("env", help="write agentcore.env from a stack's outputs")
    env.add_argument("--stack", required=True, help="CloudFormation stack name")
    env.add_argument("--out", default="agentcore.env")
    env.add_argument("--runtime-arn", help="wins over the stack's RuntimeArn output")
    for p in (deploy, destroy, env):
        p.add_argument("--region", help="default: the usual AWS configuration chain")
        p.add_argument("--endpoint-url", help="control-plane endpoint override (tests)")


def _infra(args: argparse.Namespace) -> int:
    """deploy / destroy / infra env: boto3 control plane, one line of output each."""
    from . import _infra as infra

    if args.command == "infra":
        client = infra.aws_client("cloudformation", args.region, args.endpoint_url)
        values = infra.write_stack_env(
            args.stack, args.out, runtime_arn=args.runtime_arn, client=client
        )
        console.print(f"wrote {len(values)} entries to {args.out}")
        return 0
    client = infra.aws_client("bedrock-agentcore-control", args.region, args.endpoint_url)
    if args.command == "destroy":
        gone = infra.destroy_runtime(args.name, client=client, missing_ok=args.missing_ok)
        console.print(f"deleted runtime {args.name}" if gone else f"no runtime {args.name}")
        return 0
    environment = dict(_key_value(item) for item in args.env)
    spec = infra.RuntimeSpec(
        name=args.name,
        container_uri=args.image,
        role_arn=args.role,
        network_mode=args.network,
        subnets=tuple(args.subnet),
        security_groups=tuple(args.security_group),
        idle_timeout_s=args.idle_timeout,
        max_lifetime_s=args.max_lifetime,
        environment=environment,
        gateway_url=args.gateway_url,
    )
    iam = infra.aws_client("iam", args.region, args.endpoint_url)
    with console.status(f"deploying runtime {args.name} (waiting for READY)"):
        info = infra.deploy_runtime(spec, client=client, iam_client=iam, timeout_s=args.timeout)
    print(info.arn, flush=True)  # stdout: the one thing scripts want
    return 0


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--env {item!r} is not KEY=VALUE")
    return key, value


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help=f"YAML config (default: $AGENTCORE_ROLLOUT_CONFIG, else {DEFAULT_CONFIG} if it "
        "exists here, else the built-in defaults of configs/engine.yaml)",
    )
    p.add_argument("--env-file", help="dotenv file (default: agentcore.env, if it exists)")
    p.add_argument(
        "overrides", nargs="*", help="dotted overrides, anywhere, e.g. engine.start_rate=5"
    )


def _load(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    section = "train" if args.command == "train" else "run"
    for key in ("data", "n", "out", "steps"):
        if getattr(args, key, None) is not None:
            overrides.append(f"{section}.{key}={getattr(args, key)}")
    if getattr(args, "max_staleness", None) is not None:
        overrides.append(f"engine.max_staleness={args.max_staleness}")
    if args.env_file and not Path(args.env_file).is_file():  # only the default may be absent
        raise UsageError(f"--env-file {args.env_file}: not a file")
    env_file = args.env_file or "agentcore.env"
    return load_config(_config_path(args), env_file=env_file, overrides=overrides)


def _config_path(args: argparse.Namespace) -> str | None:
    """--config, else $AGENTCORE_ROLLOUT_CONFIG, else configs/local.yaml when run from the
    repository (as `make run` is), else None: the built-in defaults. An empty variable is
    unset."""
    chosen = args.config or os.environ.get("AGENTCORE_ROLLOUT_CONFIG")
    if chosen:
        return chosen
    default = TRAIN_CONFIG if args.command == "train" else DEFAULT_CONFIG
    return str(default) if default.is_file() else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["verl"]:  # Hydra's command line, not ours: passed on as it is
            return _verl(argv[1:])
        args = _parse(argv)
        if args.command in ("deploy", "destroy", "infra"):
            return _infra(args)
        config = _load(args)
        if args.command == "run":
            return _run(config, args.resume)
        if args.command == "train":
            return _train(config)
        _run_async(lambda stop: local_up(config, interrupted=stop))
        return 0
    except (ConfigError, UsageError, JournalError, RuntimeError) as e:  # InfraError: Runtime
        print(f"error: {e}", file=sys.stderr)  # plain: one line, never wrapped
        return EXIT_ERROR


def _run(config: Config, resume: str | None) -> int:
    """`run`: everything the user's input can get wrong is checked before the stack starts."""
    if resume is None:
        out = Path(config.run.out)
        requests = build_requests(read_dataset(Path(config.run.data)), config.run.n)
        prepare_out(out, fresh=True)
        jobs = [Journaled(r, config.run.step) for r in requests]
        previous: list[dict[str, Any]] = []
    else:
        out = Path(resume)
        prepare_out(out, fresh=False)
        jobs, previous = _left_open(out)
    secret = run_secret(out, config.engine.run_secret, resume=resume is not None)
    config = config.model_copy(
        update={"engine": config.engine.model_copy(update={"run_secret": secret})}
    )
    summary = _run_async(
        lambda stop: run(config, jobs, out, resumed=resume is not None, interrupted=stop)
    )
    if previous:
        _count_in(summary, previous, out)
    print_summary(summary, out)
    code = exit_code(summary, config.run.min_ok_fraction)
    if code == EXIT_INTERRUPTED:
        console.print("[yellow]interrupted: unfinished requests were cancelled")
    elif code == EXIT_TOO_FEW_OK:
        ok = summary["outcomes"][str(Outcome.OK)]
        print(
            f"error: {ok} of {summary['requests']} requests ended ok, fewer than "
            f"run.min_ok_fraction={config.run.min_ok_fraction}",
            file=sys.stderr,
        )
    return code


def _verl(hydra_args: list[str]) -> int:
    """`verl`: the switch lives with the integration, which needs the [verl] extra."""
    try:
        from .integrations.verl.switch import run
    except ImportError as e:
        raise UsageError(f"verl: install the [verl] extra ({e})") from None
    return run(hydra_args)


def _train(config: Config) -> int:
    """`train`: GRPO on the local TinyPolicy; metrics.jsonl, reward_curve.png, a summary."""
    from ._train_view import CURVE, StepProgress, draw_curve, summary_table
    from .local.trainer import METRICS, train
    from .training import GroupPolicy

    if config.stack != "local":
        raise UsageError("train: trains the local toy policy, so it needs stack: local")
    try:
        GroupPolicy(config.train.n, config.train.extra, config.train.min_ok)
    except ValueError as e:
        raise UsageError(f"train: {e}") from None
    prompts = read_dataset(Path(config.train.data))
    out = Path(config.train.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / METRICS).open("w").close()
    except OSError as e:
        raise UsageError(f"train.out: cannot write {out}: {e.strerror or e}") from None
    with StepProgress(console, config.train.steps) as progress:
        rows = _run_async(
            lambda stop: train(config, prompts, out, view=progress, interrupted=stop),
            stopping="stopping after the step under way (again to force)",
        )
    for table in summary_table(rows):
        console.print(table)
    tc = config.train
    title = (
        f"GRPO, TinyPolicy: {len(prompts)} prompts x {tc.n}, lr {tc.lr}, "
        f"max_staleness {config.engine.max_staleness}"
    )
    drew = draw_curve(rows, out / CURVE, title)
    console.print(
        f"wrote {out / METRICS}"
        + (f" and {out / CURVE}" if drew else " (no plot: matplotlib is not installed)")
    )
    return EXIT_INTERRUPTED if len(rows) < config.train.steps else 0


def _left_open(out: Path) -> tuple[list[Journaled], list[dict[str, Any]]]:
    """The journaled requests that have no line in rollouts.jsonl yet, and the lines there."""
    lines = ended(out / ROLLOUTS)
    done = {line["request_id"] for line in lines}
    return [j for j in read_journal(out) if j.request.request_id not in done], lines


def _count_in(summary: dict, previous: list[dict[str, Any]], out: Path) -> None:
    """A resumed run's summary counts the whole run: what ended before the crash too."""
    summary["resumed_after"] = len(previous)
    summary["requests"] += len(previous)
    for line in previous:
        summary["outcomes"][line["outcome"]] += 1
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")


def _run_async(
    make: Callable[[asyncio.Event], Any],
    stopping: str = "stopping: cancelling unfinished rollouts (again to force)",
) -> Any:
    """Run `make(stop)`; the first SIGINT/SIGTERM sets `stop` (a clean shutdown, announced
    with `stopping`), a second one interrupts for real."""

    async def body() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_signal, stop, loop, sig, stopping)
        return await make(stop)

    return asyncio.run(body())


def _on_signal(
    stop: asyncio.Event, loop: asyncio.AbstractEventLoop, sig: int, stopping: str
) -> None:
    if stop.is_set():
        loop.remove_signal_handler(sig)
        signal.raise_signal(sig)
        return
    console.print(f"[yellow]{stopping}")
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
