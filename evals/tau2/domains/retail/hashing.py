"""The DB hash: sha256 of ``json.dumps(db.model_dump(), sort_keys=True, default=str)``.

Serialising 1,000 orders takes ~130 ms, and an episode leaves all but a few of them untouched, still
shared with the pristine store (see ``tools.py``). So the canonical text of each pristine object is
built once per loaded domain and reused; only objects an episode changed are serialised again. The
result is byte-for-byte the text that serialising the whole database at once gives.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from evals.tau2.domains.retail.db import RetailDB

__all__ = ["CanonicalCache", "canonical_json"]

_TABLES = ("orders", "products", "users")  # RetailDB's fields, in sorted order


def canonical_json(data: Any) -> str:
    """Canonical JSON: sorted keys, τ²-bench's ``default=str`` fallback."""
    return json.dumps(data, sort_keys=True, default=str)


def _join(entries: list[tuple[str, str]]) -> str:
    # Mirrors json.dumps's default separators for an object whose values are already serialised.
    return "{" + ", ".join(f"{json.dumps(key)}: {text}" for key, text in entries) + "}"


class CanonicalCache:
    """Canonical JSON of a pristine database's objects, built on first use."""

    def __init__(self, pristine: RetailDB) -> None:
        self._pristine = pristine
        self._texts: dict[str, dict[str, str]] | None = None

    def _pristine_texts(self) -> dict[str, dict[str, str]]:
        if self._texts is None:
            self._texts = {
                table: {
                    key: canonical_json(value.model_dump())
                    for key, value in getattr(self._pristine, table).items()
                }
                for table in _TABLES
            }
        return self._texts

    def text(self, db: RetailDB) -> str:
        """``canonical_json(db.model_dump())``, reusing the text of still-pristine objects."""
        texts = self._pristine_texts()
        tables = []
        for table in _TABLES:
            current: dict[str, BaseModel] = getattr(db, table)
            pristine: dict[str, BaseModel] = getattr(self._pristine, table)
            entries = []
            for key in sorted(current):
                value = current[key]
                if pristine.get(key) is value:
                    entries.append((key, texts[table][key]))
                else:
                    entries.append((key, canonical_json(value.model_dump())))
            tables.append((table, _join(entries)))
        return _join(tables)

    def hash(self, db: RetailDB) -> str:
        """sha256 (hex) of :meth:`text`; equal in every process for equal databases."""
        return hashlib.sha256(self.text(db).encode("utf-8")).hexdigest()
