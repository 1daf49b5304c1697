"""Write ``tests/data/textcalls/outside/llamacpp_<template>.jsonl``: the model outputs llama.cpp's
own chat tests (``tests/test-chat.cpp``) feed its parsers, with the calls it expects.

Each ``tst.test("...")`` of a ``peg_tester("models/templates/X.jinja")`` block is one case: the
output string (C++ literals joined), the tools it declares (``.tools({...})``), and the calls its
expectation names (``.expect(message_assist_call)``, ``.expect_tool_calls({...})``). Cases that
test something else than one finished answer (``.is_partial(true)``, continuation, a response
schema, earlier messages) are left out. An expected call whose arguments are not complete JSON
(``message_assist_call_cutoff_args``) is, for the proxy, no call: the case is a negative.
Only strings are taken (with the file and line as provenance); no code.

    python -m benchmarks.diagnostics.outside_corpus \
        /tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/tests/test-chat.cpp
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "textcalls" / "outside"
SOURCE = "llama-cpp-python==0.3.36 sdist, vendor/llama.cpp/tests/test-chat.cpp"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_SKIP = (
    ".is_partial(true)",
    ".json_schema(",
    ".continue_final_message(",
    ".messages(",
    ".add_generation_prompt(false)",
    ".grammar(",
)


def _literals(text: str, position: int) -> tuple[list[str], int]:
    """The C++ string literals starting at ``position`` (whitespace and comments between)."""
    found: list[str] = []
    while True:
        space = re.compile(r"(?:\s+|//[^\n]*\n|/\*.*?\*/)*", re.DOTALL).match(text, position)
        position = space.end() if space else position
        raw = re.compile(r'R"([^(\s]*)\(').match(text, position)
        if raw is not None:
            close = text.index(")" + raw.group(1) + '"', raw.end())
            found.append(text[raw.end() : close])
            position = close + len(raw.group(1)) + 2
            continue
        if text.startswith('"', position):
            position += 1
            pieces = []
            while text[position] != '"':
                if text[position] == "\\":
                    following = text[position + 1]
                    if following == "u":
                        pieces.append(chr(int(text[position + 2 : position + 6], 16)))
                        position += 6
                        continue
                    pieces.append(_ESCAPES.get(following, following))
                    position += 2
                    continue
                pieces.append(text[position])
                position += 1
            found.append("".join(pieces))
            position += 1
            continue
        return found, position


def _messages(text: str) -> dict[str, dict[str, Any]]:
    """``const common_chat_msg NAME = simple_assist_msg(...)`` constants: content and calls."""
    constants: dict[str, dict[str, Any]] = {}
    for match in re.finditer(r"common_chat_msg\s+(\w+)\s*=\s*simple_assist_msg\(", text):
        arguments: list[str] = []
        position = match.end()
        while True:
            literals, position = _literals(text, position)
            if not literals:
                break
            arguments.append("".join(literals))
            rest = re.compile(r"\s*(?:/\*.*?\*/\s*)?,\s*(?:/\*.*?\*/\s*)?", re.DOTALL)
            comma = rest.match(text, position)
            if comma is None:
                break
            position = comma.end()
        content = arguments[0] if arguments else ""
        name = arguments[2] if len(arguments) > 2 else ""
        calls = [(name, arguments[3] if len(arguments) > 3 else "")] if name else []
        constants[match.group(1)] = {"content": content, "calls": calls}
    return constants


# The helpers that build an expected message: (content, call name, arguments) positions.
_HELPERS = {
    "message_with_tool_calls": (None, 0, 1),
    "message_with_tool_calls_and_reasoning": (None, 0, 1),
    "message_with_reasoning_and_tool_call": (None, 1, 2),
    "message_with_content_and_tool_call": (0, 1, 2),
}


def _helper_call(chain: str) -> tuple[list[tuple[str, str]], str | None] | None:
    found = re.search(r"\.expect\((" + "|".join(_HELPERS) + r")\(", chain)
    if found is None:
        return None
    arguments: list[str] = []
    position = found.end()
    while True:
        literals, position = _literals(chain, position)
        if not literals:
            break
        arguments.append("".join(literals))
        comma = re.compile(r"\s*,\s*").match(chain, position)
        if comma is None:
            break
        position = comma.end()
    content_at, name_at, arguments_at = _HELPERS[found.group(1)]
    if len(arguments) <= max(name_at, arguments_at):
        return None
    content = arguments[content_at] if content_at is not None else None
    return [(arguments[name_at], arguments[arguments_at])], content


def _call_list(chain: str) -> list[tuple[str, str]] | None:
    start = chain.find(".expect_tool_calls(")
    if start < 0:
        return None
    calls = []
    position = start + len(".expect_tool_calls(")
    depth = 0
    while position < len(chain):
        character = chain[position]
        if character == "{":
            depth += 1
            literals: list[str] = []
            cursor = position + 1
            while True:
                found, cursor = _literals(chain, cursor)
                if not found:
                    break
                literals.append("".join(found))
                comma = re.compile(r"\s*,\s*").match(chain, cursor)
                if comma is None:
                    break
                cursor = comma.end()
            if len(literals) >= 2:
                calls.append((literals[0], literals[1]))
                position = cursor
                continue
        elif character == "}":
            depth -= 1
        elif character == ")" and depth <= 0:
            break
        position += 1
    return calls


def _arguments(raw: str) -> Any:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _declared_tools(text: str) -> dict[str, dict[str, Any]]:
    """``common_chat_tool NAME{ "name", "description", R"(schema)" }`` -> its declaration."""
    tools: dict[str, dict[str, Any]] = {}
    for match in re.finditer(r"common_chat_tool\s+(\w+)\s*(?:=\s*)?\{", text):
        fields: list[str] = []
        position = match.end()
        for _ in range(3):
            literals, position = _literals(text, position)
            if not literals:
                break
            fields.append("".join(literals))
            comma = re.compile(r"\s*,", re.DOTALL).match(text, position)
            position = comma.end() if comma else position
        if len(fields) == 3:
            try:
                schema = json.loads(fields[2])
            except json.JSONDecodeError:
                continue
            tools[match.group(1)] = {
                "type": "function",
                "function": {"name": fields[0], "description": fields[1], "parameters": schema},
            }
    return tools


def _chain_tools(chain: str, declared: dict[str, dict[str, Any]]) -> list[dict[str, Any]] | None:
    found = re.search(r"\.tools\(\s*\{([^}]*)\}", chain)
    if found is None:
        return None
    names = [name.strip() for name in found.group(1).split(",") if name.strip()]
    if not all(name in declared for name in names):
        return None
    return [declared[name] for name in names]


def _tools(calls: list[tuple[str, Any]], fallback: bool) -> list[dict[str, Any]]:
    names: dict[str, set[str]] = {}
    for name, arguments in calls:
        names.setdefault(name, set()).update(arguments or {})
    if not names and fallback:
        names = {"special_function": {"arg1"}}
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {"type": "object", "properties": {k: {} for k in sorted(keys)}},
            },
        }
        for name, keys in names.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_chat", type=Path, help="llama.cpp's tests/test-chat.cpp")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = args.test_chat.read_text(encoding="utf-8")
    constants = _messages(text)
    declared = _declared_tools(text)
    blocks = [
        (m.start(), m.group(1))
        for m in re.finditer(r'peg_tester\("models/templates/([^"]+)\.jinja"', text)
    ]
    by_family: dict[str, list[dict[str, Any]]] = {}
    for index, (block_start, template) in enumerate(blocks):
        block_end = blocks[index + 1][0] if index + 1 < len(blocks) else len(text)
        family = "llamacpp_" + re.sub(r"[^a-z0-9]+", "_", template.lower()).strip("_")
        for test in re.finditer(r"tst\.test\(", text[block_start:block_end]):
            at = block_start + test.end()
            literals, after = _literals(text, at)
            if not literals:
                continue
            output = "".join(literals)
            if not re.compile(r"\s*\)").match(text, after):
                continue  # the output is built from variables too: not a plain string
            run = re.compile(r"\.\s*run\(\)").search(text, after)
            chain = re.sub(r"\.\s+", ".", text[after : run.start()]) if run else ""
            if any(marker in chain for marker in _SKIP):
                continue
            expected: list[tuple[str, str]] | None = _call_list(chain)
            content: str | None = None
            helper = _helper_call(chain)
            if expected is None and helper is not None:
                expected, content = helper
            if expected is None:
                named = re.search(r"\.expect\((\w+)\)", chain)
                if named is None or named.group(1) not in constants:
                    continue
                constant = constants[named.group(1)]
                expected = constant["calls"]
                content = constant["content"] or None
            decoded = [(name, _arguments(raw)) for name, raw in expected]
            if any(arguments is None for _, arguments in decoded):
                decoded = []  # the expected call is cut off: for the proxy, no call
            line = text.count("\n", 0, at) + 1
            cases = by_family.setdefault(family, [])
            cases.append(
                {
                    "id": f"{family}-{len(cases) + 1:03d}-line{line}",
                    "family": family,
                    "text": output,
                    "tools": _chain_tools(chain, declared) or _tools(decoded, ".tools(" in chain),
                    "expected_calls": [{"name": n, "arguments": a} for n, a in decoded],
                    "expected_content": content,
                    "marker_stripped": False,
                    "wrapper_markers": [],
                    "provenance": {"source": SOURCE, "line": line, "template": template},
                }
            )
    args.out.mkdir(parents=True, exist_ok=True)
    for family, cases in sorted(by_family.items()):
        with (args.out / f"{family}.jsonl").open("w", encoding="utf-8") as handle:
            for case in cases:
                handle.write(json.dumps(case, ensure_ascii=False) + "\n")
        print(f"{family}: {len(cases)} cases")


if __name__ == "__main__":
    main()
