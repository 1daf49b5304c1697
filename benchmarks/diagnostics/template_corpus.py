"""Write ``tests/data/textcalls/templates/<family>.jsonl``: what each family's own chat template
writes for a call, and for prose.

The templates are the ones llama.cpp ships (``models/templates/`` inside the llama-cpp-python
sdist the project builds). Each is rendered with jinja2 (a sandbox, as servers do) twice: the
conversation up to the generation prompt, and the same conversation with the assistant's turn
added (one call, a string value, a multi-line value, two calls, prose then a call, prose only).
The assistant's turn is what the second adds to the first, less the end-of-turn token servers
strip as a stop token. A case is kept only when the call's name and every argument value appear
in that text (the template wrote the call), so a template that cannot render a call adds none.

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp/sdist
    python -m benchmarks.diagnostics.template_corpus \
        /tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates

jinja2 is a development tool here (it is not a dependency of the proxy); the corpus is
committed, and ``tests/proxy/test_template_corpus.py`` reads it without jinja2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "textcalls" / "templates"
SOURCE = "llama-cpp-python==0.3.36 sdist, vendor/llama.cpp/models/templates/"


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS = [
    _tool("special_function", {"arg1": {"type": "integer"}}, ["arg1"]),
    _tool(
        "get_weather",
        {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        ["location"],
    ),
    _tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path"]),
]

# (case, assistant content, calls)
SHAPES: list[tuple[str, str, list[tuple[str, dict[str, Any]]]]] = [
    ("call_integer", "", [("special_function", {"arg1": 1})]),
    ("call_string", "", [("get_weather", {"location": "San Francisco, CA", "unit": "f"})]),
    (
        "call_multiline",
        "",
        [("write_file", {"path": "a.py", "content": 'def f(x):\n    return "x"\n'})],
    ),
    ("two_calls", "", [("special_function", {"arg1": 1}), ("get_weather", {"location": "Paris"})]),
    ("prose_then_call", "Let me check the weather.", [("get_weather", {"location": "Lisbon"})]),
    ("prose_only", "Hello, world!\nWhat's up?", []),
]

# End-of-turn tokens servers strip as stop tokens (the text never holds them).
STOP_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "</s>",
    "<|END_OF_TURN_TOKEN|>",
    "<end_of_turn>",
    "<turn|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<｜end▁of▁sentence｜>",
    "<SPECIAL_12>",
    "<|message_sep|>",
    "<seed:eos>",
    "[e~[",
    "<|im_end|>",
    "<|end_of_turn|>",
    "<|eos|>",
    "<|tool_response>",
    "<end_of_sentence>",
    "<|role_end|>",
    "<|end_of_message|>",
    "<｜hy_eos:opensource｜>",
)


def _environment() -> Any:
    import jinja2  # a development tool: only this generator needs it
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(
        value: Any,
        indent: int | None = None,
        ensure_ascii: bool = False,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            indent=indent,
            ensure_ascii=ensure_ascii,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime(2026, 1, 1).strftime(f)
    return env


def _assistant(content: str, calls: list[tuple[str, dict[str, Any]]], as_text: bool) -> Any:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call{i:05d}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(a) if as_text else a},
            }
            for i, (n, a) in enumerate(calls)
        ]
    return message


def _turn(template: Any, content: str, calls: list[tuple[str, dict[str, Any]]]) -> str | None:
    base = [{"role": "user", "content": "Hey there"}]
    options = {"tools": TOOLS, "bos_token": "<s>", "eos_token": "</s>"}
    for as_text in (False, True):
        try:
            prompt = template.render(messages=base, add_generation_prompt=True, **options)
            plain = template.render(messages=base, add_generation_prompt=False, **options)
            full = template.render(
                messages=[*base, _assistant(content, calls, as_text)],
                add_generation_prompt=False,
                **options,
            )
        except Exception:
            continue
        if not full.startswith(plain):
            continue
        # What the generation prompt already wrote of the turn (its header, an opened or
        # empty reasoning block) is the prompt's, not the model's.
        header = prompt[len(plain) :]
        turn = full[len(plain) :]
        shared = _common_prefix(turn, header)
        if len(shared) < len(header):  # the two part inside a token: keep the whole token
            shared = shared[: max(shared.rfind(">"), shared.rfind("\n")) + 1]
        turn = turn[len(shared) :]
        # The server stops at the first stop token after the model began writing.
        lead = len(turn) - len(turn.lstrip())
        stops = [found for token in STOP_TOKENS if (found := turn.find(token, lead + 1)) >= 0]
        if stops:
            turn = turn[: min(stops)]
        return str(turn).rstrip()
    return None


def _common_prefix(a: str, b: str) -> str:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return a[:length]


def _written(turn: str, calls: list[tuple[str, dict[str, Any]]]) -> bool:
    for name, arguments in calls:
        if name not in turn:
            return False
        for value in arguments.values():
            text = str(value)
            if text not in turn and json.dumps(value)[1:-1] not in turn:
                return False
    return True


def _family(stem: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("templates", type=Path, help="llama.cpp's models/templates/ folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    env = _environment()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in sorted(args.templates.glob("*.jinja")):
        try:
            template = env.from_string(path.read_text(encoding="utf-8"))
        except Exception:
            print(f"{path.name}: not parsed")
            continue
        family = _family(path.stem)
        cases = []
        for shape, content, calls in SHAPES:
            turn = _turn(template, content, calls)
            if turn is None or not turn.strip():
                continue
            if calls and not _written(turn, calls):
                continue
            cases.append(
                {
                    "id": f"{family}-{shape}",
                    "family": family,
                    "text": turn,
                    "tools": TOOLS,
                    "expected_calls": [{"name": n, "arguments": a} for n, a in calls],
                    "expected_content": (content or None) if content in turn else None,
                    "marker_stripped": False,
                    "wrapper_markers": [],
                    "provenance": {"source": SOURCE, "template": path.name, "shape": shape},
                }
            )
        if not any(case["expected_calls"] for case in cases):
            print(f"{path.name}: writes no call")
            continue
        target = args.out / f"{family}.jsonl"
        with target.open("w", encoding="utf-8") as handle:
            for case in cases:
                handle.write(json.dumps(case, ensure_ascii=False) + "\n")
        print(f"{path.name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
