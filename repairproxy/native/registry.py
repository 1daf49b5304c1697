"""The recognisers in precedence order (family label -> recogniser), their opening markers, and
``find_native_calls``, which runs them over one text."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from repairproxy.native.base import MAX_MATCHES, NativeMatch, Scanner, Schemas
from repairproxy.native.gemma import gemma_format
from repairproxy.native.json_formats import apertus, cohere, fenced_json, llama3_json, marker_json
from repairproxy.native.pythonic import (
    lfm2_list,
    pythonic_bare,
    pythonic_bare_lines,
    pythonic_lines,
    pythonic_list,
    pythonic_wrapped,
)
from repairproxy.native.tokens import (
    DS_CALL_BEGIN,
    DS_CALLS_BEGIN,
    KIMI_SECTION,
    MISTRAL,
    deepseek,
    harmony,
    kimi,
    mistral,
)
from repairproxy.native.xml_formats import (
    M3,
    bare_function_xml,
    glm_format,
    invoke_format,
    minimax_m3,
    tagged_xml,
)

__all__ = [
    "FAMILIES",
    "GATES",
    "RECOGNISERS",
    "Recogniser",
    "find_native_calls",
    "opening_markers",
    "promoted_format",
]

Recogniser = Callable[[Scanner, "Schemas | None"], list[NativeMatch]]

# Family label -> recogniser, in precedence order: a match claims its text, so later (looser,
# marker-less) recognisers never read inside an earlier one's match.
RECOGNISERS: Mapping[str, Recogniser] = MappingProxyType(
    {
        "openai_harmony": harmony,
        "deepseek": deepseek,
        "deepseek_dsml": invoke_format(
            "deepseek_dsml",
            "｜DSML｜",
            (
                ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),
                ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
            ),
            bare=False,
            string_attribute=True,
        ),
        "kimi_k2": kimi,
        "step3": invoke_format(
            "step3", "steptml:", (("<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"),), bare=True
        ),
        "minimax_m3": minimax_m3,
        "minimax_m2": invoke_format(
            "minimax_m2", "", (("<minimax:tool_call>", "</minimax:tool_call>"),), bare=True
        ),
        "gemma4": gemma_format(
            "gemma4",
            '<|"|>',
            ("<|tool_call>", "<channel|>"),
            ("<tool_call|>", "<turn|>"),
            bare=True,
        ),
        "functiongemma": gemma_format(
            "functiongemma",
            "<escape>",
            ("<start_function_call>",),
            ("<end_function_call>",),
            bare=False,
        ),
        "hunyuan_v3": glm_format("hunyuan_v3", "<tool_sep>", ("<tool_calls>", "</tool_calls>")),
        "glm": glm_format("glm", "", None),
        "seed_oss": tagged_xml(
            "seed_oss", "<seed:tool_call>", "</seed:tool_call>", ("<seed:think>", "</seed:think>")
        ),
        "qwen3_xml": tagged_xml("qwen3_xml", "<tool_call>", "</tool_call>"),
        "hermes": marker_json("hermes", "<tool_call>", "</tool_call>"),
        "tool_calls_json": marker_json("tool_calls_json", "<tool_calls>", "</tool_calls>"),
        "granite": marker_json("granite", "<|tool_call|>", None, lists_only=True),
        "granite_20b_fc": marker_json("granite_20b_fc", "<function_call>", None),
        "internlm2": marker_json("internlm2", "<|action_start|><|plugin|>", "<|action_end|>"),
        "phi4mini": marker_json("phi4mini", "functools", None, lists_only=True),
        "apertus": apertus,
        "cohere_command": cohere,
        "mistral": mistral,
        "llama4_pythonic": pythonic_wrapped(
            "llama4_pythonic", "<|python_start|>", "<|python_end|>", pythonic_list
        ),
        "lfm2": pythonic_wrapped("lfm2", "<|tool_call_start|>", "<|tool_call_end|>", lfm2_list),
        "olmo3": pythonic_wrapped("olmo3", "<function_calls>", "</function_calls>", pythonic_lines),
        "qwen3_xml_bare": bare_function_xml,
        "fenced_json": fenced_json,
        "pythonic": pythonic_bare,
        "granite_pythonic": pythonic_bare_lines,
        "json": llama3_json,
    }
)

Gate = Callable[[str, "Schemas | None"], bool]


def _has(marker: str) -> Gate:
    return lambda text, schemas: marker in text


def _has_both(first: str, second: str) -> Gate:
    return lambda text, schemas: first in text and second in text


def _kimi_may(text: str, schemas: Schemas | None) -> bool:
    if KIMI_SECTION[0] in text:
        return True
    # Stripped: ``functions.NAME:0 {`` or ``NAME:0 {`` for a declared name.
    if "{" not in text or ":" not in text:
        return False
    return "functions." in text or any(f"{name}:" in text for name in schemas or ())


def _gemma_may(text: str, schemas: Schemas | None) -> bool:
    return "{" in text and ("call:" in text or "<call>" in text)


# What each recogniser cannot match without (checked before it runs, a few substring tests):
# most answers hold no family's marker, and running every recogniser on them is most of the
# cost of reading a text call. Each gate is a necessary condition of its recogniser, no more.
GATES: Mapping[str, Gate] = MappingProxyType(
    {
        "openai_harmony": _has_both("<|message|>", "functions."),
        "deepseek": _has(DS_CALL_BEGIN),
        "deepseek_dsml": _has("<｜DSML｜invoke"),
        "kimi_k2": _kimi_may,
        "step3": _has("<steptml:invoke"),
        "minimax_m3": _has(M3 + "<tool_call>"),
        "minimax_m2": _has("<invoke"),
        "gemma4": _gemma_may,
        "functiongemma": _gemma_may,
        "hunyuan_v3": _has_both("<tool_sep>", "<tool_call>"),
        "glm": _has("<tool_call>"),
        "seed_oss": _has_both("<seed:tool_call>", "<function="),
        "qwen3_xml": _has_both("<tool_call>", "<function="),
        "hermes": _has("<tool_call>"),
        "tool_calls_json": _has("<tool_calls>"),
        "granite": _has("<|tool_call|>"),
        "granite_20b_fc": _has("<function_call>"),
        "internlm2": _has("<|action_start|><|plugin|>"),
        "phi4mini": _has("functools"),
        "apertus": _has("<|tools_prefix|>"),
        "cohere_command": _has("<|START_ACTION|>"),
        "mistral": lambda text, schemas: MISTRAL in text or (schemas is not None and "{" in text),
        "llama4_pythonic": _has("<|python_start|>"),
        "lfm2": _has("<|tool_call_start|>"),
        "olmo3": _has("<function_calls>"),
        "qwen3_xml_bare": _has("<function="),
        "fenced_json": _has("```"),
        "pythonic": _has_both("[", "("),
        "granite_pythonic": lambda text, schemas: schemas is not None and "(" in text,
        "json": _has('"name"'),
    }
)


# The labels a promotion's format can carry (metrics, log, header): the families and "other".
FAMILIES: tuple[str, ...] = tuple(
    sorted({"qwen3_xml" if f == "qwen3_xml_bare" else f for f in RECOGNISERS} | {"other"})
)

# Each family's opening markers: a stream whose text may still open one is held (the gate).
_OPENING_MARKERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "openai_harmony": ("<|channel|>", "<|start|>"),
        "deepseek": (DS_CALLS_BEGIN, DS_CALL_BEGIN),
        "deepseek_dsml": ("<｜DSML｜function_calls>", "<｜DSML｜tool_calls>"),
        "kimi_k2": (KIMI_SECTION[0], "<|tool_call_begin|>", "functions."),
        "step3": ("<｜tool_calls_begin｜>", "<steptml:invoke"),
        "minimax_m3": (M3,),
        "minimax_m2": ("<minimax:tool_call>", "<invoke name="),
        "gemma4": ("<|tool_call>", "<|channel>", "<call>", "call:"),
        "functiongemma": ("<start_function_call>",),
        "hunyuan_v3": ("<tool_calls>",),
        "glm": ("<tool_call>",),
        "seed_oss": ("<seed:tool_call>",),
        "qwen3_xml": ("<tool_call>", "<function="),
        "hermes": ("<tool_call>",),
        "tool_calls_json": ("<tool_calls>",),
        "granite": ("<|tool_call|>",),
        "granite_20b_fc": ("<function_call>",),
        "internlm2": ("<|action_start|>",),
        "phi4mini": ("functools[",),
        "apertus": ("<|tools_prefix|>",),
        "cohere_command": ("<|START_ACTION|>", "<|START_THINKING|>"),
        "mistral": (MISTRAL,),
        "llama4_pythonic": ("<|python_start|>",),
        "lfm2": ("<|tool_call_start|>",),
        "olmo3": ("<function_calls>",),
    }
)


def opening_markers() -> tuple[str, ...]:
    """Every family's opening markers, deduplicated, longest first (the stream gate holds
    on them)."""
    markers = {marker for group in _OPENING_MARKERS.values() for marker in group}
    return tuple(sorted(markers, key=lambda marker: (-len(marker), marker)))


# The shapes of ``textcalls`` that are one family's format already.
_SHAPE_FORMATS = MappingProxyType(
    {"tool_call_tag": "hermes", "function_xml": "qwen3_xml", "fenced_json": "fenced_json"}
)
_SHAPE_FORMATS_JSON = "json"


def promoted_format(shape: str, source: str, family: str | None = None) -> str:
    """The bounded label (one of ``FAMILIES``) of a promoted text call, from its shape and text
    (or the recogniser's own ``family`` label, when it is known): for metrics, the log line and
    ``X-Repairproxy-Promoted-Format``."""
    if shape == _SHAPE_FORMATS_JSON:
        return "json"
    if shape in _SHAPE_FORMATS:
        return _SHAPE_FORMATS[shape]
    if family is None:
        matches = find_native_calls(source)
        family = matches[0].family if matches else "other"
    family = "qwen3_xml" if family == "qwen3_xml_bare" else family
    return family if family in FAMILIES else "other"


def _schemas_of(tools: Any) -> Schemas | None:
    """name -> parameters schema, from a request's ``tools`` list or such a mapping already."""
    if tools is None:
        return None
    if isinstance(tools, Mapping):
        return tools
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    return schemas


def find_native_calls(
    text: str,
    tools: Schemas | Sequence[Mapping[str, Any]] | None = None,
    *,
    scanner: Scanner | None = None,
) -> list[NativeMatch]:
    """Every call written in a family's native format in ``text``, in order of appearance.

    ``tools``: the declared tools (a request's ``tools`` list, or name -> parameters schema), used
    to type values the format wrote as text and to accept marker-less variants only for declared
    names; without them string values stay strings (``NativeCall.string_values``). Matches never
    overlap: the first recogniser in ``RECOGNISERS`` to claim text keeps it.
    """
    scan = scanner if scanner is not None else Scanner(text)
    schemas = _schemas_of(tools)
    taken: list[NativeMatch] = []
    text = scan.text
    for family, recognise in RECOGNISERS.items():
        scan.count(len(text))  # the gate: a substring search or two
        if not GATES[family](text, schemas):
            continue
        for match in recognise(scan, schemas):
            if not match.calls or any(match.start < m.end and m.start < match.end for m in taken):
                continue
            taken.append(match)
    taken.sort(key=lambda match: match.start)
    return taken[:MAX_MATCHES]
