"""Tool results as τ²-bench writes them into ``role: tool`` messages (``Environment.to_json_str``).

Strings pass through unchanged; anything else becomes JSON in which pydantic models are dumped in
Python mode, scalars nested in containers become their ``str()`` (τ²-bench's quirk: a float inside a
dict reads ``"2.0"``), dates at container level become ISO strings, and whatever ``json`` cannot
encode (dates inside models) falls back to ``str()``.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from pydantic import BaseModel

__all__ = ["to_json_str"]


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, int | float | bool):
        return str(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, datetime.date):  # datetime.datetime is a date too
        return value.isoformat()
    raise ValueError(f"Unsupported type: {type(value)}")


def to_json_str(value: Any) -> str:
    """Serialise one tool's return value the way τ²-bench v1.0.1 does."""
    if isinstance(value, str):
        return value
    return json.dumps(_plain(value), default=str)
