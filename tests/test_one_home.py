"""Each fact has one home: AgentCore's published defaults in `_agentcore`, the wire (signing
keys, the run secret, the result prefix) in `contract`, and a rollout's deadline under one
name. And the engine's core stays small enough to read: no function of `_engine.py` or
`_dispatcher.py` over 40 lines, and the package within its budget (`MAX_LINES`).

Read as text, so a second definition anywhere in the package fails here, with where it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentcore_rollout"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _hits(pattern: str, *, allowed: set[str], paths: list[Path] = SOURCES) -> list[str]:
    found = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize(
    ("what", "pattern", "home"),
    [
        # idle timeout 900 s, max lifetime 28,800 s: named next to idle/lifetime anywhere else
        (
            "AgentCore's session defaults",
            r"(?i)(idle|lifetime).*\b(900|28_?800|8 \* 3600)\b",
            "agentcore_rollout/_agentcore.py",
        ),
        ("the signing-key derivation", r"hmac\.new\(", "agentcore_rollout/contract.py"),
        ("the random run secret", r"token_hex\(", "agentcore_rollout/contract.py"),
        (
            "the result prefix's normal form",
            r"\.strip\(['\"]/['\"]\)",
            "agentcore_rollout/contract.py",
        ),
        (
            "the session-id padding",
            r"SESSION_ID_MIN|\b3[23]\b.*session",
            "agentcore_rollout/contract.py",
        ),
    ],
)
def test_one_definition(what: str, pattern: str, home: str) -> None:
    extra = [ROOT / "infra" / "cdk" / "parameters.py"] if "AgentCore" in what else []
    homes = set(home.split())
    assert _hits(pattern, allowed=homes, paths=SOURCES + extra) == [], f"{what} outside {home}"


def test_one_name_for_the_deadline() -> None:
    """The instant a rollout must end by is `deadline` from the contract to the journal to
    `resume`; the cap a caller sets is `cutoff`."""
    tests = sorted((ROOT / "tests").rglob("*.py"))
    stale_names = r"running_until|StartAttempts|\bcap=|attempts\.deadline"
    assert _hits(stale_names, allowed={"tests/test_one_home.py"}, paths=SOURCES + tests) == []


def test_the_engine_reads_in_short_functions() -> None:
    long = []
    for name in ("_engine.py", "_dispatcher.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > 40:
                    long.append(f"{name}:{node.lineno} {node.name} is {lines} lines")
    assert long == []


# 11,500 before the layout was redrawn (issue 18), which left 11,445; the edge cases of issue 19
# (one run per output folder, whole-line writes, a streamed and checked dataset, the emulator's
# idleness, the SDK's leak check, foreign notifications set aside) added about 430. Issue 20
# (any agent unchanged) added about 1,860: the OpenAI Responses (520) and Anthropic Messages
# (470) dialects, the one turn they share with chat (turns.py, chat.py: 330), each model
# family's tool-call and reasoning syntax (parsers.py: 530). Issue 21 (a real model locally)
# added local/models.py (220: SmolLM2 converted from its GGUF file into a cached model directory
# with a tools template) and local/policy/hf.py with the server's abort (480: a Hugging Face
# causal LM on CPU, continuously batched), `local.policy` (75: the stack's workers serving a
# model dir or known name, the gateway rendering with its template, the worker's --model flag),
# local/hf_grpo.py (170: GRPO on a Hugging Face model, the toy's clipped update in torch) and
# trainer.py's learner chosen by `local.policy` (70), and hf.py's batched sampling and in-place
# KV cache (100); then a one-line error without the [models] extra (20), the reward components
# per training step and plotted (20). Issue 22 (turns survive weight updates) added about 430:
# gateway/resume.py (230: aborted turns continued from their tokens, waits and give-ups
# bounded, stop strings across the seam), per-token weight versions in the trace and training
# rows (90), and the toy policy server's pacing, so its generations are in flight to abort
# (70). veRL's async trainers (issue 22, item 3) added 123: the switch's one-line checks of
# what colocate_async/separate_async assert (53), the engine's staleness from veRL's bound,
# request ids from (uid, session, step) and the first step's S3 look-up (61), and the veRL
# backend's one attempt per call on FullyAsyncLLMServerClient (9). Its items 2 and 4 added
# about 300: the engine's `stale_policy` and oldest-first admission (`OrderedSlots`: 60),
# `within_staleness` and `staleness_report` (130), `train --async` (80) and the toy's positions
# going on in a resumed turn (20). Taking over prompts veRL re-issues after a restart added
# about 190: `RolloutEngine.reclaim` and the buffer's `stored` (70), the gateway's sessions found
# by request id (45), and the veRL service's look-back and run secret kept with the checkpoints
# (75). What each rollout cost (issue 23, item 4) added about 260: `_cost.py` (130), the
# `engine.cost` prices and AgentCore's published ones (50), where a session's cost begins in the
# engine and dispatcher (30), and the run's summary and table (40). Gateway replicas (issue 23,
# item 2) added about 390: `_gateway_replicas.py` (150: the least-loaded pick, a dead replica
# marked down and tried again, `reclaim` asking every replica), the replica journaled and used
# to finish, drop and resume in the engine (30), the stack's N gateway processes (20), and the
# hosted gateway as N Ray actors under veRL (190: `integrations/verl/replicas.py`, the actor,
# start/stop, placement, the port and public-URL checks, and the service's settings). The
# container executor (issue 24) added about 380: `local/containers.py` (the runtime found and
# checked, the image built, its Debian base, orphans removed: 230), `ContainerAgent` (85), the
# emulator's mode, sweeps and the stack's image and host-as-seen URLs (50), `local build` (15).
# Results carried in the agent's own message (issue 23, item 3) added about 175: the buffer's
# inline path, its checks and the bucket notifications held for it (130), the contract's
# `direct_notification` and `inline_max_bytes` (33), the two counters (5) and the fixed
# User-Agent (7). Several runtime endpoints (issue 23, item 1) added about 460: the
# dispatcher's endpoints, chooser and waiters and its per-endpoint outages (265),
# `engine.runtimes` (`RuntimeTarget`, 90), a data-plane client per region and URL (30), the
# endpoint journaled and resumed (20), the emulator's quotas per endpoint and account (50), and
# the local stack's `local.endpoints` (20); then about 80 for the sessions of an endpoint that
# goes down: probes while it is in doubt, and their requests ending once it is declared down
# rather than at their deadlines, and 1 to name the probes' session prefix for the tests that
# record stops. A session taken over still running costs from its journaled start (8: the
# journal's `started_at`, `resume`'s argument). Docker as a container engine (issue 24) added
# about 225: the relay to the host's loopback (96), choosing and setting up the engine with its
# bridge (60), removal and orphans either engine's way (15), a Dockerfile on the substitute base
# (20), the emulator's relay and host URLs (30). A failed rollout's tokens, from the usage its
# dropped gateway session reports (40: the outcome waits for the drop, up to 2 s, and the
# gateway answers with the session's usage, taken only as counts), and none for one that never
# opened a gateway session (4). AgentCore's two calls as signed HTTP requests rather than
# through botocore's call pipeline (issue 23, item 3: ~1 ms of engine CPU per rollout) added
# about 110: `SignedClient` and its aiohttp session (70), and the calls' paths, headers,
# answers and transport errors as botocore has them (40). The engine's own SigV4 signer and
# SQS's three results-path calls signed (issue 23, item 3: botocore's signer was a quarter of
# each signed call, and SQS's calls through botocore the largest share of the engine's CPU)
# added about 220: `_sigv4.py` (110) and `_sqs.py` (100), and their client in `AwsClients`
# (10). moto served by waitress, connections kept alive as AWS keeps them (10), and the agent's
# `ResultWriter` keeping its clients per event loop, since kept-alive connections belong to one
# (13). A description on every config field, the source of the generated reference
# docs/configuration.md, added 78 to config.py. A fresh run's files made only once its stack is
# up, a dataset the run would write refused, and the agent app loaded before anything starts
# (issue 33, item 2) added about 80. The gateway's field policy for real clients (issue 34:
# fields ignored and named, hosted tools dropped, context edits, deferred tools and sealed
# reasoning honoured) added about 200; `train --resume`/`--overwrite` and one line for a dead
# worker (issue 35) about 90, and a child's output drained about 10; `train` ending in one
# line when any child of the stack dies (LocalStack.dead, the trainer's watch) about 30, and
# interrupted requests run again by --resume about 40. Every AWS call through aiobotocore's
# clients (issue 36, item 1) removed about 270 (`_sigv4.py`, `_sqs.py`, `SignedClient`) and
# added 45 to mask credentials in URLs (`_redact.py`); AgentCore's quotas as the account has
# them (issue 36, item 3) added about 420: `_quotas.py` (215: Service Quotas read at start-up,
# the values in force said in one line), the dispatcher's budgets per account and region (40),
# the config's per-account rates and their one-line errors (35), the emulator's per-account
# buckets and its ListServiceQuotas (90), constants and engine wiring (40). Raise it only with
# a reason in the same commit.
MAX_LINES = 19_210


def test_the_package_did_not_grow() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in SOURCES)
    assert lines <= MAX_LINES, f"the package holds {lines} lines of Python"
