"""The recognisers in precedence order (family label -> recogniser), their opening markers, and
``find_native_calls``, which runs them over one text."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from repairproxy.native.base import MAX_MATCHES, NativeMatch, Scanner, Schemas
from repairproxy.native.gemma import gemma_format, gemma_may
from repairproxy.native.json_formats import apertus, cohere, fenced_json, llama3_json, marker_json
from repairproxy.native.minimax_m3 import M3, minimax_m3
from repairproxy.native.pythonic import (
    bare_lines_may,
    lfm2_list,
    pythonic_bare,
    pythonic_bare_lines,
    pythonic_lines,
    pythonic_list,
    pythonic_may,
    pythonic_wrapped,
)
from repairproxy.native.templated import (
    LFM2_END,
    PYTHON_TAG,
    functionary_v32,
    functionary_v32_may,
    gigachat,
    hunyuan_v3_opensource,
    kimi_k3,
    lfm2_json,
    lfm2_unopened,
    llama_python_tag,
    minicpm,
    nemotron,
    solar_open,
    tool_call_pythonic,
    tool_call_recipient,
    wrapped_json,
)
from repairproxy.native.tokens import (
    DS_CALL_BEGIN,
    DS_CALLS_BEGIN,
    KIMI_SECTION,
    MISTRAL,
    deepseek,
    harmony,
    kimi,
    kimi_may,
    mistral,
    mistral_may,
)
from repairproxy.native.xml_formats import (
    bare_function_xml,
    glm_format,
    glm_may,
    invoke_format,
    tagged_xml,
)

__all__ = [
    "FAMILIES",
    "GATES",
    "RECOGNISERS",
    "VARIANT_OF",
    "Gate",
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
            "minimax_m2",
            "",
            (("<minimax:tool_call>", "</minimax:tool_call>"), ("<tool_calls>", "</tool_calls>")),
            bare=True,
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
            "seed_oss",
            "<seed:tool_call>",
            "</seed:tool_call>",
            ("<seed:think>", "</seed:think>"),
            exact=True,
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
        "lfm2_json": lfm2_json,
        "lfm2_unopened": lfm2_unopened,
        "olmo3": pythonic_wrapped("olmo3", "<function_calls>", "</function_calls>", pythonic_lines),
        "nemotron_v2": nemotron,
        "gigachat": gigachat,
        "minicpm": minicpm,
        "llama3_python_tag": llama_python_tag,
        "functionary_v32": functionary_v32,
        "hermes_wrapped": wrapped_json,
        "solar_open": solar_open,
        "kimi_k3": kimi_k3,
        "hunyuan_v3_opensource": hunyuan_v3_opensource,
        "tool_call_recipient": tool_call_recipient,
        "tool_call_pythonic": tool_call_pythonic,
        "muse_glimmer": invoke_format(
            "muse_glimmer",
            "atem:",
            (("<atem:function_calls>", "</atem:function_calls>"),),
            bare=False,
        ),
        "qwen3_xml_bare": bare_function_xml,
        "fenced_json": fenced_json,
        "pythonic": pythonic_bare,
        "granite_pythonic": pythonic_bare_lines,
        "json": llama3_json,
    }
)

Check = Callable[[str, "Schemas | None"], bool]

# The Hermes-style wrappers ``hermes_wrapped`` reads (templated.wrapped_json).
_WRAPPER_TAGS = ("tool", "tools", "response", "json", "xml")
# Recognisers that read another variant of a family: their matches carry the family's label.
VARIANT_OF = MappingProxyType(
    {
        "qwen3_xml_bare": "qwen3_xml",
        "lfm2_json": "lfm2",
        "lfm2_unopened": "lfm2",
        "hermes_wrapped": "hermes",
        "tool_call_pythonic": "hermes",
        "hunyuan_v3_opensource": "hunyuan_v3",
        "tool_call_recipient": "openai_harmony",
    }
)


@dataclass(frozen=True, slots=True)
class Gate:
    """What a recogniser cannot match without: one of ``alternatives`` holds, each a set of
    substrings that must all occur in the text and, when they do, an optional further check.

    ``find_native_calls`` looks for every gate's substrings in one sweep over the text
    (``_present``), so a recogniser runs only where its markers are; calling a gate on its own
    does the same for one recogniser.
    """

    alternatives: tuple[tuple[frozenset[str], Check | None], ...]

    def __call__(self, text: str, schemas: Schemas | None) -> bool:
        markers = frozenset(m for needs, _ in self.alternatives for m in needs if m in text)
        return self.admits(text, markers, schemas)

    def admits(self, text: str, present: frozenset[str], schemas: Schemas | None) -> bool:
        """Whether the recogniser may match, given the gates' substrings ``present`` in text."""
        for needs, check in self.alternatives:
            if needs <= present and (check is None or check(text, schemas)):
                return True
        return False


def _needs(*markers: str, check: Check | None = None) -> tuple[frozenset[str], Check | None]:
    return frozenset(markers), check


def _gate(*alternatives: tuple[frozenset[str], Check | None]) -> Gate:
    return Gate(tuple(alternatives))


def _has(*markers: str) -> Gate:
    return _gate(_needs(*markers))


# What each recogniser cannot match without (the markers, then a cheap check where the format
# has none): most answers hold no family's marker, and running every recogniser on them is
# most of the cost of reading a text call. Each gate is a necessary condition of its
# recogniser, no more (tested on the corpus).
GATES: Mapping[str, Gate] = MappingProxyType(
    {
        "openai_harmony": _has("<|message|>", "functions."),
        "deepseek": _has(DS_CALL_BEGIN),
        "deepseek_dsml": _has("<｜DSML｜invoke"),
        "kimi_k2": _gate(_needs(KIMI_SECTION[0]), _needs("{", ":", check=kimi_may)),
        "step3": _has("<steptml:invoke"),
        "minimax_m3": _has(M3 + "<tool_call>"),
        "minimax_m2": _has("<invoke"),
        "gemma4": _gate(_needs("{", "call:", check=gemma_may), _needs("{", "<call>")),
        "functiongemma": _gate(_needs("{", "call:", check=gemma_may), _needs("{", "<call>")),
        "hunyuan_v3": _gate(_needs("<tool_sep>", "<tool_call>", "</tool_call>", check=glm_may)),
        "glm": _gate(_needs("<tool_call>", "</tool_call>", check=glm_may)),
        "seed_oss": _has("<seed:tool_call>", "<function="),
        "qwen3_xml": _has("<tool_call>", "<function="),
        "hermes": _has("<tool_call>"),
        "tool_calls_json": _has("<tool_calls>"),
        "granite": _has("<|tool_call|>"),
        "granite_20b_fc": _has("<function_call>"),
        "internlm2": _has("<|action_start|><|plugin|>"),
        "phi4mini": _has("functools"),
        "apertus": _has("<|tools_prefix|>"),
        "cohere_command": _has("<|START_ACTION|>"),
        "mistral": _gate(_needs(MISTRAL), _needs("{", check=mistral_may)),
        "llama4_pythonic": _has("<|python_start|>"),
        "lfm2": _has("<|tool_call_start|>"),
        "lfm2_json": _has("<|tool_call_start|>"),
        "lfm2_unopened": _has(LFM2_END),
        "olmo3": _has("<function_calls>"),
        "nemotron_v2": _has("<TOOLCALL>"),
        "gigachat": _gate(_needs("<|function_call|>"), _needs("function call<|role_sep|>")),
        "minicpm": _has("<function name="),
        "llama3_python_tag": _has(PYTHON_TAG),
        "functionary_v32": _gate(_needs("{", check=functionary_v32_may)),
        "hermes_wrapped": _gate(*(_needs(f"<{tag}>", f"</{tag}>") for tag in _WRAPPER_TAGS)),
        "solar_open": _has("<|tool_call:name|>"),
        "kimi_k3": _has("<|open|>tools<|sep|>"),
        "hunyuan_v3_opensource": _has("<tool_call:opensource>"),
        "tool_call_recipient": _has("<tool_call>", "to=functions."),
        "tool_call_pythonic": _has("<tool_call>", "("),
        "muse_glimmer": _has("<atem:invoke"),
        "qwen3_xml_bare": _has("<function="),
        "fenced_json": _has("```"),
        "pythonic": _gate(_needs("[", "(", check=pythonic_may)),
        "granite_pythonic": _gate(_needs("(", check=bare_lines_may)),
        "json": _has('"name"'),
    }
)


def _by_first_character(markers: Iterable[str]) -> Mapping[str, tuple[str, ...]]:
    groups: dict[str, list[str]] = {}
    for marker in sorted(set(markers)):
        groups.setdefault(marker[0], []).append(marker)
    return MappingProxyType({first: tuple(group) for first, group in groups.items()})


# Every gate's substrings, grouped by their first character: a text without ``<`` is searched
# for none of the tag markers.
_GATE_MARKERS = _by_first_character(
    marker for gate in GATES.values() for needs, _ in gate.alternatives for marker in needs
)


def _keyed(gates: Mapping[str, Gate]) -> Mapping[str, frozenset[str]]:
    """Marker -> the families with an alternative that needs it (its longest marker): only those
    can pass where the marker occurs."""
    keyed: dict[str, set[str]] = {}
    for family, gate in gates.items():
        for needs, _ in gate.alternatives:
            keyed.setdefault(max(sorted(needs), key=len), set()).add(family)
    return MappingProxyType({marker: frozenset(group) for marker, group in keyed.items()})


_KEYED = _keyed(GATES)


# Families whose every match starts at an occurrence of this marker: where each occurrence lies
# inside a match taken already, they cannot add one (it would overlap), so they do not run
# (Qwen3's ``<function=`` inside its ``<tool_call>``, read once, not twice).
_STARTS_AT: Mapping[str, str] = MappingProxyType(
    {"glm": "<tool_call>", "hermes": "<tool_call>", "qwen3_xml_bare": "<function="}
)


def _all_taken(scanner: Scanner, marker: str, taken: Sequence[NativeMatch]) -> bool:
    """Whether every occurrence of ``marker`` lies inside a match in ``taken``."""
    position = 0
    while True:
        found = scanner.find(marker, position)
        if found < 0:
            return True
        if not any(match.start <= found < match.end for match in taken):
            return False
        position = found + len(marker)


# A first character's only marker is searched for directly (as cheap as its first character);
# a first character with several is searched for first, then each of them where it occurs.
_ALONE = tuple(markers[0] for markers in _GATE_MARKERS.values() if len(markers) == 1)
_GROUPED = tuple((first, m) for first, m in _GATE_MARKERS.items() if len(m) > 1)


def _present(scanner: Scanner) -> frozenset[str]:
    """The gates' substrings that occur in the text: one search per first character with several
    markers, then one per marker of the characters found; one per lone marker."""
    text = scanner.text
    present = []
    for marker in _ALONE:
        if marker in text:
            present.append(marker)
    searches = len(_ALONE) + len(_GROUPED)
    for first, markers in _GROUPED:
        if first in text:
            searches += len(markers)
            for marker in markers:
                if marker in text:
                    present.append(marker)
    scanner.count(searches * len(text))
    return frozenset(present)


# The labels a promotion's format can carry (metrics, log, header): the families and "other".
FAMILIES: tuple[str, ...] = tuple(sorted({VARIANT_OF.get(f, f) for f in RECOGNISERS} | {"other"}))

# Each family's opening markers: a stream whose text may still open one is held (the gate).
_OPENING_MARKERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "openai_harmony": ("<|channel|>", "<|start|>", "to=functions."),
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
        "nemotron_v2": ("<TOOLCALL>",),
        "gigachat": ("<|function_call|>", "<|message_sep|>"),
        "minicpm": ("<function name=",),
        "llama3_python_tag": (PYTHON_TAG,),
        "functionary_v32": (">>>",),
        "hermes_wrapped": tuple(f"<{tag}>" for tag in _WRAPPER_TAGS),
        "solar_open": ("<|tool_calls|>", "<|tool_call:begin|>"),
        "kimi_k3": ("<|open|>tools", "<|open|>response"),
        "hunyuan_v3_opensource": ("<tool_calls:opensource>", "<tool_call:opensource>"),
        "muse_glimmer": ("<atem:function_calls>", "<atem:invoke"),
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
    family = VARIANT_OF.get(family, family)
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


@functools.lru_cache(maxsize=256)
def _candidates(
    present: frozenset[str], skip: frozenset[str]
) -> tuple[tuple[str, Recogniser, Gate], ...]:
    """The families whose gate may pass where the gates' substrings ``present`` occur, less
    ``skip``, in precedence order (few sets of substrings recur: computed once per set)."""
    maybe = {family for marker in present for family in _KEYED.get(marker, ())}
    return tuple(
        (family, recognise, GATES[family])
        for family, recognise in RECOGNISERS.items()
        if family in maybe and family not in skip
    )


# DeepSeek's markers as models and servers also write them: the bars ASCII or fullwidth, the
# angle brackets ASCII or a guillemet (``‹|tool▁calls▁begin|>``). One character each way, so
# the canonical spelling keeps every offset.
_DS_MARKER = re.compile(r"[<‹][|｜]((?:DSML[|｜])?tool▁[a-z▁]{1,24})[|｜][>›]")


def canonical_bars(text: str) -> str:
    """``text`` with DeepSeek's markers in their canonical spelling (same length)."""
    if "▁" not in text:
        return text
    return _DS_MARKER.sub(lambda m: "<｜" + m.group(1).replace("|", "｜") + "｜>", text)


def find_native_calls(
    text: str,
    tools: Schemas | Sequence[Mapping[str, Any]] | None = None,
    *,
    scanner: Scanner | None = None,
    skip: Collection[str] = (),
) -> list[NativeMatch]:
    """Every call written in a family's native format in ``text``, in order of appearance.

    ``tools``: the declared tools (a request's ``tools`` list, or name -> parameters schema), used
    to type values the format wrote as text and to accept marker-less variants only for declared
    names; without them string values stay strings (``NativeCall.string_values``). Matches never
    overlap: the first recogniser in ``RECOGNISERS`` to claim text keeps it. ``skip``: families
    not to run (a caller that reads those shapes itself). Only the recognisers whose gate's
    markers occur in the text run (one sweep finds them).
    """
    scan = scanner if scanner is not None else Scanner(canonical_bars(text))
    schemas = tools if type(tools) is dict else _schemas_of(tools)
    taken: list[NativeMatch] = []
    text = scan.text
    present = _present(scan)
    for family, recognise, gate in _candidates(present, frozenset(skip)):
        if not gate.admits(text, present, schemas):
            continue
        starts_at = _STARTS_AT.get(family)
        if taken and starts_at is not None and _all_taken(scan, starts_at, taken):
            continue
        for match in recognise(scan, schemas):
            if not match.calls or any(match.start < m.end and m.start < match.end for m in taken):
                continue
            taken.append(match)
    taken.sort(key=lambda match: match.start)
    return taken[:MAX_MATCHES]
