"""Episode and tenant keys: the ids clients name (hashed when long) and the tenant each key is,
so a store key names one episode of one tenant (``scoped``). Moved out of ``budget`` whole."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Any

import orjson

from repairproxy.credentials import presented_key

__all__ = [
    "MAX_EPISODE_ID_CHARS",
    "TenantKeys",
    "bounded",
    "episode_id_for",
    "header_episode_id",
    "scoped",
]

# Client-chosen episode ids longer than this are hashed: ids live in memory and in log lines.
MAX_EPISODE_ID_CHARS = 128


def bounded(value: str, limit: int, prefix: str) -> str:
    """``value``, or ``prefix`` + its hash when it is longer than ``limit``."""
    if len(value) <= limit:
        return value
    return (
        prefix + hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    )


def header_episode_id(headers: Mapping[str, str], name: str) -> str | None:
    """The episode id a header names (any case; stripped; hashed when long), else None."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    if value:
        value = value.strip()
    return bounded(value, MAX_EPISODE_ID_CHARS, "h-") if value else None


def episode_id_for(
    headers: Mapping[str, str], body: Mapping[str, Any], header_name: str = "x-episode-id"
) -> str:
    """Deprecated (until the pipeline calls ``ErrorBudget.resolve_episode``): the header, else a
    fingerprint of (model, system prompt, first user message), which merges every run of a task.
    """
    explicit = header_episode_id(headers, header_name)
    if explicit is not None:
        return explicit
    system: Any = None
    first_user: Any = None
    for message in body.get("messages") or ():
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if system is None and role in ("system", "developer"):
            system = message.get("content")
        elif role == "user":
            first_user = message.get("content")
            break
    try:
        opening = orjson.dumps([body.get("model"), system, first_user], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        opening = repr((body.get("model"), system, first_user)).encode()
    return "fp-" + hashlib.blake2b(opening, digest_size=12).hexdigest()


def scoped(tenant: str, name: str) -> str:
    """A store key for ``name`` that no other tenant can reach."""
    return f"{tenant}/{name}" if tenant else name


class TenantKeys:
    """Tenant ids from client keys: ``t-`` + HMAC-SHA256(secret, key), truncated.

    The key is ``credentials.presented_key``'s: whichever accepted header carried it
    (``Authorization: Bearer`` first, then ``x-api-key``), one key is one tenant.

    The secret must be the same on every replica so one client is one tenant everywhere;
    ``generated`` says it was made up for this process only.
    """

    def __init__(self, secret: str | None) -> None:
        self.generated = not secret
        self._secret = (secret or secrets.token_hex(32)).encode()

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        token = presented_key(headers)  # exactly the key authentication accepted
        digest = hmac.new(self._secret, token.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return "t-" + digest.hexdigest()[:24]
