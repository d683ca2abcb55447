"""`agentcore-rollout view` in a real headless browser (Debian's Chromium, driven by
Playwright): a page built from a real run, the CLI's, on the embedded stack with the toy policy
behind the gateway, one of whose rows fails and one of whose questions holds a script. The
screenshot is saved in the test's folder and its path printed (`pytest -s` shows it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).parents[1]
# No network, no GPU, nothing in the background: the page must work from its file alone.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ATTACK = "What is 2 + 3? <script>window.pwned = 1</script><img src=x onerror='window.pwned=2'>"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (make browser)"),
]


@pytest.fixture(scope="module")
def run_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's output: 3 questions x 2 samples, one question's answer not a number (the
    math agent raises: agent_error)."""
    tmp = tmp_path_factory.mktemp("view")
    rows = [
        {"id": "add", "question": ATTACK, "answer": 5},
        {"id": "sub", "question": "What is 9 - 4?", "answer": 5},
        {"id": "broken", "question": "What is 1 + 1?", "answer": "two"},
    ]
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "out"
    argv = ["run", "--data", str(data), "--n", "2", "--out", str(out), "run.min_ok_fraction=0"]
    argv += ["local.mode=in_process", "local.policy_workers=1"]
    proc = subprocess.run(
        [sys.executable, "-m", "agentcore_rollout.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_the_page_of_a_real_run_in_chromium(run_out: Path, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install '.[browser]'")
    proc = subprocess.run(
        [sys.executable, "-m", "agentcore_rollout.cli", "view", str(run_out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and proc.stderr.startswith("wrote "), proc.stderr
    summary = json.loads((run_out / "summary.json").read_text())
    assert summary["outcomes"]["agent_error"] == 2 and summary["outcomes"]["ok"] == 4
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            _check_page(page, run_out / "view.html", summary, tmp_path / "view.png")
        finally:
            browser.close()


def test_a_harbor_rollouts_tool_calls_reasoning_and_verifier_output(tmp_path: Path) -> None:
    """The wrapper's result as Harbor runs write it (trajectory: the agent's messages with a
    tool call and its result, and the verifier's output), no trace: all of it on the page."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install '.[browser]'")
    from agentcore_rollout.cli.view import build_view

    messages = [
        {"role": "user", "content": "Make hello.py print hello"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should look at the file first.",
            "tool_calls": [
                {"id": "call_1", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "hello.py"},
    ]
    trajectory = {
        "messages": messages,
        "verifier_output": "1 failed: test_hello",
        "verifier_exit": 1,
    }
    row = {"request_id": "h1", "input_id": "make-runnable", "sample_index": 0, "step": 0}
    row |= {"outcome": "ok", "reward": 0.0, "latency": 3.0, "cost": {"usd": 0.0}}
    row["result"] = {
        "status": "ok",
        "stop_reason": "done",
        "rewards": 0.0,
        "trajectory": trajectory,
    }
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rollouts.jsonl").write_text(json.dumps(row) + "\n")
    html = build_view(tmp_path / "out").path
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(html.as_uri())
            page.click("#list .row >> nth=0")
            page.wait_for_selector("#detail .msg")
            detail = page.text_content("#detail")
            assert page.text_content("#detail .reasoning") == "I should look at the file first."
            assert page.text_content("#detail pre.tool") == 'call bash [call_1]({"cmd": "ls"})'
            assert "tool (result of call_1)" in detail and "hello.py" in detail
            assert "verifier output" in detail and "1 failed: test_hello" in detail
            assert "no token trace" in detail and not errors, errors
        finally:
            browser.close()


def _check_page(page, html: Path, summary: dict, screenshot: Path) -> None:
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: m.type in ("error", "warning") and problems.append(m.text))
    page.on("request", lambda r: r.url.startswith("file:") or problems.append(f"fetch {r.url}"))
    page.goto(html.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    # the counts are summary.json's
    assert page.text_content("#count-rollouts b") == str(summary["requests"])
    assert page.text_content("#count-ok b") == str(summary["outcomes"]["ok"])
    assert page.text_content("#count-agent_error b") == str(summary["outcomes"]["agent_error"])
    assert page.text_content("#count-groups b") == "3"
    assert page.locator("#list .row").count() == summary["requests"]
    # the outcome filter: failures only, each with its reason
    page.select_option("#f-outcome", "!ok")
    assert page.text_content("#shown") == f"2 of {summary['requests']} rollouts shown"
    errors = page.locator("#list .row .error").all_text_contents()
    assert len(errors) == 2 and all("two" in e for e in errors), errors
    page.select_option("#f-outcome", "")
    # groups side by side: each member's reward and advantage
    page.click("#tab-groups")
    assert page.locator("#list .row.group").count() == 3
    assert page.locator(".member").count() == summary["requests"]
    assert page.locator(".member.fail").count() == 2
    # a rollout of the question holding a script: its turns as text, its token trace
    page.fill("#f-text", "add")
    page.click(".member >> nth=0")
    page.wait_for_selector("#detail .tokens")
    user = page.locator("#detail .msg", has_text="What is 2 + 3?").first
    assert user.locator("pre").text_content() == ATTACK
    assert page.evaluate("window.pwned") is None
    assert page.locator("#detail .msg .role", has_text="assistant").count() >= 1
    trained = page.locator("#detail .tokens .tok.t")
    assert trained.count() > 0 and page.locator("#detail .tokens .tok.p").count() > 0
    hover = trained.first.get_attribute("title")
    assert "log-prob -" in hover and "trained" in hover and "weight version" in hover, hover
    page.screenshot(path=str(screenshot))
    print(f"\nscreenshot: {screenshot}")
    assert not problems, problems
