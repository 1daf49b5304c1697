"""GBNF grammars for forced tool choice (the constrained decoding the proxy escalates to) and for
``response_format`` (structured outputs, which vLLM serves by guided decoding too).

With ``tool_choice`` naming a tool, or ``"required"``, the answer must be ``<tool_call>`` blocks
whose ``name`` is a declared tool (the named one, or any declared one) and whose ``arguments``
follow that tool's parameter schema where llama.cpp's JSON-Schema converter can express it, else
any JSON object.
Sampling without a tool choice never uses a grammar for calls, so invented names stay possible
there. A ``response_format`` of ``json_object`` constrains the answer to a JSON object, one of
``json_schema`` to its schema where the converter can express it (else to a JSON object).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "GENERIC_JSON_GBNF",
    "JSON_OBJECT_GBNF",
    "SchemaToGbnf",
    "forced_call_grammar",
    "forced_tool_names",
    "response_format_grammar",
]

SchemaToGbnf = Callable[[str], str]

# Any JSON object as arguments: the fallback when a parameter schema cannot be converted.
GENERIC_JSON_GBNF = r"""
call ::= "{\"name\": " name ", \"arguments\": " object "}"
object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
value ::= object | array | string | number | "true" | "false" | "null"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]{0,2}
"""


def forced_tool_names(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The names a grammar must allow, or None when the tool choice leaves the model free."""
    declared = [t.get("function", t).get("name", "") for t in tools]
    if isinstance(tool_choice, Mapping):
        name = tool_choice.get("function", {}).get("name") or tool_choice.get("name")
        return [name] if name else None
    if tool_choice == "required" and declared:
        return declared
    return None


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function", tool)
    parameters = function.get("parameters") or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": function.get("name", "")}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _wrap(call_rules: str, *, several: bool) -> str:
    blocks = ' ( "\\n" block )*' if several else ""
    return (
        f'root ::= block{blocks}\nblock ::= "<tool_call>\\n" call "\\n</tool_call>"\n{call_rules}'
    )


def forced_call_grammar(
    names: Sequence[str],
    tools: Sequence[Mapping[str, Any]],
    *,
    several: bool = False,
    schema_to_gbnf: SchemaToGbnf | None = None,
) -> str:
    """GBNF for one (or, with ``several``, one or more) ``<tool_call>`` blocks over ``names``.

    ``schema_to_gbnf`` is llama.cpp's JSON-Schema converter (injected, so this module needs no
    runtime); when it is absent or fails on a schema, arguments fall back to any JSON object.
    """
    by_name = {t.get("function", t).get("name", ""): t for t in tools}
    chosen = [by_name.get(n, {"function": {"name": n}}) for n in names]
    if schema_to_gbnf is not None:
        schemas = [_call_schema(t) for t in chosen]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        try:
            converted = schema_to_gbnf(json.dumps(schema))
        except Exception:  # the converter rejects some schemas ($ref into tool-local $defs, ...)
            converted = ""
        if converted and "root ::=" in converted:
            return _wrap(converted.replace("root ::=", "call ::=", 1), several=several)
    name_rule = "name ::= " + " | ".join(json.dumps(json.dumps(n)) for n in names)
    return _wrap(GENERIC_JSON_GBNF.strip() + "\n" + name_rule, several=several)


# Any JSON object as the whole answer: ``json_object``, and a schema the converter cannot express.
JSON_OBJECT_GBNF = "root ::= ws object ws\n" + "\n".join(
    line for line in GENERIC_JSON_GBNF.strip().splitlines() if not line.startswith("call ::=")
)


def response_format_grammar(
    response_format: Any, schema_to_gbnf: SchemaToGbnf | None = None
) -> str | None:
    """GBNF for the answer a ``response_format`` asks for; None for ``text`` or no format."""
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return JSON_OBJECT_GBNF
    if kind != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if isinstance(schema, Mapping) and schema_to_gbnf is not None:
        try:
            converted = schema_to_gbnf(json.dumps(schema))
        except Exception:  # the converter rejects some schemas: any JSON object then
            converted = ""
        if "root ::=" in converted:
            return converted
    return JSON_OBJECT_GBNF
