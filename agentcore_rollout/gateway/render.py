"""Rendering: OpenAI messages + tools -> prompt token ids, and sampled ids -> assistant message.

The gateway owns tokenization so the trainer gets the exact ids the policy was conditioned on and
sampled: backends are driven with ids, never text. `parse` never raises on model output (a
botched call is content flagged `ill_formed`, a training signal, never a 500). `HFRenderer` loads
local files only, never the hub.

Incremental rendering re-renders the template to text but encodes only what follows a *cut* of
an earlier render, and gives a full render's ids by two checks: the new text equals the earlier
one up to the cut, and an anchor (an added token such as `<|im_start|>` that the tokenizer splits
out before normalizing or merging) starts there in both, so the ids of the two halves are
independent. Sampled ids are never spliced in: the trajectory's prefix test decides the merge."""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .parsers import HERMES, Family, Parsed, detect_family, family
from .prefixes import SharedPrefixes

log = logging.getLogger(__name__)

Message = dict[str, Any]
Messages = Sequence[Mapping[str, Any]]  # OpenAI chat messages, as an agent sends them
Tools = Sequence[Mapping[str, Any]] | None  # OpenAI tool definitions


@runtime_checkable
class Renderer(Protocol):
    """What the gateway needs from a model's tokenizer and chat template."""

    name: str
    stop_token_ids: tuple[int, ...]  # end-of-turn ids, passed to the backend as stop_token_ids

    def render(self, messages: Messages, tools: Tools) -> list[int]:
        """Prompt ids for `messages` (and `tools`), ending with the assistant generation prompt.
        Raises ValueError for malformed messages (the agent's fault: HTTP 400)."""
        ...

    def parse(self, output_ids: Sequence[int], *, tools_enabled: bool) -> Parsed:
        """The assistant message for sampled `output_ids` (a trailing stop token is dropped)."""
        ...

    def token_text(self, token_id: int) -> str:
        """The text of one token (for OpenAI-style `logprobs` in responses)."""
        ...


@dataclass(frozen=True, slots=True)
class RenderState:
    """What a render leaves for the next turns of its conversation: its text, its ids, and its
    cuts, `(offset, n)` where an anchor starts at `text[offset]` and `ids[:n]` encode exactly
    `text[:offset]`, in increasing order (the last anchors of the part it encoded)."""

    text: str
    ids: list[int]
    cuts: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt from `render_from`: its ids (equal to `render`'s), how many of them were reused
    (0: fully encoded), the earlier state they were reused from, the state to pass to the
    next turn (None when the text has no anchor), and whether that earlier state came from the
    shared store (a full encode kept for every session) rather than the session's own states."""

    ids: list[int]
    reused: int
    base: RenderState | None
    state: RenderState | None
    shared: bool = False


@runtime_checkable
class IncrementalRenderer(Renderer, Protocol):
    """A renderer that can reuse the tokens of earlier renders of the same session."""

    def render_from(
        self,
        messages: Messages,
        tools: Tools,
        earlier: Sequence[RenderState],
        shared: SharedPrefixes[RenderState] | None = None,
    ) -> Rendered:
        """`render(messages, tools)`, token for token, reusing as many ids as one of the
        `earlier` renders of the session allows, else one of `shared`'s (which a full encode
        joins). Raises as `render` does."""
        ...


# -- shared helpers -----------------------------------------------------------------------------


def normalize_messages(messages: Any) -> list[Message]:
    """Validate OpenAI chat messages and flatten list-of-parts content to a string, so every
    template sees the same simple shape. Raises ValueError naming the first bad message.
    Messages that need no change are passed through, not copied (this runs on every turn over
    the whole conversation); templates only read them."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out: list[Message] = []
    for i, message in enumerate(messages):
        plain = type(message) is dict  # JSON's objects: skips the slower ABC checks
        if not (plain or isinstance(message, Mapping)) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        norm = message if plain else dict(message)
        content = message.get("content")
        if isinstance(content, list):
            norm = {**message, "content": _text_of_parts(content, i)}
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, null or a list of parts")
        calls = message.get("tool_calls")
        if calls is not None and (
            not isinstance(calls, list)
            or not all(
                isinstance(c, Mapping) and isinstance(c.get("function"), Mapping) for c in calls
            )
        ):
            raise ValueError(
                f"messages[{i}].tool_calls must be a list of tool calls with a 'function' object"
            )
        out.append(norm)
    return out


_SYSTEM_MARK = "agw-system-probe"


def places_system_anywhere(renderer: Any) -> bool:
    """Whether `renderer`'s template renders a system message past the first message (Hermes,
    Qwen, Llama 3 and GLM templates do; Mistral's, DeepSeek's and gpt-oss' drop or refuse
    one). A renderer without `render_text` is taken at its word: it renders what it is given."""
    render_text = getattr(renderer, "render_text", None)
    if render_text is None:
        return True
    probe = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "system", "content": _SYSTEM_MARK},
        {"role": "user", "content": "v"},
    ]
    try:
        return _SYSTEM_MARK in render_text(probe, None)
    except Exception:  # a template that refuses it places none
        return False


def fold_system_messages(messages: list[Any]) -> list[Any]:
    """`messages` with each system message past the first joined to the nearest user message
    before it (its text after the user's, a blank line between), or after it if none is before;
    the list itself when there is none to move. Content parts are flattened first."""
    if not any(isinstance(m, Mapping) and m.get("role") == "system" for m in messages[1:]):
        return messages
    out = [dict(m) for m in normalize_messages(messages)]
    moved = [i for i in range(1, len(out)) if out[i]["role"] == "system"]
    for i in moved:
        text = out[i].get("content") or ""
        before = [j for j in range(i - 1, -1, -1) if out[j]["role"] == "user"]
        after = [j for j in range(i + 1, len(out)) if out[j]["role"] == "user"]
        if before:
            user = out[before[0]]
            user["content"] = f"{user.get('content') or ''}\n\n{text}"
        elif after:
            user = out[after[0]]
            user["content"] = f"{text}\n\n{user.get('content') or ''}"
        else:
            continue  # no user turn at all: it stays where it is, as the template renders it
        out[i] = None  # type: ignore[call-overload]
    return [m for m in out if m is not None]


TEXT_PARTS = frozenset({"text", "input_text", "output_text"})  # OpenAI chat's, Responses'


def _text_of_parts(parts: list[Any], i: int) -> str:
    """The text of a list of content parts; any other part (image_url, input_audio, file, ...)
    is refused: the template would render nothing for it, and the model would answer a question
    about an image it was never shown."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type", "text") if isinstance(part, Mapping) else None
        if kind not in TEXT_PARTS:
            if not isinstance(kind, str):
                raise ValueError(f"messages[{i}].content[{j}] must be an object with a 'type'")
            article = "an" if kind[:1] and kind[0] in "aeiou" else "a"
            raise ValueError(
                f"messages[{i}].content[{j}] is {article} {kind} part: "
                "the gateway's renderer is text-only"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"messages[{i}].content[{j}].text must be a string")
        texts.append(text)
    return "".join(texts)


class TextRenderer:
    """A renderer's `parse` for models that write their tool calls as text: drop a trailing stop
    token, `decode`, then parse with the renderer's `parser`, a model family (Hermes unless set:
    `parsers.FAMILIES`). Subclasses supply `name`, `stop_token_ids`, `render`, `decode` and
    `token_text`."""

    stop_token_ids: tuple[int, ...] = ()
    parser: Family = HERMES

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def use_parser(self, parser: Family) -> None:
        self.parser = parser

    def parse(self, output_ids: Sequence[int], *, tools_enabled: bool) -> Parsed:
        ids = list(output_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.parser.parse(self.decode(ids), tools_enabled=tools_enabled)


class AnchoredRenderer(TextRenderer):
    """A TextRenderer whose prompt is a chat template's text, encoded: `render` and an exact
    incremental `render_from` (see the module docstring). Subclasses supply `render_text`,
    `encode` and `anchors`, the anchor strings and their ids (empty: every render is full)."""

    max_cuts = 8  # cuts kept per render: a turn's own anchors, with room to spare
    _anchors: dict[str, int] = {}
    _anchor_re: re.Pattern[str] | None = None
    _anchor_ids: frozenset[int] = frozenset()

    @property
    def anchors(self) -> Mapping[str, int]:
        return self._anchors

    @anchors.setter
    def anchors(self, anchors: Mapping[str, int]) -> None:
        self._anchors = dict(anchors)
        longest_first = sorted(self._anchors, key=len, reverse=True)
        self._anchor_re = re.compile("|".join(map(re.escape, longest_first)))
        self._anchor_ids = frozenset(self._anchors.values())

    def render_text(self, messages: list[Message], tools: Tools) -> str:
        """The template's text for normalized `messages`, generation prompt added."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def render(self, messages: Messages, tools: Tools) -> list[int]:
        return self.encode(self.render_text(normalize_messages(messages), tools))

    def render_from(
        self,
        messages: Messages,
        tools: Tools,
        earlier: Sequence[RenderState],
        shared: SharedPrefixes[RenderState] | None = None,
    ) -> Rendered:
        text = self.render_text(normalize_messages(messages), tools)
        best = self._best(text, earlier)
        from_shared = False
        if best is None and shared is not None:
            best = self._best(text, shared.states())
            if best is not None:
                shared.used(best[2])
                from_shared = True
        if best is None:
            ids = self.encode(text)
            cuts = self._cuts(text, ids, 0, 0)
            if shared is not None and cuts:
                shared.add(RenderState(text, ids, cuts))  # every cut: any prefix may be shared
            return Rendered(ids, 0, None, self._state(text, ids, cuts))
        n, offset, base = best
        ids = base.ids[:n] + self.encode(text[offset:])
        state = self._state(text, ids, self._cuts(text, ids, offset, n))
        return Rendered(ids, n, base, state, from_shared)

    def _best(
        self, text: str, states: Sequence[RenderState]
    ) -> tuple[int, int, RenderState] | None:
        """The longest reuse `states` allow for `text`: (ids reused, offset, state)."""
        best: tuple[int, int, RenderState] | None = None
        for state in states:
            cut = self._cut(text, state)
            if cut is not None and (best is None or cut[1] > best[0]):
                best = (cut[1], cut[0], state)
        return best

    def _cut(self, text: str, state: RenderState) -> tuple[int, int] | None:
        """The last of `state`'s cuts up to which `text` equals `state.text` and at which an
        anchor starts in `text`; None if there is none. Compares each stretch of text once."""
        anchor = self._anchor_re
        if anchor is None or not self._anchors:
            return None
        found = None
        done = 0
        for offset, n in state.cuts:
            if text[done:offset] != state.text[done:offset]:
                break
            done = offset
            if anchor.match(text, offset):
                found = (offset, n)
        return found

    def _cuts(self, text: str, ids: list[int], offset: int, n: int) -> tuple[tuple[int, int], ...]:
        """The cuts of a render whose text from `offset` was encoded into `ids[n:]`. Each
        occurrence of an anchor string there is exactly one anchor token (the anchor rules), so
        the k-th anchor occurrence in that text is the k-th anchor id in those ids."""
        if self._anchor_re is None or not self._anchors:
            return ()
        found = [(m.start(), m.group()) for m in self._anchor_re.finditer(text, offset)]
        anchor_ids = self._anchor_ids
        at = [i for i in range(n, len(ids)) if ids[i] in anchor_ids]
        if len(at) != len(found) or any(
            ids[i] != self._anchors[a] for i, (_, a) in zip(at, found, strict=True)
        ):
            return ()  # not for a sound anchor set: no reuse rather than a wrong one
        return tuple((o, i) for i, (o, _) in zip(at, found, strict=True) if i)  # i: reuse some

    def _state(
        self, text: str, ids: list[int], cuts: tuple[tuple[int, int], ...]
    ) -> RenderState | None:
        """The state a session keeps: its last `max_cuts` cuts."""
        return RenderState(text, ids, cuts[-self.max_cuts :]) if cuts else None

    def check_incremental(self, conversation: Messages, tools: Tools = None) -> bool:
        """True if rendering each prefix of `conversation` that ends with a non-assistant
        message, incrementally from the one before, gives `render`'s ids. A renderer calls this
        on a probe chat to catch tokenizer behaviour the anchor rules cannot see."""
        states: list[RenderState] = []
        for end in range(1, len(conversation) + 1):
            if conversation[end - 1].get("role") == "assistant":
                continue
            prefix = list(conversation[:end])
            rendered = self.render_from(prefix, tools, states)
            if rendered.ids != self.render(prefix, tools):
                return False
            states = [rendered.state] if rendered.state else []
        return True


# -- Hugging Face ---------------------------------------------------------------------------------


class HFRenderer(AnchoredRenderer):
    """A Hugging Face fast tokenizer and its chat template (rendered with `tools`).

    The template is rendered to text and then encoded without adding BOS/EOS, which is what
    `apply_chat_template(tokenize=True)` does (by the Rust tokenizer's offset-free batch call,
    about twice as fast as `tokenizer.encode`). Sampled ids are parsed by a model family's parser
    (`parser`: a name from `parsers.FAMILIES`, or None to detect it from the chat template's
    markers, Hermes when none is found); decoding skips special tokens, so a template's control
    tokens never reach the agent, except those the family's parser reads (Mistral's
    `[TOOL_CALLS]`, harmony's channels). The family's end-of-turn tokens join EOS as stop ids.
    Renders are incremental when the tokenizer has anchors (`hf_anchors`) and they pass a probe
    conversation.
    """

    def __init__(
        self, tokenizer: Any, *, name: str | None = None, parser: str | Family | None = None
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template")
        self.tokenizer = tokenizer
        self.name = name or f"hf:{getattr(tokenizer, 'name_or_path', '') or 'tokenizer'}"
        # transformers resets these on every call it makes; a tokenizer.json may set them.
        self._backend = tokenizer.backend_tokenizer
        if self._backend.truncation is not None:
            self._backend.no_truncation()
        if self._backend.padding is not None:
            self._backend.no_padding()
        self.use_parser(parser)
        self.anchors = hf_anchors(tokenizer)
        try:
            sound = all(self.check_incremental(PROBE_CHAT, tools) for tools in (None, PROBE_TOOLS))
        except ValueError as exc:  # a template that refuses the probe: the anchor rules stand alone
            log.debug("%s: the incremental probe did not render: %s", self.name, _line(exc))
            sound = True
        if not sound:
            log.warning(
                "%s: incremental rendering disagrees with full renders; disabled", self.name
            )
            self.anchors = {}

    def use_parser(self, parser: str | Family | None) -> None:
        """Parse with `parser` (a family or its name; None: the chat template's family), and
        take that family's stop tokens and the special tokens it reads."""
        if parser is None:
            parser = detect_family(self.tokenizer.chat_template)
        self.parser = family(parser) if isinstance(parser, str) else parser
        added = self._backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, t in added.items() if t.special)
        self._keep = {i: t.content for i, t in added.items() if t.content in self.parser.keep}
        stops = [self.tokenizer.eos_token_id, *map(self._backend.token_to_id, self.parser.stop)]
        self.stop_token_ids = tuple(dict.fromkeys(int(i) for i in stops if i is not None))

    @classmethod
    def from_pretrained(cls, path: str | PathLike[str]) -> HFRenderer:
        """Load a tokenizer saved with `save_pretrained` from a local directory (never the hub:
        rollout machines have no business downloading at run time)."""
        from transformers import PreTrainedTokenizerFast  # optional dependency: [gateway]

        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        return cls(tokenizer)

    def render_text(self, messages: list[Message], tools: Tools) -> str:
        if self.parser.object_arguments:
            messages = _object_arguments(messages)
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=list(tools) if tools else None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # jinja2 errors (raise_exception in templates) are the request's
            raise ValueError(f"chat template failed: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` without special tokens, except those the parser reads."""
        ids = list(ids)
        keep = self._keep
        if not keep or not any(i in keep for i in ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        pieces: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in keep or i in self._special_ids:
                pieces.append(self.tokenizer.decode(run, skip_special_tokens=True))
                pieces.append(keep.get(i, ""))
                run = []
            else:
                run.append(i)
        pieces.append(self.tokenizer.decode(run, skip_special_tokens=True))
        return "".join(pieces)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def _object_arguments(messages: list[Message]) -> list[Message]:
    """Messages whose tool calls carry `arguments` as objects, for templates that read them so
    (Llama 3.1's `| tojson`, GLM-4.5's `.items()`), as vLLM and SGLang pass them. An agent sends
    OpenAI's JSON strings; one that is not a JSON object is the request's fault."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        converted = []
        for j, call in enumerate(calls):
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    arguments = None
                if not isinstance(arguments, dict):
                    raise ValueError(
                        f"messages[{i}].tool_calls[{j}].function.arguments is not a JSON object"
                    )
            converted.append({**call, "function": {**call["function"], "arguments": arguments}})
        out.append({**message, "tool_calls": converted})
    return out


# A chat with the boundaries that trip tokenizers: leading and trailing spaces and newlines,
# digits, punctuation, and a text-only tool call.
PROBE_CHAT: tuple[Message, ...] = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": " 42.\n"},
    {"role": "user", "content": "\n  Again, in words? "},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "say", "arguments": {"n": 42}}</tool_call>',
    },
    {"role": "tool", "content": "forty-two"},
    {"role": "user", "content": "Thanks!"},
)
PROBE_TOOLS = ({"type": "function", "function": {"name": "say", "parameters": {}}},)


def hf_anchors(tokenizer: Any) -> dict[str, int]:
    """The added tokens of a Hugging Face fast tokenizer at which the encoding of a text splits
    into independent halves (see the module docstring): matched on raw text (not normalized
    first), eating no space to their left, not word-bounded, starting with a character that is
    neither a space nor a word character (so no neighbour's strip or word rule reaches across),
    and overlapped by no added token: none contains it past its own first character, none longer
    starts with it, and no added token's tail is a prefix of it. So every occurrence of an
    anchor in a text is that one token, and no match reaches across it."""
    backend = tokenizer.backend_tokenizer
    added = backend.get_added_tokens_decoder()
    contents = [t.content for t in added.values()]
    anchors: dict[str, int] = {}
    for token_id, token in added.items():
        a = token.content
        if (
            not a
            or token.lstrip
            or token.single_word
            or (token.normalized and backend.normalizer is not None)
            or a[0].isspace()
            or a[0].isalnum()
            or a[0] == "_"
        ):
            continue
        if any(
            (t != a and t.startswith(a))
            or any(t[j:].startswith(a) or a.startswith(t[j:]) for j in range(1, len(t)))
            for t in contents
        ):
            continue
        anchors[a] = int(token_id)
    return anchors


# -- choosing one ---------------------------------------------------------------------------------


def load_renderer(spec: str, *, parser: str | None = None) -> Renderer:
    """The renderer `spec` names: a local directory holding a Hugging Face tokenizer with a chat
    template (`HFRenderer`), or `module:attribute`, a Renderer class or zero-argument factory (how
    a model with another template or tool-call syntax plugs in). `parser` names the model family
    whose tool-call and reasoning syntax to parse (default: detected from the chat template;
    Hermes for a TextRenderer). Raises ValueError, in one line."""
    chosen = None if parser is None else family(parser)  # an unknown name fails first
    if Path(spec).is_dir():
        try:
            renderer: Renderer = HFRenderer.from_pretrained(spec)
        except (ImportError, OSError, ValueError) as exc:
            raise ValueError(f"no tokenizer with a chat template in {spec}: {_line(exc)}") from None
    else:
        renderer = _from_factory(spec)
    if chosen is not None:
        if not isinstance(renderer, TextRenderer):
            raise ValueError(f"{spec}() is no TextRenderer: it parses by itself, not by a parser")
        renderer.use_parser(chosen)
    return renderer


def _from_factory(spec: str) -> Renderer:
    module, sep, attribute = spec.partition(":")
    if not (sep and module and attribute):
        raise ValueError(f"{spec!r} is neither a tokenizer directory nor module:attribute")
    try:
        factory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, TypeError) as exc:  # TypeError: a relative module
        raise ValueError(f"cannot import {spec}: {_line(exc)}") from None
    try:
        renderer = factory()
    except Exception as exc:  # the user's factory: any failure is a configuration error
        raise ValueError(f"{spec}() failed: {type(exc).__name__}: {_line(exc)}") from None
    if not isinstance(renderer, Renderer):
        raise ValueError(f"{spec}() returned a {type(renderer).__name__}, not a Renderer")
    return renderer


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
