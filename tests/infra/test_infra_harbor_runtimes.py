"""`deploy --tasks` / `destroy --manifest`: a folder of Harbor tasks, one AgentCore runtime per
distinct environment, on moto's control plane and ECR (over HTTP for the command, in-process
for the update path, as tests/infra/test_infra_runtime.py does).

Images are put into moto's ECR as manifests (no image is built: arm64 cannot be built here
without QEMU); the build step is tested for its refusals, which run nothing."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws
from moto.bedrockagentcorecontrol.models import AgentRuntime

from agentcore_rollout.cli import main
from agentcore_rollout.cli.harbor_deploy import (
    _login,
    _stream,
    build_and_push,
    check_arm64_builder,
    check_limits,
    deploy_environments,
    image_size,
    plan,
)
from agentcore_rollout.cli.infra import RUNTIME_NAME_RE, InfraError, RuntimeSpec
from agentcore_rollout.config import EngineConfig
from agentcore_rollout.harbor.tasks import read_tasks
from agentcore_rollout.local.containers import ContainerEngine
from agentcore_rollout.runtimes.agentcore.published import MAX_IMAGE_BYTES

pytestmark = pytest.mark.component

REGION = "us-east-1"
ACCOUNT = "123456789012"
REPO_NAME = "agentcore-rollout"
REPO = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{REPO_NAME}"
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
FAST = {"timeout_s": 2.0, "poll_s": 0.01}


def _task(root: Path, name: str, dockerfile: str) -> None:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "instruction.md").write_text(f"Do {name}.\n")
    (folder / "task.toml").write_text("[agent]\ntimeout_sec = 60\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    """Four tasks, two environments: a and b on Debian, c and d on Python."""
    root = tmp_path / "tasks"
    for name in ("a", "b"):
        _task(root, name, "FROM debian:bookworm-slim\n")
    for name in ("c", "d"):
        _task(root, name, "FROM python:3.12-slim\nRUN pip install pytest\n")
    return root


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _push(ecr: Any, tag: str, layer_bytes: int) -> None:
    """An image manifest in ECR: a 1 kB config and one layer of `layer_bytes`."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": DOCKER_V2,
        "config": {"mediaType": "x", "size": 1_000, "digest": _digest(f"config {tag}")},
        "layers": [{"mediaType": "y", "size": layer_bytes, "digest": _digest(f"layer {tag}")}],
    }
    ecr.put_image(repositoryName=REPO_NAME, imageManifest=json.dumps(manifest), imageTag=tag)


def _push_all(ecr: Any, tasks_dir: Path, agent: str = "oracle", big: str = "") -> list[Any]:
    """Every environment's image, 300 MB each; the one of task `big` over the limit."""
    envs = plan(read_tasks(tasks_dir), agent, REPO, "harbor")
    for env in envs:
        size = MAX_IMAGE_BYTES + 1 if big in env.task_names else 300_000_000
        _push(ecr, env.image.rsplit(":", 1)[1], size)
    return envs


def _role(iam: Any) -> str:
    trust = {"Version": "2012-10-17", "Statement": []}
    try:
        created = iam.create_role(
            RoleName="acr-runtime", AssumeRolePolicyDocument=json.dumps(trust)
        )
        return str(created["Role"]["Arn"])
    except iam.exceptions.EntityAlreadyExistsException:
        return str(iam.get_role(RoleName="acr-runtime")["Role"]["Arn"])


def _runtimes(control: Any) -> dict[str, str]:
    listed = control.list_agent_runtimes()["agentRuntimes"]
    return {r["agentRuntimeName"]: r["agentRuntimeArn"] for r in listed}


# The command, over HTTP on a moto server.


def _deploy_args(moto: Any, tasks_dir: Path, manifest: Path) -> list[str]:
    return [
        *("deploy", "--tasks", str(tasks_dir), "--agent", "oracle", "--repository", REPO),
        *("--role", _role(moto.client("iam")), "--no-build", "--manifest", str(manifest)),
        *("--gateway-url", "https://gw.example/v1", "--timeout", "20"),
        *("--region", REGION, "--endpoint-url", moto.url),
    ]


def _fresh_repository(moto: Any) -> Any:
    ecr = moto.client("ecr")
    with contextlib.suppress(ecr.exceptions.RepositoryNotFoundException):
        ecr.delete_repository(repositoryName=REPO_NAME, force=True)
    ecr.create_repository(repositoryName=REPO_NAME)
    return ecr


def test_a_task_folder_becomes_one_runtime_per_environment(
    moto: Any, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envs = _push_all(_fresh_repository(moto), tasks_dir)
    manifest = tmp_path / "out" / "harbor-runtimes.json"
    control = moto.client("bedrock-agentcore-control")
    before = _runtimes(control)
    assert main(_deploy_args(moto, tasks_dir, manifest)) == 0, capsys.readouterr().err
    made = {k: v for k, v in _runtimes(control).items() if k not in before}
    assert sorted(made) == sorted(env.runtime for env in envs) and len(made) == 2
    assert all(RUNTIME_NAME_RE.fullmatch(name) for name in made)
    written = json.loads(manifest.read_text())
    served = {task: e["runtime"] for e in written["environments"] for task in e["tasks"]}
    by_env = {env.id: env.runtime for env in envs}
    assert served == {t.name: by_env[t.environment] for t in read_tasks(tasks_dir)}
    assert {e["arn"] for e in written["environments"]} == set(made.values())
    assert all(e["image"] == f"{REPO}:{e['environment']}-oracle" for e in written["environments"])
    snippet = yaml.safe_load(manifest.with_suffix(".yaml").read_text())
    assert yaml.safe_load(capsys.readouterr().out) == snippet
    assert snippet["engine"]["runtimes"] == [
        {"arn": e["arn"], "environment": e["environment"]} for e in written["environments"]
    ]
    # the engine reads it as it is (moto's ARNs are `agent/<uuid>[:version]`, AgentCore's
    # `runtime/<name>-<id>`: put in that shape)
    real = [
        r | {"arn": re.sub(r":agent/([^:]+).*", r":runtime/rt-\1", r["arn"])}
        for r in snippet["engine"]["runtimes"]
    ]
    engine = EngineConfig.model_validate({"runtimes": real})
    assert {t.environment for t in engine.runtimes} == set(by_env)
    # Again: the same runtimes, found by name and left as they are; none made twice.
    assert main(_deploy_args(moto, tasks_dir, manifest)) == 0, capsys.readouterr().err
    assert {k: v for k, v in _runtimes(control).items() if k not in before} == made
    assert (
        main(
            ["destroy", "--manifest", str(manifest), "--region", REGION, "--endpoint-url", moto.url]
        )
        == 0
    )
    assert _runtimes(control) == before


def test_an_image_over_the_limit_is_one_line_and_nothing_is_made(
    moto: Any, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _push_all(_fresh_repository(moto), tasks_dir, big="c")
    control = moto.client("bedrock-agentcore-control")
    before = _runtimes(control)
    manifest = tmp_path / "harbor-runtimes.json"
    assert main(_deploy_args(moto, tasks_dir, manifest)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "over AgentCore's 2 GB image limit" in err and "2.00 GB (tasks c, d)" in err, err
    assert "tasks a" not in err
    assert _runtimes(control) == before and not manifest.exists()


def test_an_image_not_in_ecr_is_named(
    moto: Any, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fresh_repository(moto)  # empty: nothing pushed
    assert main(_deploy_args(moto, tasks_dir, tmp_path / "m.json")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not in ECR" in err and REPO in err, err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["deploy", "--tasks", "t", "--repository", REPO], "needs --agent and --repository"),
        (["deploy", "--tasks", "t", "--agent", "oracle"], "needs --agent and --repository"),
        (["deploy", "--name", "x"], "deploy needs --name and --image, or --tasks"),
        (["destroy"], "destroy needs --name NAME or --manifest FILE"),
        (["destroy", "--name", "x", "--manifest", "m.json"], "(one of them)"),
        (["destroy", "--manifest", "/nonexistent/m.json"], "not a manifest of `deploy --tasks`"),
    ],
)
def test_usage_errors_are_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    role = ["--role", f"arn:aws:iam::{ACCOUNT}:role/r"] if extra[0] == "deploy" else []
    assert main([*extra, *role, "--region", REGION]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_bad_agents_and_tasks_fail_before_any_call(
    tasks_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--repository", REPO, "--role", f"arn:aws:iam::{ACCOUNT}:role/r", "--no-build"]
    nowhere = ["--region", REGION, "--endpoint-url", "http://127.0.0.1:9"]  # never called
    assert main(["deploy", "--tasks", str(tasks_dir), "--agent", "nobody", *base, *nowhere]) == 2
    assert "no Harbor agent 'nobody'" in capsys.readouterr().err
    (tasks_dir / "a" / "instruction.md").unlink()
    assert main(["deploy", "--tasks", str(tasks_dir), "--agent", "nop", *base, *nowhere]) == 2
    assert "a: no instruction.md" in capsys.readouterr().err


# The pieces, in-process.


def test_a_separate_verifiers_environment_is_a_runtime_of_its_own(tasks_dir: Path) -> None:
    """Its image is the wrapper with no agent, built from tests/ (its Dockerfile there)."""
    for name in ("c", "d"):
        task = tasks_dir / name
        task.joinpath("task.toml").write_text(
            'artifacts = ["/app/out"]\n[agent]\ntimeout_sec = 60\n'
            '[verifier]\nenvironment_mode = "separate"\n'
        )
        task.joinpath("tests", "Dockerfile").write_text("FROM python:3.12-slim\n")
    envs = plan(read_tasks(tasks_dir), "codex", REPO, "harbor")
    assert [(env.task_names, env.verifier) for env in envs] == [
        (["a", "b"], False),
        (["c", "d"], False),
        (["c", "d"], True),  # one verifier's runtime for both: the same tests/ folder
    ]
    assert envs[2].image == f"{REPO}:{envs[2].id}-nop"
    assert envs[2].id == read_tasks(tasks_dir)[2].verifier_environment


def test_what_agentcore_cannot_do_of_a_tasks_limits_is_said_or_refused(
    tasks_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A no-network task on a PUBLIC runtime is refused before anything is built or called;
    on VPC it is the subnets' to keep, and a task's cpus and memory are not applied: warned."""
    (tasks_dir / "c" / "task.toml").write_text(
        '[environment]\ncpus = 2\nmemory_mb = 4096\nnetwork_mode = "no-network"\n'
    )
    envs = plan(read_tasks(tasks_dir), "oracle", REPO, "harbor")
    with pytest.raises(InfraError, match="no-network cannot be kept on a PUBLIC runtime"):
        check_limits(envs, "PUBLIC")
    said = check_limits(envs, "VPC")
    assert len(said) == 2 and "no route out" in said[0] and "not applied" in said[1], said
    assert check_limits(plan(read_tasks(tasks_dir)[:2], "oracle", REPO, "harbor"), "PUBLIC") == []
    base = ["--repository", REPO, "--role", f"arn:aws:iam::{ACCOUNT}:role/r", "--no-build"]
    nowhere = ["--region", REGION, "--endpoint-url", "http://127.0.0.1:9"]  # never called
    assert main(["deploy", "--tasks", str(tasks_dir), "--agent", "nop", *base, *nowhere]) == 2
    err = capsys.readouterr().err.strip()
    assert "--network VPC" in err and len(err.splitlines()) == 1, err


def test_plan_names_runtimes_and_images_within_the_apis_bounds(tasks_dir: Path) -> None:
    envs = plan(read_tasks(tasks_dir), "mini-swe-agent", REPO, "p" * 31)
    assert [env.task_names for env in envs] == [["a", "b"], ["c", "d"]]
    assert all(RUNTIME_NAME_RE.fullmatch(env.runtime) for env in envs)
    assert [env.image for env in envs] == [f"{REPO}:{env.id}-mini-swe-agent" for env in envs]
    with pytest.raises(InfraError, match=r"prefix 'p{32}' is over 31 characters"):
        plan(read_tasks(tasks_dir), "nop", REPO, "p" * 32)
    with pytest.raises(InfraError, match="runtime name '9x_"):
        plan(read_tasks(tasks_dir), "nop", REPO, "9x")
    for bad in (f"{REPO}:tag", "docker.io/library/python", "public.ecr.aws/x/y"):
        with pytest.raises(InfraError, match="is not a private ECR repository URI"):
            plan(read_tasks(tasks_dir), "nop", bad, "harbor")


@pytest.fixture
def aws() -> Iterator[dict[str, Any]]:
    with mock_aws():
        clients = {s: boto3.client(s, region_name=REGION) for s in ("ecr", "iam")}
        clients["client"] = boto3.client("bedrock-agentcore-control", region_name=REGION)
        clients["ecr"].create_repository(repositoryName=REPO_NAME)
        yield clients


@pytest.fixture
def updates_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto leaves an updated runtime UPDATING forever; AgentCore moves it to READY."""
    original = AgentRuntime.update

    def update(self: AgentRuntime, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._transitions = [("UPDATING", "READY")]

    monkeypatch.setattr(AgentRuntime, "update", update)


def test_a_changed_deploy_updates_the_runtimes_in_place(
    aws: dict[str, Any], tasks_dir: Path, updates_finish: None
) -> None:
    envs = _push_all(aws["ecr"], tasks_dir)
    role = _role(aws["iam"])
    template = RuntimeSpec(name="", container_uri="", role_arn=role, gateway_url="https://a/v1")
    first, failed = deploy_environments(envs, template, **aws, **FAST)
    assert failed == [] and len(first) == 2
    moved = RuntimeSpec(name="", container_uri="", role_arn=role, gateway_url="https://b/v1")
    again, failed = deploy_environments(envs, moved, **aws, **FAST)
    assert failed == [] and [e["runtime"] for e in again] == [e["runtime"] for e in first]
    listed = aws["client"].list_agent_runtimes()["agentRuntimes"]
    assert len(listed) == 2 and {r["agentRuntimeVersion"] for r in listed} == {"2"}


def test_image_size_reads_the_arm64_image_of_an_index(aws: dict[str, Any]) -> None:
    ecr = aws["ecr"]
    _push(ecr, "arm", 700_000_000)
    arm = ecr.batch_get_image(repositoryName=REPO_NAME, imageIds=[{"imageTag": "arm"}])
    arm_digest = arm["images"][0]["imageId"]["imageDigest"]
    entries = [
        {
            "mediaType": DOCKER_V2,
            "digest": _digest("amd"),
            "size": 1,
            "platform": {"architecture": "amd64", "os": "linux"},
        },
        {
            "mediaType": DOCKER_V2,
            "digest": arm_digest,
            "size": 1,
            "platform": {"architecture": "arm64", "os": "linux"},
        },
    ]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
    ecr.put_image(repositoryName=REPO_NAME, imageManifest=json.dumps(index), imageTag="multi")
    assert image_size(ecr, f"{REPO}:multi") == 700_001_000
    amd_only = {**index, "manifests": entries[:1]}
    ecr.put_image(repositoryName=REPO_NAME, imageManifest=json.dumps(amd_only), imageTag="amd")
    with pytest.raises(InfraError, match="has no linux/arm64 image: AgentCore runs arm64 only"):
        image_size(ecr, f"{REPO}:amd")


def _engine(name: str, path: str) -> ContainerEngine:
    return ContainerEngine(name, path, {"PATH": "/usr/bin:/bin"}, host="", subnet="")


def test_build_refuses_without_an_arm64_builder_and_runs_nothing(
    tasks_dir: Path, tmp_path: Path
) -> None:
    envs = plan(read_tasks(tasks_dir), "oracle", REPO, "harbor")
    engine = _engine("podman", str(tmp_path / "never-run"))  # running it would fail otherwise
    with pytest.raises(InfraError) as caught:  # `object()` as ECR: touching it would fail too
        build_and_push(envs, "oracle", engine, object(), machine="x86_64", binfmt=tmp_path)
    assert str(caught.value).startswith(
        "podman cannot build linux/arm64 images on this x86_64 machine: no arm64 emulation"
    )
    assert "\n" not in str(caught.value)
    (tmp_path / "qemu-aarch64").write_text("disabled\n")
    with pytest.raises(InfraError, match="no arm64 emulation"):
        check_arm64_builder(engine, machine="x86_64", binfmt=tmp_path)
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/bin/qemu-aarch64\n")
    check_arm64_builder(engine, machine="x86_64", binfmt=tmp_path)
    check_arm64_builder(engine, machine="aarch64", binfmt=tmp_path / "none")
    with pytest.raises(InfraError, match="docker buildx is missing"):  # `false buildx version`
        check_arm64_builder(_engine("docker", "/bin/false"), machine="aarch64")


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_the_ecr_password_goes_on_stdin_never_on_the_command_line(
    aws: dict[str, Any], tmp_path: Path
) -> None:
    """`<engine> login --password-stdin`, as `aws ecr get-login-password | docker login` does."""
    seen = tmp_path / "seen"
    engine = _engine(
        "podman", _script(tmp_path / "podman", f'echo "$@" > {seen}.argv; cat > {seen}.stdin')
    )
    token = aws["ecr"].get_authorization_token()["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().partition(":")[2]
    _login(engine, aws["ecr"], f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com")
    assert Path(f"{seen}.stdin").read_text() == password and password
    argv = Path(f"{seen}.argv").read_text()
    assert password not in argv and argv.startswith("login --username AWS --password-stdin ")


def test_a_failed_or_overlong_build_step_is_one_line(tmp_path: Path) -> None:
    engine = _engine(
        "podman", _script(tmp_path / "podman", 'echo step 1; echo "no space left"; exit 3')
    )
    with pytest.raises(InfraError) as caught:
        _stream(engine, engine.argv("build"), "build X", timeout=60)
    assert str(caught.value) == "build X failed: no space left"
    slow = _engine("podman", _script(tmp_path / "slow", "echo started; exec sleep 30"))
    with pytest.raises(InfraError, match=r"build Y failed \(killed after 0\.2s\): started"):
        _stream(slow, slow.argv("build"), "build Y", timeout=0.2)
