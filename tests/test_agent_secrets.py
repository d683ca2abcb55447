"""Secrets stay out of what agents write. By construction: the rollout function is never
handed the signing key (the SDK signs the result itself), so an agent that echoes all it is
given writes none. And by refusal: a result that holds the signing key or the LLM key anyway
(dug out of the raw request, or the key the context gives), in any case, split across fields,
reversed or wrapped, becomes the agent's own `agent_error` before anything reaches S3.

Through the real wire: moto, the emulator and RolloutEngine, with an LLM key configured as a
deployment without a gateway would (the same key for every request).
"""

from __future__ import annotations

import json
import pickle
import re
import secrets
import time

import pytest

from agentcore_rollout import Outcome, RolloutEngine, RolloutRequest
from agentcore_rollout.agent import RolloutContext
from agentcore_rollout.agent.writer import _leaked
from agentcore_rollout.contract import RolloutControl, result_key

from .agents.basic import LEAKS, controls
from .conftest import engine_config

pytestmark = pytest.mark.component

API_KEY = "sk-live-" + secrets.token_urlsafe(32)
REFUSED = {
    "raw_request": "signing key",  # the whole control block: both keys; the first found names it
    "upper": "signing key",
    "halves": "signing key",
    "eighths": "signing key",
    "reversed": "signing key",
    "wrapped": "signing key",
    "in_a_key": "signing key",
    "in_an_error": "signing key",
    "api_key": "LLM api_key",
}
HONEST = "all_it_is_given"


def _pieces(secret: str, n: int = 12) -> list[str]:
    """Every run of `n` characters of `secret`, forwards and backwards, case-folded: stricter
    than the SDK's 16, so a miss here is no match at a window the SDK does not look at."""
    s = re.sub(r"[\W_]", "", secret).casefold()
    return [form[i : i + n] for form in (s, s[::-1]) for i in range(len(form) - n + 1)]


def _holds(text: str, secret: str) -> bool:
    flat = re.sub(r"[\W_]", "", text).casefold()
    return any(piece in flat for piece in _pieces(secret))


async def test_no_form_of_a_secret_reaches_s3_or_the_outcome(moto, channel, emulator):
    assert set(LEAKS) == set(REFUSED) | {HONEST}
    emu = await emulator()
    hows = [*REFUSED, HONEST]
    reqs = [RolloutRequest({"a": 1, "b": 2}, input_id="plain")]
    reqs += [RolloutRequest({"mode": "leak", "how": how}, input_id=how) for how in hows]
    llm = {"base_url": "http://127.0.0.1:1/v1", "api_key": API_KEY}
    async with RolloutEngine(engine_config(moto, channel, emu, llm=llm)) as engine:
        batch = await engine.rollout(reqs)
    s3 = moto.client("s3")
    for o in batch.outcomes:
        how, rid = o.request.input_id, o.request.request_id
        if how in REFUSED:
            assert o.outcome is Outcome.AGENT_ERROR, (how, o.outcome, o.error)
            assert o.error == (
                f"InvalidOutput: result holds the {REFUSED[how]} (in any case, split or reversed)"
            ), how
            assert o.result is not None and o.result.trajectory is None and o.reward is None
        else:  # an honest agent, even one echoing all it is given, is unaffected
            assert o.outcome is Outcome.OK, (how, o.outcome, o.error)
            assert o.reward == (0.5 if how == HONEST else 0.2)
        stored = s3.get_object(Bucket=channel.bucket, Key=result_key("rollouts", "exp1", 0, rid))
        row = json.dumps(o.to_dict())  # what `run` writes to rollouts.jsonl
        for text in (stored["Body"].read().decode(), row):
            assert not _holds(text, controls[rid].sig_key), how
            assert not _holds(text, API_KEY), how
    honest = next(o for o in batch.outcomes if o.request.input_id == HONEST)
    assert honest.result.trajectory["payload"] == {"mode": "leak", "how": HONEST}
    assert "api_key='***'" in honest.result.trajectory["ctx"]  # the LLM key is given, not shown
    assert batch.stats.invalid_results == {}


def _control(**llm: str) -> RolloutControl:
    return RolloutControl(
        exp_id="exp1",
        step=0,
        request_id="r1",
        input_id="q",
        sample_index=0,
        session_id="s" * 40,
        result={"bucket": "bkt", "key": "rollouts/exp1/00000000/r1.json"},
        llm={"base_url": "http://127.0.0.1:1/v1", **llm} if llm else None,
        deadline=time.time() + 60,
        sig_key=secrets.token_hex(32),
    )


def test_the_rollout_function_is_never_handed_the_signing_key():
    control = _control(api_key=API_KEY)
    ctx = RolloutContext.of(control)
    assert control.sig_key.encode() not in pickle.dumps(ctx)  # anywhere in what it holds
    assert not hasattr(ctx, "control") and not hasattr(ctx, "sig_key")
    assert ctx.llm is not None and ctx.llm.api_key == API_KEY  # the agent needs this one
    assert API_KEY not in repr(ctx)


@pytest.mark.parametrize(
    ("strings", "found"),
    [
        (lambda k: [f"the key is {k.upper()}!"], "signing key"),
        (lambda k: [k[:20], "(elsewhere)", k[44:]], "signing key"),  # a run of 20 in one field
        (lambda k: [f"x{k[3:19]}x"], "signing key"),  # a run of exactly 16, at an odd place
        (lambda k: [k[i : i + 5] for i in range(0, 64, 5)], "signing key"),  # side by side
        (lambda k: [" ".join(k[::-1])], "signing key"),  # reversed, spaced out
        (lambda k: ["EMPTY placeholder", secrets.token_hex(32)], None),  # another run's key
        # runs of 15: allowed. "z" is kept and keeps them apart; "/" would be stripped and join
        # them, and then one run in 16 meets a neighbour that happens to continue the key.
        (lambda k: [k[i : i + 15] + "z" for i in range(0, 64, 16)], None),
    ],
    ids=[
        "upper",
        "two_fields",
        "run_of_16",
        "fine_split",
        "reversed_spaced",
        "honest",
        "runs_of_15",
    ],
)
def test_what_counts_as_holding_a_secret(strings, found):
    control = _control(api_key="EMPTY")  # a placeholder, not a secret
    assert _leaked(strings(control.sig_key), control) == found
