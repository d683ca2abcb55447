"""`agentcore-rollout view`'s builder, without a browser: what the page embeds (the index, the
compressed chunks), how it treats an agent's text and lines that are not rollouts, and its
errors. tests/test_view_browser.py opens the page in Chromium."""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from agentcore_rollout.cli import main
from agentcore_rollout.cli.view import CHUNK, build_view
from agentcore_rollout.training import grpo_advantages

pytestmark = pytest.mark.unit


def _row(i: int, *, group: str = "g", outcome: str = "ok", reward: float | None = 1.0, **kw):
    content = kw.pop("content", f"answer {i}")
    return {
        "request_id": f"r{i}",
        "input_id": group,
        "sample_index": i,
        "step": 0,
        "outcome": outcome,
        "reward": reward,
        "error": None if outcome == "ok" else "agent raised ValueError: bad answer\nTraceback...",
        "latency": 1.5,
        "cost": {"usd": 0.001},
        "result": {
            "stop_reason": "solved",
            "trajectory": {"messages": [{"role": "assistant", "content": content}]},
        },
        "trace": {
            "num_turns": 1,
            "samples": [
                {
                    "index": 0,
                    "prompt_ids": [1, 2],
                    "response_ids": [3, 4],
                    "loss_mask": [1, 0],
                    "logprobs": [-0.5, -1.0],
                    "version_runs": [["0", 2]],
                }
            ],
        },
        **kw,
    }


def _write(out: Path, rows: list, extra: str = "") -> Path:
    out.mkdir(exist_ok=True)
    lines = [json.dumps(r) for r in rows]
    (out / "rollouts.jsonl").write_text("\n".join(lines) + "\n" + extra)
    return out


def _embedded(page: str) -> tuple[dict, list[list[dict]]]:
    """The page's index and its chunks, decoded as the browser decodes them."""
    index = re.search(r'<script type="application/json" id="index">(.*?)</script>', page)
    assert index is not None
    chunks = re.findall(r'<script type="text/plain" id="chunk-(\d+)">(.*?)</script>', page)
    assert [int(n) for n, _ in chunks] == list(range(len(chunks)))
    decoded = [gzip.decompress(base64.b64decode(body)).decode().split("\n") for _, body in chunks]
    return json.loads(index.group(1)), [[json.loads(line) for line in c] for c in decoded]


def test_each_rollout_is_in_its_chunk_and_the_index_has_its_group_advantage(tmp_path):
    rewards = [float(i % 3) for i in range(CHUNK + 5)]
    rows = [_row(i, group=f"g{i // 5}", reward=r) for i, r in enumerate(rewards)]
    rows[7] = _row(7, group="g1", outcome="agent_error", reward=None)
    stats = build_view(_write(tmp_path / "out", rows))
    assert stats.path == tmp_path / "out" / "view.html"
    assert (stats.rollouts, stats.chunks, stats.skipped) == (CHUNK + 5, 2, [])
    data, chunks = _embedded(stats.path.read_text())
    assert [len(c) for c in chunks] == [CHUNK, 5]
    assert chunks[1][4] == rows[CHUNK + 4]  # the whole line, as written
    index = data["index"]
    assert [r["i"] for r in index] == list(range(CHUNK + 5)) and data["chunk"] == CHUNK
    group1 = [rec for rec in index if rec["g"] == "g1"]
    ok = [rec for rec in group1 if rec["o"] == "ok"]
    expected = grpo_advantages([rec["r"] for rec in ok])
    assert [rec["a"] for rec in ok] == pytest.approx(expected, abs=1e-4)
    failed = index[7]
    assert failed["a"] is None and failed["e"] == "agent raised ValueError: bad answer"
    assert (failed["o"], failed["t"], failed["c"]) == ("agent_error", 1, 0.001)


def test_an_agents_text_cannot_become_html(tmp_path):
    attack = "</script><script>window.pwned=1</script><img src=x onerror=alert(1)>"
    rows = [_row(0, group=attack, content=attack)]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text(json.dumps({"note": attack}))
    page = build_view(_write(tmp_path / "out", rows)).path.read_text()
    assert "window.pwned" in page  # it is there, as data
    assert "<script>window.pwned" not in page and "<img src=x" not in page
    data, chunks = _embedded(page)
    assert data["index"][0]["g"] == attack and data["summary"]["note"] == attack
    assert chunks[0][0]["result"]["trajectory"]["messages"][0]["content"] == attack
    template = (Path(__file__).parents[1] / "agentcore_rollout/cli/view.html").read_text()
    assert "innerHTML" not in template and "insertAdjacentHTML" not in template


def test_lines_that_are_not_rollouts_are_named_and_skipped(tmp_path, capsys):
    out = _write(tmp_path / "out", [_row(0), _row(1)], extra='[1, 2]\n{"request_id": "cut sh')
    assert main(["view", str(out), "--html", str(tmp_path / "page.html")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "warning: rollouts.jsonl line 3: not a rollout; skipped"
    assert err[1].startswith("warning: rollouts.jsonl line 4: not JSON (")
    assert err[2].startswith(f"wrote {tmp_path / 'page.html'} (2 rollouts, ")
    data, _ = _embedded((tmp_path / "page.html").read_text())
    assert len(data["index"]) == 2 and len(data["skipped"]) == 2
    assert not (out / "view.html").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing"], "error: view: {tmp}/missing: no rollouts.jsonl there"),
        (["out", "--tokenizer", "nowhere"], "error: view: --tokenizer nowhere: no tokenizer.json"),
        (["out", "--tokenizer", "out/rollouts.jsonl"], "error: view: --tokenizer out/rollouts"),
        (["out", "--html", "no/such/dir/page.html"], "error: view: [Errno 2] No such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "out", [_row(0)])
    args = [str(tmp_path / a) if a in ("missing", "out") else a for a in args]
    assert main(["view", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message.format(tmp=tmp_path)), err
    assert not list(tmp_path.rglob("*.tmp"))


def _tokenizer(folder: Path) -> None:
    """A word-level tokenizer.json in `folder`: ids 1-4 are `sys what five <end>`."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "sys": 1, "what": 2, "five": 3, "<end>": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))


def test_token_text_comes_from_the_tokenizer_when_given(tmp_path):
    _tokenizer(tmp_path / "tok")
    page = build_view(_write(tmp_path / "out", [_row(0)]), tokenizer=str(tmp_path / "tok"))
    data, _ = _embedded(page.path.read_text())
    assert data["vocab"] == {"1": "sys", "2": "what", "3": "five", "4": "<end>"}
    plain, _ = _embedded(build_view(tmp_path / "out").path.read_text())
    assert plain["vocab"] == {}  # ids only


def test_token_text_comes_from_the_runs_own_tokenizer_when_it_is_on_this_machine(tmp_path):
    _tokenizer(tmp_path / "tok")
    row = _row(0)
    row["trace"]["renderer"] = f"hf:{tmp_path / 'tok'}"  # the gateway's HFRenderer, by folder
    data, _ = _embedded(build_view(_write(tmp_path / "out", [row])).path.read_text())
    assert data["vocab"]["3"] == "five"
    row["trace"]["renderer"] = f"hf:{tmp_path / 'elsewhere'}"  # rendered on another machine
    data, _ = _embedded(build_view(_write(tmp_path / "out", [row])).path.read_text())
    assert data["vocab"] == {}


def test_a_nan_in_a_line_is_null_on_the_page_json_parse_would_refuse_it(tmp_path):
    out = _write(tmp_path / "out", [], extra=json.dumps(_row(0, latency=math.nan)) + "\n")
    page = build_view(out).path.read_text()
    data, chunks = _embedded(page)
    assert "NaN" not in page and data["index"][0]["l"] is None
    assert chunks[0][0]["latency"] is None
