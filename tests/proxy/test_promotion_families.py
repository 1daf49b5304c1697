"""The outputs issue 52 lists as not promoted (each verbatim, from llama.cpp's chat tests and the
hostile review), and what the proxy makes of them now: the calls exactly, no wrapper left in
content, prose kept."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.textcalls import promote_answer


def _tool(name: str, *properties: str, types: dict[str, str] | None = None) -> dict[str, Any]:
    kinds = types or {}
    schema = {key: {"type": kinds.get(key, "string")} for key in properties}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": schema}},
    }


TOOLS = [
    _tool("special_function", "arg1", types={"arg1": "integer"}),
    _tool("get_weather", "location"),
    _tool("python", "code"),
    _tool("bash", "command"),
    _tool("code_interpreter", "code"),
    _tool("book_flight", "from", "to", "date"),
    _tool("test"),
    _tool("edit", "newString"),
]
SPECIAL = [("special_function", {"arg1": 1})]
WEATHER = [("get_weather", {"location": "San Francisco"})]
JSON_CALL = '{"name": "special_function", "arguments": {"arg1": 1}}'

CASES: list[tuple[str, str, list[tuple[str, Any]], str | None]] = [
    ("mistral args", '[TOOL_CALLS]get_weather[ARGS]{"location": "San Francisco"}', WEATHER, None),
    (
        "mistral call id",
        '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}',
        SPECIAL,
        None,
    ),
    (
        "harmony final message after the call",
        '<|channel|>commentary to=functions.get_weather<|message|>{"location":"San Francisco"}'
        "<|end|><|start|>assistant<|message|>The weather is sunny<|end|>",
        WEATHER,
        "The weather is sunny",
    ),
    (
        "harmony stopped before <|call|>",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location":"San Francisco"}',
        WEATHER,
        None,
    ),
    ("lfm2 json", f"<|tool_call_start|>[{JSON_CALL}]<|tool_call_end|>", SPECIAL, None),
    (
        "lfm2 without opener",
        "[bash(command='ls')]<|tool_call_end|>",
        [("bash", {"command": "ls"})],
        None,
    ),
    ("nemotron nano v2", f"<TOOLCALL>[{JSON_CALL}]</TOOLCALL>", SPECIAL, None),
    (
        "minicpm params",
        '<function name="python"><param name="code">print(\'Hello, World!\')</param></function>',
        [("python", {"code": "print('Hello, World!')"})],
        None,
    ),
    (
        "minicpm json body",
        '<function name="special_function">\n{"arg1": 1}\n</function>',
        SPECIAL,
        None,
    ),
    ("functionary v3.2", '>>>special_function\n{"arg1": 1}', SPECIAL, None),
    ("functionary v3.2 opened by the prompt", 'special_function\n{"arg1": 1}', SPECIAL, None),
    ("functionary v3.1", '<function=special_function>{"arg1": 1}</function>', SPECIAL, None),
    (
        "llama 3.x built-in",
        "<|python_tag|>code_interpreter.call(code=\"print('hey')\")",
        [("code_interpreter", {"code": "print('hey')"})],
        None,
    ),
    ("gigachat", f"<|function_call|>{JSON_CALL}", SPECIAL, None),
    ("gigachat 3", f"<|message_sep|>\n\nfunction call<|role_sep|>\n{JSON_CALL}", SPECIAL, None),
    (
        "command r7b reasoning opened by the prompt",
        'I\'m\nthinking<|END_THINKING|><|START_ACTION|>[{"tool_call_id": "0", '
        '"tool_name": "special_function", "parameters": {"arg1": 1}}]<|END_ACTION|>',
        SPECIAL,
        "I'm\nthinking<|END_THINKING|>",
    ),
    (
        "apertus reasoning",
        "<|inner_prefix|>I'm\nthinking<|inner_suffix|><|tools_prefix|>"
        '[{"special_function": {"arg1": 1}}]<|tools_suffix|>',
        SPECIAL,
        "<|inner_prefix|>I'm\nthinking<|inner_suffix|>",
    ),
    (
        "gemma 4 reasoning",
        "<|channel>thought\nI need to check the weather<channel|><|tool_call>call:get_weather"
        '{location:<|"|>Paris<|"|>}<tool_call|>',
        [("get_weather", {"location": "Paris"})],
        "<|channel>thought\nI need to check the weather<channel|>",
    ),
    (
        "kimi k2 section inside unclosed reasoning",
        "<think>I think<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
        '<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|><|tool_calls_section_end|>',
        SPECIAL,
        "<think>I think",
    ),
    (
        "deepseek other bars",
        "‹|tool▁calls▁begin|><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
        '```json\n{"arg1": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        SPECIAL,
        None,
    ),
    (
        "deepseek v3.1 content before and after",
        "Content before <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>special_function<｜tool▁sep｜>"
        '{"arg1": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜> after',
        SPECIAL,
        "Content before\nafter",
    ),
    *(
        (f"hermes-style <{tag}>", f"<{tag}>{JSON_CALL}</{tag}>", SPECIAL, None)
        for tag in ("tool", "tools", "response", "json", "xml")
    ),
    (
        "olmo 3 reserved keyword",
        '<function_calls>book_flight(from="SFO", to="NYC", date="2024-01-15")</function_calls>',
        [("book_flight", {"from": "SFO", "to": "NYC", "date": "2024-01-15"})],
        None,
    ),
    (
        "seed-oss value kept exactly",
        "<seed:tool_call>\n<function=edit>\n<parameter=newString>#include\n</parameter>\n"
        "</function>\n</seed:tool_call>",
        [("edit", {"newString": "#include\n"})],
        None,
    ),
    (
        "minimax-m2 prose after",
        '<minimax:tool_call>\n<invoke name="special_function">\n<parameter name="arg1">1'
        "</parameter>\n</invoke>\n</minimax:tool_call>Hello, world!\nWhat's up?",
        SPECIAL,
        "Hello, world!\nWhat's up?",
    ),
    (
        "functiongemma prose after",
        "<start_function_call>call:test{}<end_function_call>Done!",
        [("test", {})],
        "Done!",
    ),
]


@pytest.mark.parametrize(
    ("text", "calls", "content"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_family_format_is_promoted_exactly(
    text: str, calls: list[tuple[str, Any]], content: str | None
) -> None:
    result = promote_answer({"tools": TOOLS, "tool_choice": "auto"}, text)
    assert list(result.calls) == calls
    assert result.content == content


@pytest.mark.parametrize(
    "text",
    [
        "Plan</think>Before<tool_call><function=get_weather>",
        '[TOOL_CALLS]get_weather[ARGS]{"location": "San',
        '<|channel|>commentary to=functions.get_weather<|message|>{"location": "San',
        '<function name="python"><param name="code">print(1)</param>',
        '>>>special_function\n{"arg1": ',
        "<|python_tag|>code_interpreter.call(code=\"print('hey')",
    ],
    ids=["xml", "mistral", "harmony", "minicpm", "functionary", "python_tag"],
)
def test_a_call_cut_off_inside_its_value_is_not_a_call(text: str) -> None:
    result = promote_answer({"tools": TOOLS, "tool_choice": "auto"}, text)
    assert result.outcome == "not_a_call"
