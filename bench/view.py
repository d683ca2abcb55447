"""`agentcore-rollout view` on a run of 10,000 rollouts: is the page still quick?

Makes 10,000 synthetic rollouts shaped like the gateway's (groups of 8, 3 to 8 turns with tool
calls and results, one token trace of 1,000 to 2,000 tokens each with its loss mask, full-
precision log-probs and weight versions; 5% failures), builds the page, and opens it in
headless Chromium (Debian's, through Playwright: `make browser`): the time to load it (until
its script has drawn the list), to open the first rollout and the last one (its chunk inflated
and its turns and ~1.5k token spans drawn), and how many list rows are in the DOM. Prints JSON;
writes bench/results/view.json and view.png.

    python bench/view.py [--rollouts 10000] [--smoke]

`--smoke` (CI's): 200 rollouts, into out/bench-smoke/.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcore_rollout.cli.view import build_view  # noqa: E402
from bench import _smoke  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
FLAGS += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
GROUP = 8


def synthetic(i: int, rng: random.Random) -> dict:
    """One rollout line as `run` writes it, with the gateway's trace."""
    turns = rng.randint(3, 8)
    failed = rng.random() < 0.05
    messages = [{"role": "system", "content": "You are a coding agent. " * 20}]
    messages.append({"role": "user", "content": f"Fix issue {i // GROUP}: " + "details " * 60})
    for t in range(turns):
        call = {"id": f"call_{t}", "type": "function"}
        call["function"] = {"name": "bash", "arguments": json.dumps({"cmd": f"pytest -k t{t}"})}
        thought = "Let me look at the failing test. " * rng.randint(2, 8)
        messages.append(
            {"role": "assistant", "content": "", "reasoning_content": thought, "tool_calls": [call]}
        )
        out = "collected 12 items\n" + "F" * rng.randint(1, 12) + "\n" + "trace line\n" * 10
        messages.append({"role": "tool", "tool_call_id": f"call_{t}", "content": out})
    prompt, response = rng.randint(250, 400), rng.randint(1000, 1600)
    mask = [1 if (k // 150) % 2 == 0 else 0 for k in range(response)]  # turns / tool results
    sample = {
        "index": 0,
        "turns": list(range(turns)),
        "prompt_ids": [rng.randrange(49152) for _ in range(prompt)],
        "response_ids": [rng.randrange(49152) for _ in range(response)],
        "loss_mask": mask,
        "logprobs": [-rng.expovariate(1.5) for _ in range(response)],
        "num_sampled": sum(mask),
        "finish_reason": "stop",
        "version_runs": [["3", response // 2], ["4", response - response // 2]],
        "min_weight_version": "3",
        "max_weight_version": "4",
    }
    reward = None if failed else float(rng.random() < 0.4)
    result = {
        "status": "error" if failed else "ok",
        "stop_reason": "error" if failed else "done",
        "rewards": {"components": {"tests": reward or 0.0}, "scalar": "tests"},
        "trajectory": {"messages": messages},
        "metrics": {"turns": float(turns)},
        "timings": {"received": 0.0, "started": 0.1, "finished": 30.0},
    }
    return {
        "request_id": f"{i:032x}",
        "input_id": f"task-{i // GROUP:05d}",
        "sample_index": i % GROUP,
        "step": 0,
        "weight_versions": ["3", "4"],
        "outcome": "agent_error" if failed else "ok",
        "reward": reward,
        "error": "agent raised RuntimeError: sandbox out of disk" if failed else None,
        "latency": rng.uniform(20, 120),
        "cost": {"usd": rng.uniform(0.001, 0.01), "prompt_tokens": prompt, "completion_tokens": 0},
        "result": result,
        "trace": {"num_turns": turns, "samples": [sample]},
    }


def write_run(out: Path, n: int) -> int:
    rng = random.Random(0)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "rollouts.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps(synthetic(i, rng)) + "\n")
    return (out / "rollouts.jsonl").stat().st_size


def in_browser(html: Path, n: int) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        began = time.perf_counter()
        page.goto(html.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=120_000)
        load = time.perf_counter() - began
        rows_in_dom = page.locator("#list .row").count()
        first = _open(page, 0)
        page.evaluate("document.getElementById('list').scrollTop = 1e9")
        page.wait_for_selector(f"#list .row[data-i='{n - 1}']")
        last = _open(page, n - 1)
        heap = page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : null")
        browser.close()
    return {
        "load_s": round(load, 3),
        "open_first_s": round(first, 3),
        "open_last_s": round(last, 3),
        "list_rows_in_dom": rows_in_dom,
        "js_heap_mb": round(heap / 1e6, 1) if heap else None,
        "page_errors": errors,
    }


def _open(page, i: int) -> float:
    began = time.perf_counter()
    page.click(f"#list .row[data-i='{i}']")
    page.wait_for_function(
        f"document.querySelector('#detail h2')?.textContent.startsWith('#{i} ')"
        " && document.querySelector('#detail .tokens')"
    )
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=_smoke.RESULTS)
    args = _smoke.parse(parser, rollouts=200)
    if args.smoke and importlib.util.find_spec("playwright") is None:
        _smoke.skip("Playwright is not installed (make browser)")
    if args.smoke and not Path(CHROMIUM).exists():
        _smoke.skip(f"no Chromium at {CHROMIUM} (make browser)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        jsonl = write_run(out, args.rollouts)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        began = time.perf_counter()
        stats = build_view(out)
        build = time.perf_counter() - began
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        size = stats.path.stat().st_size
        browser = in_browser(stats.path, args.rollouts)
    result = {
        "rollouts": args.rollouts,
        "rollouts_jsonl_mb": round(jsonl / 1e6, 1),
        "page_mb": round(size / 1e6, 1),
        "chunks": stats.chunks,
        "build_s": round(build, 2),
        "build_peak_rss_growth_mb": round(rss_after - rss_before, 1),
        **browser,
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "view.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(result, args.out / "view.png")
    if result["page_errors"]:
        raise SystemExit(f"the page raised: {result['page_errors']}")


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["build (Python)", "load page", "open first", "open last"]
    keys = ["build_s", "load_s", "open_first_s", "open_last_s"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.barh(names[::-1], [result[k] for k in keys[::-1]], color="#0969da")
    ax.bar_label(bars, fmt="%.2f s", padding=3)
    ax.set_xlabel("seconds")
    ax.set_title(
        f"view: {result['rollouts']:,} rollouts, rollouts.jsonl {result['rollouts_jsonl_mb']} MB"
        f" -> page {result['page_mb']} MB",
        fontsize=10,
    )
    ax.margins(x=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
