"""What the families' reference renderers write for a tool call is promoted exactly, buffered and
streamed, and what they write for prose is not: gpt-oss harmony rendered by ``openai-harmony``,
Mistral's instruct formats (v2 to v13) by ``mistral-common``'s tokenizers (issue 52).

Each answer is the completion only, the tokens after the rendered prompt, decoded with the special
tokens kept, as a server sends it with ``skip_special_tokens`` off; the arguments are fixed and
seeded values (nested objects, unicode, quotes, backslashes, newlines, numbers, null).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mistral_common
import pytest
from mistral_common.protocol.instruct.chunk import TextChunk, ThinkChunk
from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
from openai_harmony import (
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    Message,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

from benchmarks.textcalls import Promotion, promote_answer, stream_answer

# --- the arguments, the declared tools ----------------------------------------------------------

_FRAGMENTS = (
    "plain",
    'say "hi"',
    "it's",
    "back\\slash",
    "two\nlines",
    "tab\there",
    "Zürich",
    "日本語",
    "emoji 🎉",
    "{not: json}",
    "[1, 2]",
    "a, b; c",
    "  padded  ",
    "",
)


def _value(rng: random.Random, depth: int) -> Any:
    kinds = ["string", "integer", "number", "boolean", "null"]
    if depth < 3:
        kinds += ["array", "object"]
    kind = rng.choice(kinds)
    if kind == "string":
        return "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 3)))
    if kind == "integer":
        return rng.randint(-(10**9), 10**9)
    if kind == "number":
        return round(rng.uniform(-1e4, 1e4), rng.randint(1, 6))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}_{rng.choice('xyz')}": _value(rng, depth + 1) for i in range(rng.randint(1, 3))}


def _seeded(seed: int, name: str) -> tuple[str, dict[str, Any]]:
    rng = random.Random(seed)
    return name, {f"p{i}": _value(rng, 1) for i in range(rng.randint(2, 4))}


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"location": "San Francisco", "unit": "celsius"}),
    (
        "search_docs",
        {
            "query": 'say "hi"\nthen {leave}',
            "filters": {"tags": ["a", "ü", "日本"], "since": "2024-01-01"},
            "limit": 3,
        },
    ),
    ("write_file", {"path": "/tmp/x.py", "content": "def f():\n\treturn '\\\\' + \"q\"  # é\n"}),
    (
        "set_config",
        {
            "ratio": -1.25e-3,
            "big": 12345678901234,
            "enabled": False,
            "note": None,
            "values": {"k": [1, 2.5, {"deep": {"deeper": "emoji 🎉"}}]},
        },
    ),
    *(_seeded(52 + i, f"lookup_order-v{i}") for i in range(4)),
]


def _schema_of(value: Any) -> dict[str, Any]:
    """The narrowest JSON Schema the value fits: promotion validates against it."""
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    properties = {key: _schema_of(item) for key, item in value.items()}
    return {"type": "object", "properties": properties, "required": sorted(value)}


SCHEMAS = {name: _schema_of(arguments) for name, arguments in CALLS}
REQUEST = {
    "tools": [
        {"type": "function", "function": {"name": name, "parameters": schema}}
        for name, schema in SCHEMAS.items()
    ],
    "tool_choice": "auto",
}


def _canonical(calls: Sequence[tuple[str, Any]]) -> str:
    return json.dumps([[name, arguments] for name, arguments in calls], sort_keys=True)


def _promotions(text: str) -> list[tuple[str, Promotion]]:
    """Buffered; streamed in 8 deltas; streamed a character at a time."""
    return [
        ("buffered", promote_answer(REQUEST, text)),
        ("streamed in 8 deltas", stream_answer(REQUEST, text)),
        ("streamed per character", stream_answer(REQUEST, text, pieces=len(text))),
    ]


def _assert_promoted_exactly(
    text: str, calls: Sequence[tuple[str, Any]], content: str | None, markers: Sequence[str]
) -> None:
    for how, result in _promotions(text):
        assert _canonical(result.calls) == _canonical(calls), how
        assert result.content == content, how
        for marker in markers:
            assert marker not in (result.content or ""), (how, marker)


def _cut_inside(text: str, arguments: Any) -> str:
    """``text`` cut off halfway through the arguments object (as a stream that stops there)."""
    written = json.dumps(arguments, ensure_ascii=False)
    return text[: text.index(written) + len(written) // 2]


def _assert_not_promoted(text: str) -> None:
    for how, result in _promotions(text):
        assert result.outcome == "not_a_call", how
        assert not result.calls, how
    assert promote_answer(REQUEST, text).content == text


# --- gpt-oss harmony (openai-harmony) -----------------------------------------------------------

HARMONY_MARKERS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|call|>",
    "<|end|>",
    "<|return|>",
    "to=",
)
# The o200k_base vocabulary harmony's encoding loads: downloaded at run time unless
# TIKTOKEN_ENCODINGS_BASE names a folder holding it. litellm (pinned in the dev extra) ships the
# exact file under tiktoken's cache key (the SHA-1 of its public address), and harmony checks its
# SHA-256 on load, so no network is needed and no other file can pass for it.
_O200K_CACHE_KEY = "fb374d419588a4632f3f557e76b4b70aebbca790"


@functools.cache
def _harmony() -> HarmonyEncoding:
    spec = importlib.util.find_spec("litellm")  # finds the package without importing it
    assert spec is not None and spec.origin is not None, "litellm (the dev extra) is needed"
    vocabulary = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers" / _O200K_CACHE_KEY
    assert vocabulary.is_file(), f"no o200k_base vocabulary at {vocabulary}"
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        (Path(folder) / "o200k_base.tiktoken").symlink_to(vocabulary)
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", folder)
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


_HARMONY_KEEP_ANALYSIS = RenderConversationConfig(auto_drop_analysis=False)


def _harmony_prompt() -> list[Message]:
    tools = [
        ToolDescription.new(name, f"The {name} tool.", parameters=schema)
        for name, schema in SCHEMAS.items()
    ]
    return [
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
        Message.from_role_and_content(
            Role.DEVELOPER, DeveloperContent.new().with_function_tools(tools)
        ),
        Message.from_role_and_content(Role.USER, "Please do it."),
    ]


def _harmony_completion(answer: Sequence[Message]) -> str:
    """The text the model generates after the prompt's ``<|start|>assistant``, ending in the
    stop token (``<|call|>`` after a call, ``<|return|>`` after a final message); checked by
    harmony's own parser to read back as ``answer``."""
    encoding = _harmony()
    prompt = encoding.render_conversation_for_completion(
        Conversation.from_messages(_harmony_prompt()), Role.ASSISTANT, _HARMONY_KEEP_ANALYSIS
    )
    whole = encoding.render_conversation_for_training(
        Conversation.from_messages([*_harmony_prompt(), *answer]), _HARMONY_KEEP_ANALYSIS
    )
    assert whole[: len(prompt)] == prompt
    completion = whole[len(prompt) :]
    parsed = encoding.parse_messages_from_completion_tokens(completion, Role.ASSISTANT)
    assert [(m.channel, m.recipient, m.content) for m in parsed] == [
        (m.channel, m.recipient, m.content) for m in answer
    ]
    return encoding.decode_utf8(completion)


def _harmony_call(name: str, arguments: Any, constrained: bool = True) -> Message:
    message = (
        Message.from_role_and_content(Role.ASSISTANT, json.dumps(arguments, ensure_ascii=False))
        .with_channel("commentary")
        .with_recipient(f"functions.{name}")
    )
    return message.with_content_type("<|constrain|>json") if constrained else message


def _harmony_text(channel: str, text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


ANALYSIS = 'The user wants this done.\nI\'ll call the tool: {"not": "a call"}.'
FINAL = "Here it is: done, «vraiment»."
HARMONY_SHAPES = [
    "call",
    "call, no constrain",
    "analysis, call",
    "call, final",
    "analysis, call, final",
]


def _harmony_answer(shape: str, name: str, arguments: Any) -> tuple[list[Message], str | None]:
    call = _harmony_call(name, arguments, constrained=shape != "call, no constrain")
    answer = {
        "call": [call],
        "call, no constrain": [call],
        "analysis, call": [_harmony_text("analysis", ANALYSIS), call],
        "call, final": [call, _harmony_text("final", FINAL)],
        "analysis, call, final": [
            _harmony_text("analysis", ANALYSIS),
            call,
            _harmony_text("final", FINAL),
        ],
    }[shape]
    return answer, FINAL if shape.endswith("final") else None


def _stripped(text: str, stops: Sequence[str]) -> str:
    """As a server delivers it: the stop token that ended generation is not in the text."""
    for stop in stops:
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


@pytest.mark.parametrize("stop_token", ["kept", "stripped"])
@pytest.mark.parametrize("shape", HARMONY_SHAPES)
@pytest.mark.parametrize(("name", "arguments"), CALLS, ids=[name for name, _ in CALLS])
def test_harmony_renders_of_a_call_are_promoted_exactly(
    name: str, arguments: Any, shape: str, stop_token: str
) -> None:
    answer, content = _harmony_answer(shape, name, arguments)
    text = _harmony_completion(answer)
    if stop_token == "stripped":
        text = _stripped(text, ("<|call|>", "<|return|>"))
    _assert_promoted_exactly(text, [(name, arguments)], content, HARMONY_MARKERS)


@pytest.mark.parametrize(("name", "arguments"), CALLS, ids=[name for name, _ in CALLS])
def test_a_harmony_call_cut_off_inside_its_arguments_is_not_a_call(
    name: str, arguments: Any
) -> None:
    text = _harmony_completion([_harmony_call(name, arguments)])
    _assert_not_promoted(_cut_inside(text, arguments))


HARMONY_PROSE = {
    "final": [_harmony_text("final", FINAL)],
    "analysis, final": [_harmony_text("analysis", ANALYSIS), _harmony_text("final", FINAL)],
    "preamble, final": [
        _harmony_text("commentary", "Checking get_weather now."),
        _harmony_text("final", FINAL),
    ],
}


@pytest.mark.parametrize("stop_token", ["kept", "stripped"])
@pytest.mark.parametrize("shape", list(HARMONY_PROSE))
def test_harmony_renders_of_prose_are_not_promoted(shape: str, stop_token: str) -> None:
    text = _harmony_completion(HARMONY_PROSE[shape])
    _assert_not_promoted(text if stop_token == "kept" else _stripped(text, ("<|return|>",)))


# --- Mistral (mistral-common) -------------------------------------------------------------------

MISTRAL_MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
_DATA = Path(mistral_common.__file__).parent / "data"
# The tokenizer files mistral-common ships, and the format each version writes: v2
# ``[TOOL_CALLS][{"name", "arguments"}]``, v3 (sentencepiece and tekken) the same with each call's
# "id", v7 the same with prose allowed before it, v11 ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}``
# per call, v13 ``[TOOL_CALLS]NAME[ARGS]{...}`` per call, after an optional ``[THINK]...[/THINK]``.
_SHIPPED = {
    "v2": "mistral_instruct_tokenizer_240216.model.v2",
    "v3": "mistral_instruct_tokenizer_240323.model.v3",
    "v3-tekken": "tekken_240718.json",
    "v7": "mistral_instruct_tokenizer_241114.model.v7",
}
# No v11 or v13 tokenizer file is shipped: these use NeMo's tekken vocabulary with the version
# and the special tokens such a file declares. Their ranks are arbitrary; the text is not.
_MADE = ("v11", "v13")
_LATER_SPECIALS = ("[AUDIO]", "[BEGIN_AUDIO]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]")
MISTRAL_VERSIONS = [*_SHIPPED, *_MADE]


@functools.cache
def _mistral(version: str) -> MistralTokenizer:
    if version in _SHIPPED:
        return MistralTokenizer.from_file(str(_DATA / _SHIPPED[version]))
    tekken = json.loads((_DATA / "tekken_240718.json").read_text(encoding="utf-8"))
    tekken["config"]["version"] = version
    specials = [dict(token) for token in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    for token in _LATER_SPECIALS:
        specials.append({"rank": len(specials), "token_str": token, "is_control": True})
    tekken["special_tokens"] = specials
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"tekken_{version}.json"
        path.write_text(json.dumps(tekken), encoding="utf-8")
        return MistralTokenizer.from_file(str(path))


_MISTRAL_TOOLS = [
    Tool(function=Function(name=name, description=f"The {name} tool.", parameters=schema))
    for name, schema in SCHEMAS.items()
]
_MISTRAL_USER = UserMessage(content="Please do it.")


def _mistral_completion(version: str, answer: AssistantMessage) -> str:
    """The text the model generates after the prompt's ``[/INST]``, up to its EOS (which the
    server strips as the stop token): the answer rendered as a prefix, which the library writes
    as the finished message without the EOS. Each run of ordinary tokens is decoded as the
    library decodes text; special tokens are kept as written."""
    tokenizer = _mistral(version)
    prompt = tokenizer.encode_chat_completion(
        ChatCompletionRequest(messages=[_MISTRAL_USER], tools=_MISTRAL_TOOLS)
    ).tokens
    whole = tokenizer.encode_chat_completion(
        ChatCompletionRequest(
            messages=[_MISTRAL_USER, answer.model_copy(update={"prefix": True})],
            tools=_MISTRAL_TOOLS,
        )
    ).tokens
    assert whole[: len(prompt)] == prompt
    raw = tokenizer.instruct_tokenizer.tokenizer
    pieces: list[str] = []
    run: list[int] = []
    for token in [*whole[len(prompt) :], -1]:
        if token >= 0 and not raw.is_special(token):
            run.append(token)
            continue
        if run:
            pieces.append(raw.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE))
            run = []
        if token >= 0:
            pieces.append(raw.id_to_piece(token))
    return "".join(pieces)


def _mistral_calls(indexes: Sequence[int]) -> list[ToolCall]:
    """Calls with 9-character ids, as Mistral's models write them from v3 on (v2 writes none)."""
    return [
        ToolCall(
            id=f"c{index:08d}",
            function=FunctionCall(
                name=CALLS[index][0], arguments=json.dumps(CALLS[index][1], ensure_ascii=False)
            ),
        )
        for index in indexes
    ]


THINKING = 'The user wants it.\nCall the tool with {"x": 1}.'
PROSE_BEFORE = "Let me check that for you."


def _mistral_cases() -> list[Any]:
    cases = []
    for version in MISTRAL_VERSIONS:
        for index, (name, _) in enumerate(CALLS):
            cases.append(pytest.param(version, "one call", [index], id=f"{version}-{name}"))
        cases.append(
            pytest.param(version, "every call", list(range(len(CALLS))), id=f"{version}-all")
        )
        if version not in ("v2", "v3", "v3-tekken"):  # prose beside calls from v7 on
            cases.append(pytest.param(version, "prose, call", [1], id=f"{version}-prose-call"))
        if version == "v13":
            cases.append(pytest.param(version, "thinking, call", [3], id=f"{version}-think-call"))
    return cases


@pytest.mark.parametrize(("version", "shape", "indexes"), _mistral_cases())
def test_mistral_renders_of_calls_are_promoted_exactly(
    version: str, shape: str, indexes: list[int]
) -> None:
    calls = _mistral_calls(indexes)
    content: str | None = None
    if shape == "prose, call":
        answer = AssistantMessage(content=PROSE_BEFORE, tool_calls=calls)
        content = PROSE_BEFORE
    elif shape == "thinking, call":
        answer = AssistantMessage(content=[ThinkChunk(thinking=THINKING)], tool_calls=calls)
        content = f"[THINK]{THINKING}[/THINK]"  # reasoning stays as text, as for other families
    else:
        answer = AssistantMessage(tool_calls=calls)
    text = _mistral_completion(version, answer)
    assert text.startswith(content or "[TOOL_CALLS]")
    _assert_promoted_exactly(text, [CALLS[i] for i in indexes], content, MISTRAL_MARKERS)


@pytest.mark.parametrize(("name", "arguments"), CALLS, ids=[name for name, _ in CALLS])
@pytest.mark.parametrize("version", MISTRAL_VERSIONS)
def test_a_mistral_call_cut_off_inside_its_arguments_is_not_a_call(
    version: str, name: str, arguments: Any
) -> None:
    index = [call_name for call_name, _ in CALLS].index(name)
    text = _mistral_completion(version, AssistantMessage(tool_calls=_mistral_calls([index])))
    _assert_not_promoted(_cut_inside(text, arguments))


MISTRAL_PROSE = {
    "plain": "It is 21 °C in Zürich.\nAnything else?",
    "a result quoted": 'get_weather said {"temp": 21, "unit": "celsius"}; it is warm.',
}


@pytest.mark.parametrize("prose", list(MISTRAL_PROSE))
@pytest.mark.parametrize("version", MISTRAL_VERSIONS)
def test_mistral_renders_of_prose_are_not_promoted(version: str, prose: str) -> None:
    text = _mistral_completion(version, AssistantMessage(content=MISTRAL_PROSE[prose]))
    _assert_not_promoted(text)


def test_mistral_v13_thinking_then_prose_is_not_promoted() -> None:
    answer = AssistantMessage(
        content=[ThinkChunk(thinking=THINKING), TextChunk(text=MISTRAL_PROSE["plain"])]
    )
    text = _mistral_completion("v13", answer)
    assert text.startswith("[THINK]")
    _assert_not_promoted(text)
