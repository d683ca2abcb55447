"""Gateway pieces without HTTP: trajectory merging, tool-call parsing, rendering (and choosing a
renderer), sampling."""

from __future__ import annotations

import json

import pytest

from agentcore_rollout.gateway import HFRenderer, Trajectory, Turn, load_renderer
from agentcore_rollout.gateway.__main__ import TOKEN_ENV
from agentcore_rollout.gateway.__main__ import main as gateway_main
from agentcore_rollout.gateway.parsers import parse_tool_calls
from agentcore_rollout.gateway.render import normalize_messages
from agentcore_rollout.gateway.sampling import check_sampling, request_sampling, to_sglang
from agentcore_rollout.gateway.sessions import SessionStore
from agentcore_rollout.local.policy import CharRenderer
from agentcore_rollout.local.stack import CHAR_RENDERER

from .gateway_support import TOKENIZER_DIR, hf_renderer

pytestmark = pytest.mark.unit


def turn(index: int, prompt: list[int], out: list[int], finish: str = "stop") -> Turn:
    logprobs = [-(index + 1) / 10 - i / 100 for i in range(len(out))]
    return Turn(index, f"r{index}", prompt, out, logprobs, finish)


# -- trajectory ----------------------------------------------------------------------------------


def test_turns_that_extend_merge_with_observation_tokens_masked() -> None:
    traj = Trajectory()
    traj.add(turn(0, [1, 2], [3, 4]))
    traj.add(turn(1, [1, 2, 3, 4, 5, 6], [7], finish="length"))
    (sample,) = traj.samples
    assert sample.prompt_ids == [1, 2]
    assert sample.response_ids == [3, 4, 5, 6, 7]
    assert sample.loss_mask == [1, 1, 0, 0, 1]
    assert sample.logprobs == [-0.1, -0.11, None, None, -0.2]
    assert sample.turns == [0, 1] and sample.truncated and sample.finish_reason == "length"


def test_a_prompt_that_differs_anywhere_starts_a_new_sample_never_a_splice() -> None:
    traj = Trajectory()
    traj.add(turn(0, [1, 2], [3, 4]))
    traj.add(turn(1, [1, 2, 3, 9, 5], [6]))  # same prefix except one token: no merge
    traj.add(turn(2, [1, 2, 3], [4]))  # shorter than sample 0's sequence: no merge
    assert [s.turns for s in traj.samples] == [[0], [1], [2]]
    assert traj.samples[1].prompt_ids == [1, 2, 3, 9, 5]
    assert [t.sample for t in traj.turns] == [0, 1, 2]


def test_interleaved_conversations_rejoin_their_own_samples_newest_first() -> None:
    traj = Trajectory()
    traj.add(turn(0, [1], [2]))
    traj.add(turn(1, [8], [9]))
    traj.add(turn(2, [1, 2, 3], [4]))  # extends sample 0 although sample 1 is newer
    traj.add(turn(3, [1, 2, 3, 4], [5]))  # extends the extended sample 0
    assert [s.turns for s in traj.samples] == [[0, 2, 3], [1]]


def test_empty_turns_flag_the_sample_they_extend_and_add_nothing() -> None:
    traj = Trajectory()
    traj.add(turn(0, [1], [2]))
    traj.add(turn(1, [1, 2, 3], [], finish="length"))
    traj.add(turn(2, [7], [], finish="length"))
    (sample,) = traj.samples
    assert sample.response_ids == [2] and sample.truncated
    assert [t.sample for t in traj.turns] == [0, 0, None]


def test_pass_through_turns_have_no_samples_and_bad_logprobs_are_refused() -> None:
    traj = Trajectory()
    traj.add(Turn(0, "r", None, None, None, "stop"))
    assert traj.samples == [] and len(traj.turns) == 1
    with pytest.raises(ValueError, match="one log-prob per sampled token"):
        traj.add(Turn(1, "r", [1], [2, 3], [-0.1], "stop"))
    assert json.loads(json.dumps(traj.to_json()))["turns"][0]["sample"] is None


# -- tool-call parsing and rendering -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("just text", "just text", None),
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None, [("f", '{"x": 1}')]),
        (
            'Thinking.\n<tool_call>{"name": "f", "arguments": "{}"}</tool_call>\n'
            '<tool_call>{"name": "g"}</tool_call>',
            "Thinking.",
            [("f", "{}"), ("g", "{}")],
        ),
    ],
)
def test_parse_tool_calls(text: str, content: str | None, calls: list | None) -> None:
    parsed = parse_tool_calls(text)
    assert not parsed.ill_formed
    assert parsed.message["content"] == content
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls]
    assert got == (calls or [])
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in parsed.tool_calls)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{oops}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "string 'name'"),
        ('<tool_call>{"name": "f"}', "unterminated"),
        ('<tool_call>{"name": "f"}</tool_call><tool_call>{"name"', "unterminated"),
    ],
)
def test_ill_formed_tool_calls_are_flagged_not_raised(text: str, error: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.ill_formed and error in (parsed.error or "")
    assert parsed.message == {"role": "assistant", "content": text}


def test_hf_render_parse_render_is_the_identity_for_canonical_tool_calls() -> None:
    r = hf_renderer()
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    head = [{"role": "user", "content": "2 + 3?"}]
    sampled = 'Sure.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    ids = [*r.tokenizer.encode(sampled, add_special_tokens=False), r.tokenizer.eos_token_id]
    parsed = r.parse(ids, tools_enabled=True)
    assert parsed.message["content"] == "Sure." and len(parsed.tool_calls) == 1
    prompt = r.render(head, tools)
    follow = r.render([*head, parsed.message, {"role": "tool", "content": "5"}], tools)
    assert follow[: len(prompt) + len(ids)] == prompt + ids
    assert r.parse(ids, tools_enabled=False).message["content"] == sampled  # no tools: text


def test_char_renderer_matches_the_policy_servers_own_template_and_lists_tools() -> None:
    r = CharRenderer()
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is 1 + 1?"}]}]
    assert r.render(messages, None) == r.tokenizer.apply_chat_template(normalize_messages(messages))
    with_tools = r.tokenizer.decode(r.render(messages, [{"function": {"name": "add"}}]))
    assert with_tools.startswith('<|im_start|>system\n# Tools\n<tools>\n{"function": {"name"')
    assert r.parse([r.tokenizer.encode("2")[0], 3], tools_enabled=False).message["content"] == "2"


@pytest.mark.parametrize(
    "messages",
    [[], "hi", [{"content": "no role"}], [{"role": "user", "content": 5}]],
)
def test_malformed_messages_are_value_errors(messages: object) -> None:
    with pytest.raises(ValueError, match="messages"):
        normalize_messages(messages)


def test_a_renderer_is_a_tokenizer_directory_or_a_module_attribute_spec() -> None:
    assert isinstance(load_renderer(str(TOKENIZER_DIR)), HFRenderer)
    assert isinstance(load_renderer(CHAR_RENDERER), CharRenderer)  # what the local stack passes


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("char", "'char' is neither a tokenizer directory nor module:attribute"),
        ("agentcore_rollout.nope:R", "cannot import agentcore_rollout.nope:R: No module named"),
        ("json:Nope", "cannot import json:Nope: module 'json' has no attribute 'Nope'"),
        ("json:loads", "json:loads() failed: TypeError: "),
        ("json:JSONDecoder", "json:JSONDecoder() returned a JSONDecoder, not a Renderer"),
        (str(TOKENIZER_DIR.parent), f"no tokenizer with a chat template in {TOKENIZER_DIR.parent}"),
    ],
)
def test_a_bad_renderer_spec_is_a_one_line_usage_error(
    spec: str, error: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError) as exc:
        load_renderer(spec)
    assert str(exc.value).startswith(error) and "\n" not in str(exc.value)
    monkeypatch.setenv(TOKEN_ENV, "t" * 32)
    with pytest.raises(SystemExit) as exit_:
        gateway_main(["--backend-url", "http://127.0.0.1:9", "--renderer", spec])
    assert exit_.value.code == 2
    *_, last = capsys.readouterr().err.strip().splitlines()
    assert last == f"python -m agentcore_rollout.gateway: error: --renderer: {exc.value}"


# -- sampling ------------------------------------------------------------------------------------


def test_sampling_defaults_requests_and_sglang_names() -> None:
    defaults = check_sampling({"temperature": 1.0, "max_completion_tokens": 64, "top_k": 20})
    assert defaults == {"temperature": 1.0, "max_tokens": 64, "top_k": 20}
    merged = request_sampling({"temperature": 0.5, "stop": "\n", "seed": 3, "model": "x"}, defaults)
    assert merged == {"temperature": 0.5, "max_tokens": 64, "top_k": 20, "stop": "\n", "seed": 3}
    assert to_sglang(merged, (3,)) == {
        "temperature": 0.5,
        "max_new_tokens": 64,
        "top_k": 20,
        "stop": ["\n"],
        "sampling_seed": 3,
        "stop_token_ids": [3],
    }
    for bad in ({"temperature": "hot"}, {"top_k": 1.5}, {"stop": [1]}, {"beam": 2}):
        with pytest.raises(ValueError):
            check_sampling(bad)
    with pytest.raises(ValueError, match="n must be 1"):
        request_sampling({"n": 2}, {})


# -- JSON ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
def test_fastjson_is_the_same_with_or_without_orjson(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentcore_rollout.gateway import _fastjson

    if not fast:  # a core + [local] install, where the gateway runs without orjson
        monkeypatch.setattr(_fastjson, "orjson", None)
    data = {"input_ids": [1, 2, 3], "text": "é", "logprob": -0.5, "none": None}
    raw = _fastjson.dumps(data)
    assert raw == json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    assert _fastjson.loads(raw) == data == _fastjson.loads(raw.decode())
    with pytest.raises(ValueError):
        _fastjson.loads(b"{not json")
    # The same with or without orjson: floats JSON cannot hold are written null, never read.
    nan = {"logprobs": [float("nan"), -1.5, float("inf")], "k": (float("-inf"),)}
    assert _fastjson.dumps(nan) == b'{"logprobs":[null,-1.5,null],"k":[null]}'
    for literal in (b"[NaN]", b'{"a": Infinity}', b"-Infinity"):
        with pytest.raises(ValueError):
            _fastjson.loads(literal)


def test_a_session_is_found_by_its_request_id_the_newest_while_it_lives() -> None:
    store = SessionStore(ttl=None)
    old, _ = store.create("req-1")
    new, _ = store.create("req-1")  # the same request opened again: the newest is the one
    assert store.by_request("req-1") is new
    store.remove(old.id, reason="dropped")
    assert store.by_request("req-1") is new  # removing the older one keeps the newer
    store.remove(new.id, reason="finished")
    assert store.by_request("req-1") is None and store.by_request("req-2") is None
