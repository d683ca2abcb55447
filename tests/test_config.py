"""Config: YAML, then environment and agentcore.env, then overrides; errors name the key."""

from __future__ import annotations

import pytest

from agentcore_rollout.config import ConfigError, load_config

YAML = """
engine:
  exp_id: "0001"
  bucket: my-bucket
  queue_url: https://sqs.us-east-1.amazonaws.com/123/q
  runtime_arn: arn:aws:bedrock-agentcore:us-east-1:123:runtime/a
  start_rate: 4
"""


@pytest.fixture
def cfg_file(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text(YAML)
    return path


def test_layers_in_order(cfg_file, tmp_path):
    env_file = tmp_path / "agentcore.env"
    env_file.write_text("AGENTCORE_ROLLOUT_START_RATE=7\nAGENTCORE_ROLLOUT_PREFIX=from-file\n")
    environ = {
        "AGENTCORE_ROLLOUT_PREFIX": "from-env",
        "AGENTCORE_ROLLOUT_ENDPOINTS__S3": "http://127.0.0.1:1",
        "AWS_REGION": "us-west-2",
    }
    cfg = load_config(
        cfg_file,
        env_file=env_file,
        environ=environ,
        overrides=["engine.session_start_time=3", "engine.exp_id=0002"],
    ).engine
    assert cfg.start_rate == 7.0  # env file over YAML
    assert cfg.prefix == "from-env"  # process environment over env file
    assert cfg.endpoints.s3 == "http://127.0.0.1:1"
    assert cfg.region == "us-west-2"
    assert cfg.exp_id == "0002"  # overrides last; leading zeros kept
    assert cfg.max_starting == 21  # ceil(7 * 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["engine.start_rate=-1"], "config: engine.start_rate: Input should be greater than 0"),
        (["engine.nonsense=1"], "config: engine.nonsense: Extra inputs are not permitted"),
        (["engine.bucket"], "not of the form key.path=value"),
        (["engine.start_rate.x=1"], "engine.start_rate is not a section"),
        (
            ["engine.max_live_sessions=lots"],
            "engine.max_live_sessions: Input should be a valid integer",
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
