"""Values a native format wrote as text, typed by the declared schema (as vLLM's XML parsers do),
and Python literals read without evaluating anything."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from typing import Any

from repairproxy.native.base import MAX_DEPTH, NOT_JSON, Malformed, Schemas, loads

__all__ = [
    "INTEGER",
    "NAMED_CONSTANTS",
    "allowed_types",
    "literal",
    "typed_arguments",
    "typed_value",
]


def allowed_types(spec: Any) -> set[str]:
    """The JSON types a property schema admits (``type``, a list of them, ``anyOf``/``oneOf``)."""
    if not isinstance(spec, Mapping):
        return set()
    kinds: set[str] = set()
    kind = spec.get("type")
    if isinstance(kind, str):
        kinds.add(kind)
    elif isinstance(kind, list):
        kinds.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf"):
        options = spec.get(key)
        if isinstance(options, list):
            for option in options:
                kinds |= allowed_types(option)
    if not kinds and "enum" in spec and isinstance(spec["enum"], list):
        kinds.update("string" if isinstance(v, str) else "number" for v in spec["enum"])
    if not kinds and ("properties" in spec):
        kinds.add("object")
    return kinds


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def typed_value(raw: str, spec: Any) -> Any:
    """A value the format wrote as text, typed by its property schema (as vLLM's XML parsers do).

    A string property keeps the text; otherwise the text is read as JSON (then as a Python
    literal: ``True``, ``None``, single quotes) when that gives a type the schema admits.
    """
    kinds = allowed_types(spec)
    if not kinds or kinds == {"string"}:
        return raw
    text = raw.strip()
    value = loads(text)
    if value is NOT_JSON and INTEGER.fullmatch(text) and kinds & {"integer", "number"}:
        return int(text)  # a leading zero (``018956``) is not JSON but is the number
    if value is NOT_JSON:
        value = _python_literal(text)
    if value is not NOT_JSON:
        kind = _json_kind(value)
        if kind in kinds or (kind == "integer" and "number" in kinds):
            return value
        if kind == "number" and "integer" in kinds and float(value).is_integer():
            return int(value)
    return raw


INTEGER = re.compile(r"-?\d{1,40}")


def _python_literal(text: str) -> Any:
    try:
        node = ast.parse(text, mode="eval").body
        return literal(node, 0)
    except (SyntaxError, ValueError, RecursionError, MemoryError, Malformed):
        return NOT_JSON


NAMED_CONSTANTS = {"True": True, "False": False, "None": None, "true": True, "false": False}
NAMED_CONSTANTS["null"] = None


def literal(node: ast.expr, depth: int) -> Any:
    """A Python (or JSON-spelled) literal as a JSON value; sets and tuples become lists."""
    if depth > MAX_DEPTH:
        raise Malformed
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise Malformed  # bytes, complex, inf
    if isinstance(node, ast.Name) and node.id in NAMED_CONSTANTS:
        return NAMED_CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = literal(node.operand, depth + 1)
        if isinstance(inner, bool) or not isinstance(inner, (int, float)):
            raise Malformed
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [literal(item, depth + 1) for item in node.elts]
    if isinstance(node, ast.Dict):
        result: dict[str, Any] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                raise Malformed
            name = literal(key_node, depth + 1)
            if not isinstance(name, (str, int, float)) or isinstance(name, bool):
                raise Malformed
            result[str(name)] = literal(value_node, depth + 1)
        return result
    raise Malformed


def typed_arguments(
    name: str, arguments: dict[str, str], schemas: Schemas | None
) -> tuple[dict[str, Any], bool]:
    """Text values typed by ``name``'s schema; ``(arguments, True)`` untyped when no schema."""
    schema = schemas.get(name) if schemas is not None else None
    if schema is None:
        return dict(arguments), True
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    return {key: typed_value(value, properties.get(key)) for key, value in arguments.items()}, False
