"""AgentCore Runtime's published defaults, quotas and prices: the one definition, for the
runtime, the config's defaults, the emulator, the CLI's deploy and the infra parameters. Check
your account's own."""

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"  # the session of an invocation
IDLE_TIMEOUT_S = 900  # idleRuntimeSessionTimeout: an idle session ends after it (60-28,800)
MAX_LIFETIME_S = 28_800  # maxLifetime: any session ends after it, 8 h
SYNC_TIMEOUT_S = 900  # a synchronous invocation's reply, 15 min
MAX_PAYLOAD_BYTES = 100_000_000  # an invocation's payload, 100 MB
# Quotas, each per account and region ("Unless otherwise noted, each quota is Region-specific"),
# all adjustable: AgentCore Developer Guide, "Quotas for Amazon Bedrock AgentCore"
# (https://docs.aws.amazon.com/bedrock-agentcore/latest/devguide/bedrock-agentcore-limits.html)
# and Release notes, August 2026, "Amazon Bedrock AgentCore Runtime: Simplified and increased
# API rate quotas" (https://docs.aws.amazon.com/bedrock-agentcore/latest/devguide/release-notes.html).
# An account's applied values are in Service Quotas (service code `bedrock-agentcore`), which
# the engine reads at start-up (`quotas.py`).
NEW_SESSIONS_PER_SECOND = 25  # one quota shared by every endpoint (was 400/min per endpoint)
DATA_PLANE_TPS = 1_000  # every data-plane call together: invokes, stops (was 200/s per agent)
ACTIVE_SESSIONS = {"us-east-1": 5_000, "us-west-2": 5_000}  # active session workloads
ACTIVE_SESSIONS_ELSEWHERE = 2_500  # in every other region
SERVICE_QUOTAS_CODE = "bedrock-agentcore"
# Not adjustable, same guide, "AgentCore Runtime Service Quotas": "Maximum size for a Docker
# image in an AgentCore Runtime: 2 GB" (it was 1 GB in the 2025 preview). Read as 2 x 10^9
# bytes, the stricter reading, and checked against the image as ECR stores it (compressed
# layers), the size AWS holds; `deploy --tasks` refuses an image over it. (Beside it, not
# checked here: 1,000 agent runtimes per account, 10 endpoints per runtime, both adjustable.)
MAX_IMAGE_BYTES = 2_000_000_000
LIFECYCLE_MIN_S, LIFECYCLE_MAX_S = 60, 1_209_600  # what the API and CloudFormation accept


def active_sessions(region: str) -> int:
    """The published active-session quota of an account in `region`."""
    return ACTIVE_SESSIONS.get(region, ACTIVE_SESSIONS_ELSEWHERE)
