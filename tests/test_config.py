"""Config: YAML, then environment and agentcore.env, then overrides; errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import agentcore_rollout
from agentcore_rollout import ConfigError
from agentcore_rollout.cli.config import Config, load_config
from agentcore_rollout.local.stack import LOCAL_RUNTIME_ARN

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/test_agent-abc123"

YAML = """
engine:
  exp_id: "0001"
  bucket: my-bucket
  queue_url: https://sqs.us-east-1.amazonaws.com/123/q
  runtime_arn: arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/test_agent-abc123
  dispatch:
    start_rate: 4
"""


@pytest.fixture
def cfg_file(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(YAML)
    return path


def test_layers_in_order(cfg_file, tmp_path):
    env_file = tmp_path / "agentcore.env"
    env_file.write_text(
        "AGENTCORE_ROLLOUT_DISPATCH__START_RATE=7\nAGENTCORE_ROLLOUT_PREFIX=from-file\n"
    )
    environ = {
        "AGENTCORE_ROLLOUT_PREFIX": "from-env",
        "AGENTCORE_ROLLOUT_SERVICE_URLS__S3": "http://127.0.0.1:1",
        "AWS_REGION": "us-west-2",
    }
    cfg = load_config(
        cfg_file,
        env_file=env_file,
        environ=environ,
        overrides=["engine.dispatch.session_start_time=3", "engine.exp_id=0002"],
    ).engine
    assert cfg.dispatch.start_rate == 7.0  # env file over YAML
    assert cfg.prefix == "from-env"  # process environment over env file
    assert cfg.service_urls.s3 == "http://127.0.0.1:1"
    assert cfg.region == "us-west-2"
    assert cfg.exp_id == "0002"  # overrides last; leading zeros kept
    assert cfg.dispatch.session_start_time == 3.0  # an override


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["engine.dispatch.start_rate=-1"],
            "config: engine.dispatch.start_rate: Input should be greater than 0",
        ),
        (["engine.nonsense=1"], "config: engine.nonsense: Extra inputs are not permitted"),
        (["engine.bucket"], "not of the form key.path=value"),
        (["engine.dispatch.start_rate.x=1"], "engine.dispatch.start_rate is not a section"),
        (
            ["engine.dispatch.max_live_sessions=lots"],
            "engine.dispatch.max_live_sessions: Input should be a valid integer",
        ),
        (
            ["engine.dispatch.start_rate=inf"],
            "engine.dispatch.start_rate: Input should be a finite number",
        ),
        (
            ["engine.limits.rollout_timeout=nan"],
            "engine.limits.rollout_timeout: Input should be a finite number",
        ),
        (["run.min_ok_fraction=-inf"], "run.min_ok_fraction: Input should be a finite number"),
        (["local.cold_start=Infinity"], "local.cold_start: Input should be a finite number"),
        (["run.min_ok_fraction=1.5"], "run.min_ok_fraction: Input should be less than or equal"),
        (
            ["engine.limits.queue_timeout=0"],
            "engine.limits.queue_timeout: Input should be greater than 0",
        ),
        (["engine.run_secret=short"], "engine.run_secret: String should have at least 16"),
        *(
            ([f"{key}={name}"], f"{key}: not a valid S3 bucket name")
            for key in ("engine.bucket", "local.bucket")
            for name in ("hx", "My-Bucket", "-bucket", "bucket-", "a..b", "10.0.0.1", "b" * 64)
        ),
        *(
            (["local.queue=" + name], "local.queue: not a valid SQS queue name")
            for name in ("", "results.fifo", "a b", "q" * 81)
        ),
        *(
            ([f"engine.runtime_arn={arn}"], "engine.runtime_arn: not an AgentCore runtime ARN")
            for arn in (
                "arn",
                "arn:aws:bedrock-agentcore:us-east-1:123:runtime/a",  # account: 12 digits
                "arn:aws:bedrock:us-east-1:123456789012:runtime/a",
                "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/1agent",
                "arn:aws:bedrock-agentcore:us-east-1:123456789012:agent/a",
                f"{RUNTIME_ARN}/extra",
            )
        ),
    ],
)
def test_errors_name_the_key(cfg_file, overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file, env_file=None, environ={}, overrides=overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_required_and_bad_files(tmp_path):
    cfg = load_config(None, env_file=None, environ={}, overrides=["engine.queue_url=q"]).engine
    with pytest.raises(ConfigError, match=r"engine\.bucket is not set .*AGENTCORE_ROLLOUT_BUCKET"):
        cfg.require_targets()
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml", env_file=None, environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, env_file=None, environ={})


def test_well_formed_names_and_new_keys_are_accepted(cfg_file):
    secret = "s" * 16
    cfg = load_config(
        cfg_file,
        env_file=None,
        environ={"AGENTCORE_ROLLOUT_RUN_SECRET": secret},
        overrides=[
            "engine.bucket=my.bucket-1",
            f"local.bucket={'b' * 63}",
            f"local.queue={'Q_-9' * 20}",
            "engine.limits.queue_timeout=30",
            "run.min_ok_fraction=1",
        ],
    )
    assert cfg.engine.bucket == "my.bucket-1" and cfg.local.queue == "Q_-9" * 20
    assert cfg.engine.limits.queue_timeout == 30.0 and cfg.run.min_ok_fraction == 1.0
    assert cfg.engine.run_secret == secret  # from AGENTCORE_ROLLOUT_RUN_SECRET
    assert secret not in repr(cfg) and secret not in str(cfg.engine)  # never printed
    defaults = load_config(None, env_file=None, environ={})
    assert defaults.engine.limits.queue_timeout is None and defaults.engine.run_secret is None
    assert defaults.run.min_ok_fraction == 0.5
    for arn in (
        RUNTIME_ARN,
        LOCAL_RUNTIME_ARN,
        "arn:aws-cn:bedrock-agentcore:cn-north-1:123456789012:runtime/A",
    ):
        overrides = [f"engine.runtime_arn={arn}"]
        assert (
            load_config(None, env_file=None, environ={}, overrides=overrides).engine.runtime_arn
            == arn
        )


def test_bad_files_are_one_line_errors(tmp_path):
    nan = tmp_path / "nan.yaml"
    nan.write_text("engine:\n  dispatch:\n    session_start_time: .nan\n")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"engine:\n  exp_id: caf\xe9\n")
    env_file = tmp_path / "latin1.env"
    env_file.write_bytes(b"AGENTCORE_ROLLOUT_EXP_ID=caf\xe9\n")
    for path, env, message in [
        (tmp_path, None, f"config: cannot read {tmp_path}: Is a directory"),
        (nan, None, "config: engine.dispatch.session_start_time: Input should be a finite number"),
        (latin1, None, f"config: {latin1} is not UTF-8 text (byte 21)"),
        (None, env_file, f"config: {env_file} is not UTF-8 text (byte 28)"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(path, env_file=env, environ={})
        assert str(info.value) == message


def test_empty_environment_variables_are_unset_and_the_env_example_loads():
    environ = {"AGENTCORE_ROLLOUT_BUCKET": "", "AGENTCORE_ROLLOUT_RUNTIME_ARN": ""}
    engine = load_config(None, env_file=None, environ=environ).engine
    assert engine.bucket is None and engine.runtime_arn is None
    example = load_config(None, env_file=ROOT / "agentcore.env.example", environ={})
    assert example.engine.exp_id == "my-experiment" and example.engine.bucket is None


def test_a_trainers_load_config_is_the_engine_section_loaded_the_same_way():
    """`agentcore_rollout.load_config` reads the CLI's file, layers and errors alike, and gives
    the trainer its EngineConfig (the other sections are the CLI's)."""
    sources = {
        "env_file": None,
        "environ": {"AGENTCORE_ROLLOUT_DISPATCH__START_RATE": "7"},
        "overrides": ["engine.exp_id=t", "run.n=3", "local.policy_workers=1"],
    }
    engine = agentcore_rollout.load_config(ROOT / "configs/local.yaml", **sources)
    assert engine == load_config(ROOT / "configs/local.yaml", **sources).engine
    assert (engine.exp_id, engine.dispatch.start_rate) == ("t", 7.0)
    with pytest.raises(ConfigError) as info:
        agentcore_rollout.load_config(None, env_file=None, environ={}, overrides=["engine.x=1"])
    assert str(info.value) == "config: engine.x: Extra inputs are not permitted"


def test_shipped_configs_document_every_key_with_its_default():
    """configs/engine.yaml is the reference: every engine, run, train and harbor key, at its
    default."""
    documented = yaml.safe_load((ROOT / "configs/engine.yaml").read_text())
    for section in ("engine", "run", "train", "harbor"):
        assert set(documented[section]) == set(type(getattr(Config(), section)).model_fields)
    assert load_config(ROOT / "configs/engine.yaml", env_file=None, environ={}) == Config()
    local = yaml.safe_load((ROOT / "configs/local.yaml").read_text())["local"]
    assert set(local) == set(type(Config().local).model_fields)
    shipped = load_config(ROOT / "configs/local.yaml", env_file=None, environ={})
    assert shipped.local == Config().local  # the local section lists the defaults, for reference
