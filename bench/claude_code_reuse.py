"""Prompt-token reuse on Claude Code's turns: the released Claude Code (the Makefile's pin, from
.clients/, `make clients`), on its default model, runs SESSIONS two-turn shell tasks one after
the other, each in a session of its own, from the same HOME and working directory, through one
gateway (the Qwen3-family test renderer on SmolLM2's tokenizer, a scripted worker). Each task
asks for the same file in other words, as a batch of different tasks differs.

Prints JSON (and writes bench/results/claude_code_reuse.json): per turn, how it was rendered
(`full`, `shared`, `incremental`, `fallback`), its prompt tokens and the tokens reused; and the
share of first-turn prompt tokens (sessions after the first) taken from the shared-prefix store,
and of all prompt tokens. Run it before and after a gateway change to compare.

    python bench/claude_code_reuse.py [--smoke]

`--smoke` (CI's): the first two tasks, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _smoke  # noqa: E402
from tests import smollm2  # noqa: E402

# SmolLM2 from the user's model cache, as `make run` left it: converted once, not on every run
# into a cache of its own as the tests convert it (10-15 s).
smollm2.model_dir = functools.partial(smollm2.ready_model, smollm2.NAME)
from tests.test_released_clients import (  # noqa: E402
    COMMAND,
    NPM_BIN,
    Proxy,
    Sandbox,
    claude_env,
    gateway_for,
    qwen3_worker,
)

TASKS = [  # as a batch's tasks differ: in their words, not only in a file name
    "Create the file out.txt containing hi, using the shell.",
    "Using the shell, write the word hi into a new file named out.txt.",
    "Please make out.txt (its content: hi) with a shell command.",
]


async def main(sessions: int) -> dict:
    claude = NPM_BIN / "claude"
    turns: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        async with Proxy() as proxy:
            sandbox = Sandbox(home, work, proxy)
            worker = qwen3_worker("Bash", {"command": COMMAND})
            async with gateway_for(worker) as (gateway, admin, first):
                for n in range(sessions):
                    session = first if n == 0 else await admin.create_session(f"reuse-{n}")
                    env = claude_env(sandbox, gateway, session)
                    task = TASKS[n]
                    argv = [claude, "-p", task, "--dangerously-skip-permissions"]
                    code, _ = await sandbox.run([*argv, "--output-format", "json"], env)
                    trace = await admin.finish_session(session.session_id)
                    for t in trace["turns"]:
                        turns.append(
                            {
                                "session": n,
                                "turn": t["index"],
                                "render": t["render"],
                                "prompt_tokens": t["prompt_tokens"],
                                "reused": t["reused_prompt_tokens"],
                                "ignored": t["ignored"],
                                "exit": code,
                            }
                        )
    firsts = [t for t in turns if t["session"] > 0 and t["turn"] == 0]
    share = sum(t["reused"] for t in firsts) / max(1, sum(t["prompt_tokens"] for t in firsts))
    total = sum(t["reused"] for t in turns) / max(1, sum(t["prompt_tokens"] for t in turns))
    return {
        "claude_code": str(claude),
        "turns": turns,
        "first_turn_reuse": round(share, 3),
        "all_turns_reuse": round(total, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=len(TASKS), choices=range(1, 4))
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, sessions=2)
    if args.smoke and not (NPM_BIN / "claude").exists():
        _smoke.skip(f"no Claude Code at {NPM_BIN / 'claude'} (make clients)")
    result = asyncio.run(main(args.sessions))
    print(json.dumps(result, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "claude_code_reuse.json").write_text(json.dumps(result, indent=1) + "\n")
