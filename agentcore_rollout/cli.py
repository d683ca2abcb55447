"""`agentcore-rollout`: run rollouts, keep the local stack up, deploy the runtime.

    agentcore-rollout run                     # the example dataset on the embedded local stack
    agentcore-rollout run --config configs/aws.yaml engine.start_rate=5 --n 8
    agentcore-rollout local up                # keep the stack running; prints its endpoints
    agentcore-rollout deploy --name NAME --image URI --role ARN   # prints the runtime ARN
    agentcore-rollout infra env --stack NAME  # agentcore.env from the stack's outputs

Errors are one line on stderr and exit code 2; an interrupted run exits 130 after writing
every request's outcome (the unfinished ones as `cancelled`).
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
from typing import Any

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

EXIT_ERROR, EXIT_INTERRUPTED = 2, 130

console = Console(stderr=True)


class DataError(ValueError):
    """The dataset file is missing or has a line that is not a JSON object."""


def read_dataset(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(input_id, payload) per non-empty line; the id is the row's `id` or its line number."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DataError(f"data: cannot read {path}: {e.strerror}") from None
    rows: list[tuple[str, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"data: {path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"data: {path}:{number}: expected a JSON object")
        rows.append((str(row.get("id", f"line-{number}")), row))
    if not rows:
        raise DataError(f"data: {path} has no rows")
    return rows


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


async def run(config: Config, *, interrupted: asyncio.Event) -> dict:
    """Roll out the dataset; write rollouts.jsonl as outcomes arrive and summary.json last."""
    rows = read_dataset(Path(config.run.data))  # small and before any work starts: fine to block
    requests = build_requests(rows, config.run.n)
    out = Path(config.run.out)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    async with AsyncExitStack() as stack:
        engine_config = config.engine
        if config.stack == "local":
            from .local.stack import LocalStack

            with console.status("starting the local stack (moto, emulator, policy, gateway)"):
                local = await stack.enter_async_context(LocalStack(config.local))
            engine_config = local.engine_config(config.engine)
        engine = await stack.enter_async_context(RolloutEngine(engine_config, step=config.run.step))
        began, before = time.monotonic(), engine.stats()
        outcomes = await _roll_out(engine, requests, config, out / "rollouts.jsonl", interrupted)
        wall_time = time.monotonic() - began
        stats = engine.stats().since(before)
        summary = summarize(RolloutBatch(engine.step, outcomes, stats, wall_time))
    summary["interrupted"] = interrupted.is_set()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


async def _roll_out(
    engine: RolloutEngine,
    requests: list[RolloutRequest],
    config: Config,
    path: Path,
    interrupted: asyncio.Event,
) -> list[RolloutOutcome]:
    handles = [engine.submit(r, timeout=config.run.timeout) for r in requests]
    stop_all = asyncio.create_task(_cancel_on(interrupted, handles))
    by_id: dict[str, RolloutOutcome] = {}
    try:
        with _ProgressBar(len(requests)) as update, path.open("w") as sink:
            for next_done in asyncio.as_completed(handles):
                outcome = await next_done
                by_id[outcome.request.request_id] = outcome
                sink.write(json.dumps(outcome.to_dict()) + "\n")
                sink.flush()
                update(outcome, engine.stats().live_sessions)
    finally:
        stop_all.cancel()
        await asyncio.gather(stop_all, return_exceptions=True)
    return [by_id[r.request_id] for r in requests]


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
    console.print(f"wrote {out / 'rollouts.jsonl'} and {out / 'summary.json'}")


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentcore-rollout", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="roll out a dataset and write rollouts.jsonl + summary.json")
    _config_args(run_p)
    run_p.add_argument("--data", help="JSONL dataset, one payload per line")
    run_p.add_argument("--n", type=int, help="samples per prompt (group size)")
    run_p.add_argument("--out", help="output directory")
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
        default=os.environ.get("AGENTCORE_ROLLOUT_CONFIG"),
        help="YAML config (default: $AGENTCORE_ROLLOUT_CONFIG, else built-in local defaults)",
    )
    p.add_argument("--env-file", default="agentcore.env", help="dotenv file (if it exists)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. engine.start_rate=5")


def _load(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    for key in ("data", "n", "out"):
        if getattr(args, key, None) is not None:
            overrides.append(f"run.{key}={getattr(args, key)}")
    return load_config(args.config, env_file=args.env_file, overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command in ("deploy", "destroy", "infra"):
            return _infra(args)
        config = _load(args)
        if args.command == "run":
            summary = _run_async(lambda stop: run(config, interrupted=stop))
            print_summary(summary, Path(config.run.out))
            if summary["interrupted"]:
                console.print("[yellow]interrupted: unfinished requests were cancelled")
                return EXIT_INTERRUPTED
            return 0
        _run_async(lambda stop: local_up(config, interrupted=stop))
        return 0
    except (ConfigError, DataError, RuntimeError) as e:  # InfraError is a RuntimeError
        print(f"error: {e}", file=sys.stderr)  # plain: one line, never wrapped
        return EXIT_ERROR


def _run_async(make: Callable[[asyncio.Event], Any]) -> Any:
    """Run `make(stop)`; the first SIGINT/SIGTERM sets `stop` (a clean shutdown), a second
    one interrupts for real."""

    async def body() -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_signal, stop, loop, sig)
        return await make(stop)

    return asyncio.run(body())


def _on_signal(stop: asyncio.Event, loop: asyncio.AbstractEventLoop, sig: int) -> None:
    if stop.is_set():
        loop.remove_signal_handler(sig)
        signal.raise_signal(sig)
        return
    console.print("[yellow]stopping: cancelling unfinished rollouts (again to force)")
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
