"""The command line: the parser, the config it loads (YAML, env file, flags and dotted
overrides), and `main`, which hands the parsed arguments to the command's module (`local up`
is short enough to live here). Every error the user can cause ends here as one line on stderr
and exit code 2."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from dotenv import dotenv_values
from rich.table import Table

from .. import ConfigError
from ..runtimes.agentcore.published import IDLE_TIMEOUT_S, MAX_LIFETIME_S
from .config import Config, load_config
from .dataset import read_task_source
from .errors import EXIT_ERROR, EXIT_INTERRUPTED, Interrupted, UsageError
from .infra import READY_TIMEOUT_S, infra_command
from .run import run_command
from .terminal import console, run_async

DEFAULT_CONFIG = Path("configs/local.yaml")  # relative to the current directory
TRAIN_CONFIG = Path("configs/train.yaml")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["verl"]:  # Hydra's command line, not ours: passed on as it is
            return _verl(argv[1:])
        args = _parse(argv)
        if args.command in ("deploy", "destroy", "infra"):
            _export_aws("agentcore.env")
            if getattr(args, "tasks", None) or (args.command == "destroy" and args.manifest):
                from .harbor_deploy import harbor_command  # a folder of Harbor tasks

                return harbor_command(args)
            return infra_command(args)
        if args.command == "view":
            from .view import view_command  # lazily: the page's builder

            return view_command(args.out, args.html, args.tokenizer)
        config = _load(args)
        if args.command == "run":
            return run_command(config, args.resume, args.overwrite)
        if args.command == "train":
            from .train import train_command  # lazily: numpy, the local trainer

            return train_command(config, resume=args.resume, overwrite=args.overwrite)
        if args.local_command == "build":
            return local_build(config)
        run_async(lambda stop: local_up(config, interrupted=stop))
        return 0
    except (ConfigError, UsageError, RuntimeError) as e:  # InfraError: Runtime
        print(f"error: {e}", file=sys.stderr)  # plain: one line, never wrapped
        return EXIT_ERROR
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        return EXIT_INTERRUPTED


async def local_up(config: Config, *, interrupted: asyncio.Event) -> None:
    """`local up`: start the stack, print its endpoints (a table on stderr, `agentcore.env`
    lines on stdout), keep it up until Ctrl-C."""
    from ..local.stack import LocalStack  # lazily: it loads moto, numpy, the gateway

    async with LocalStack(config.local) as local:
        engine_cfg = local.engine_config(config.engine)
        table = Table(title="local stack (Ctrl-C to stop)", show_header=False, title_justify="left")
        table.add_row("S3 + SQS (moto)", local.moto.url)
        table.add_row("AgentCore Runtime emulator", engine_cfg.service_urls.agentcore or "")
        table.add_row("policy (router or worker)", local.policy_url)
        if local.gateways:
            table.add_row(
                "token-capture gateway (agents)", ", ".join(g.url for g in local.gateways)
            )
        if engine_cfg.gateway is not None:
            urls = ", ".join(r.url for r in engine_cfg.gateway.all_replicas)
            table.add_row("token-capture gateway (admin)", urls)
        table.add_row("bucket / prefix", f"{engine_cfg.bucket} / {engine_cfg.prefix}")
        table.add_row("queue", engine_cfg.queue_url or "")
        table.add_row("runtime ARN", engine_cfg.runtime_arn or "")
        console.print(table)
        print("\n".join(local.env_lines()), flush=True)
        await interrupted.wait()


def local_build(config: Config) -> int:
    """`local build`: the agent's image (`local.image`) from `local.dockerfile`, for this
    machine, as `local.mode: container` runs it; where `run.data` names Harbor tasks, their
    images instead (one per distinct environment, with `harbor.agent`, and per separate
    verifier's environment): every one that failed in a table, and a nonzero exit."""
    from ..harbor.tasks import is_task_source
    from ..local.containers import build_image, container_engine  # lazily: subprocesses only

    local, data = config.local, Path(config.run.data)
    tasks = read_task_source(data) if is_task_source(data) else None  # before anything starts
    engine = container_engine(local.container_engine)
    if tasks is not None:
        from .harbor import task_images

        made = task_images(tasks, config.harbor.agent, engine, rebuild=True)
        if made.failed:
            table = Table("environment", "why it did not build", title="images that failed")
            for reason in made.failed.values():
                head, _, tail = reason.partition("\n")
                table.add_row(head.split(": ", 1)[0], f"{head.split(': ', 1)[-1]}\n{tail}".strip())
            console.print(table)
            return EXIT_ERROR
        return 0
    base = build_image(local.dockerfile, local.image, engine=engine)
    print(f"built {local.image} from {local.dockerfile} on {base} ({engine.name})", file=sys.stderr)
    return 0


def _verl(hydra_args: list[str]) -> int:
    """`verl`: the switch lives with the integration, which needs the [verl] extra."""
    try:
        from ..integrations.verl.switch import run
    except ImportError as e:
        raise UsageError(f"verl: install the [verl] extra ({e})") from None
    return run(hydra_args)


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
    if unknown := [a for a in extra if not takes_overrides or a.startswith("-") or "=" not in a]:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _parser() -> argparse.ArgumentParser:
    description = "`agentcore-rollout`: run rollouts, keep the local stack up, deploy the runtime."
    parser = _Parser(prog="agentcore-rollout", description=description)
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
    run_p.add_argument(
        "--overwrite", action="store_true", help="replace the output of an earlier run in --out"
    )
    train_p = sub.add_parser(
        "train", help="GRPO on the local toy policy through the whole pipeline; draws its curve"
    )
    _config_args(train_p)
    train_p.add_argument("--data", help="JSONL dataset, one prompt per line")
    train_p.add_argument("--steps", type=int, help="training steps")
    train_p.add_argument("--out", help="output directory")
    train_p.add_argument(
        "--resume",
        action="store_true",
        help="continue the training run in --out from its last saved step (metrics appended)",
    )
    train_p.add_argument(
        "--overwrite", action="store_true", help="replace an earlier training run in --out"
    )
    for p in (run_p, train_p):
        p.add_argument(
            "--logger",
            action="append",
            metavar="NAME",
            help="also log to an experiment tracker in --out: tensorboard, wandb (offline), "
            "mlflow; repeat or comma-separate for several (each its own extra)",
        )
    train_p.add_argument(
        "--max-staleness",
        type=int,
        help="steps a group may lag the policy and still be trained (importance-weighted); "
        "1 overlaps the next step's rollouts with this step's update",
    )
    train_p.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="rollouts never wait for an update: weight pushes abort the turns in flight, "
        "which resume under the new weights (--max-staleness 1 unless set; stale_policy keep "
        "unless engine.limits.stale_policy=end is given)",
    )
    sub.add_parser(  # main() hands its arguments to the switch before this parser sees them
        "verl",
        help="veRL's main_ppo with rollout.mode=agentcore translated into native settings "
        "(the [verl] extra): verl [--config-path DIR --config-name NAME] [HYDRA OVERRIDES]",
    )
    local_p = sub.add_parser("local", help="the embedded local stack")
    local_sub = local_p.add_subparsers(dest="local_command", required=True)
    _config_args(local_sub.add_parser("up", help="start the stack and keep it running"))
    _config_args(
        local_sub.add_parser(
            "build",
            help="build the agent's image (local.dockerfile) here, or the images of the Harbor "
            "tasks run.data names (harbor.agent)",
        )
    )
    view = sub.add_parser("view", help="a run's output as one HTML page (OUT/view.html)")
    view.add_argument("out", metavar="OUT", help="the run's output folder (rollouts.jsonl)")
    view.add_argument("--html", metavar="FILE", help="where to write it (default OUT/view.html)")
    view.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="tokenizer.json's folder, for token text (default: the run's own, if it is here)",
    )
    _infra_args(sub)
    return parser


def _infra_args(sub: Any) -> None:
    deploy = sub.add_parser(
        "deploy",
        help="create or update the AgentCore runtime, print its ARN; or with --tasks one "
        "runtime per environment of a folder of Harbor tasks, and their manifest",
    )
    deploy.add_argument(
        "--name",
        help="runtime name ([a-zA-Z][a-zA-Z0-9_]{0,47}); with --tasks, the prefix of each "
        "runtime's name (default harbor)",
    )
    deploy.add_argument("--image", help="container image URI in ECR (arm64)")
    deploy.add_argument("--tasks", help="a folder of Harbor tasks (or a JSONL naming them)")
    deploy.add_argument("--agent", help="with --tasks: the agent the images run (e.g. oracle)")
    deploy.add_argument("--repository", help="with --tasks: the ECR repository URI, no tag")
    deploy.add_argument(
        "--no-build",
        action="store_true",
        help="with --tasks: the images are in ECR already (built and pushed for linux/arm64)",
    )
    deploy.add_argument("--container-engine", choices=["auto", "podman", "docker"], default="auto")
    deploy.add_argument("--role", required=True, help="execution role ARN (stack output RoleArn)")
    deploy.add_argument("--network", choices=["PUBLIC", "VPC"], default="PUBLIC")
    deploy.add_argument("--subnet", action="append", default=[], help="VPC subnet (repeat)")
    deploy.add_argument("--security-group", action="append", default=[], help="VPC SG (repeat)")
    deploy.add_argument("--idle-timeout", type=int, default=IDLE_TIMEOUT_S, help="seconds")
    deploy.add_argument("--max-lifetime", type=int, default=MAX_LIFETIME_S, help="seconds")
    deploy.add_argument("--env", action="append", default=[], help="KEY=VALUE for the agent")
    deploy.add_argument("--gateway-url", help="the policy gateway's /v1 URL agents call")
    deploy.add_argument(
        "--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for READY"
    )
    destroy = sub.add_parser("destroy", help="delete the AgentCore runtime (or a manifest's)")
    destroy.add_argument("--name")
    destroy.add_argument("--missing-ok", action="store_true", help="no runtime is not an error")
    infra = sub.add_parser("infra", help="the provisioned AWS stack")
    infra_sub = infra.add_subparsers(dest="infra_command", required=True)
    env = infra_sub.add_parser("env", help="write agentcore.env from a stack's outputs")
    env.add_argument("--stack", required=True, help="CloudFormation stack name")
    env.add_argument("--out", default="agentcore.env")
    env.add_argument("--runtime-arn", help="wins over the stack's RuntimeArn output")
    deploy.add_argument(
        "--manifest", default="harbor-runtimes.json", help="with --tasks: where it is written"
    )
    destroy.add_argument("--manifest", help="delete every runtime of `deploy --tasks`'s manifest")
    for p in (deploy, destroy, env):
        p.add_argument("--region", help="default: the usual AWS configuration chain")
        p.add_argument("--endpoint-url", help="control-plane endpoint override (tests)")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help=f"YAML config (default: $AGENTCORE_ROLLOUT_CONFIG, else {DEFAULT_CONFIG} if it "
        "exists here, else the built-in defaults of configs/engine.yaml)",
    )
    p.add_argument("--env-file", help="dotenv file (default: agentcore.env, if it exists)")
    p.add_argument(
        "overrides", nargs="*", help="dotted overrides, anywhere, e.g. engine.dispatch.start_rate=5"
    )


def _load(args: argparse.Namespace) -> Config:
    """The config: --config, else $AGENTCORE_ROLLOUT_CONFIG (empty is unset), else the
    command's file in configs/ when run from the repository (as `make run` is), else the
    built-in defaults; then the env file, the flags and the dotted overrides."""
    overrides = list(args.overrides)
    section = "train" if args.command == "train" else "run"
    dotted = {key: f"{section}.{key}" for key in ("data", "n", "out", "steps")}
    dotted["max_staleness"] = "engine.limits.max_staleness"
    for key, name in dotted.items():
        if getattr(args, key, None) is not None:
            overrides.append(f"{name}={getattr(args, key)}")
    if getattr(args, "logger", None):  # YAML's list: `run.loggers=[tensorboard, wandb]`
        names = [n.strip() for arg in args.logger for n in arg.split(",") if n.strip()]
        overrides.append(f"{section}.loggers=[{', '.join(names)}]")
    if getattr(args, "asynchronous", False):  # first, so a dotted stale_policy override wins
        overrides[:0] = ["engine.limits.stale_policy=keep"]
        overrides.append("train.asynchronous=true")
    if args.env_file and not Path(args.env_file).is_file():  # only the default may be absent
        raise UsageError(f"--env-file {args.env_file}: not a file")
    env_file = args.env_file or "agentcore.env"
    default = TRAIN_CONFIG if args.command == "train" else DEFAULT_CONFIG
    path = args.config or os.environ.get("AGENTCORE_ROLLOUT_CONFIG")
    path = path or (str(default) if default.is_file() else None)
    config = load_config(path, env_file=env_file, overrides=overrides)
    unbounded = not config.engine.limits.max_staleness and getattr(args, "max_staleness", 0) is None
    if config.train.asynchronous and unbounded:  # --async's bound, unless one is set
        overrides.append("engine.limits.max_staleness=1")
        config = load_config(path, env_file=env_file, overrides=overrides)
    _export_aws(env_file)
    return config


def _export_aws(env_file: str) -> None:
    """botocore reads AWS_* (credentials, profile, endpoints) from the process environment
    only, so the env file's are put there, for every AWS client the CLI makes, the engine's
    included; a variable already set wins, as it does over the file for the config."""
    try:
        values = dotenv_values(env_file, encoding="utf-8") if Path(env_file).is_file() else {}
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{env_file}: cannot read it: {e}") from None
    for key, value in values.items():
        if key.startswith("AWS_") and value:
            os.environ.setdefault(key, value)
