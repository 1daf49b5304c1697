"""The client key a request presents: the one credential authentication checks and tenancy uses.

``CREDENTIAL_HEADERS`` lists every accepted form, in precedence order: ``Authorization: Bearer``
(the OpenAI SDKs and most frameworks), then ``x-api-key`` (the Anthropic SDKs). The first form
that carries a non-empty key wins, so a request sending both is the tenant of its Bearer key,
exactly the key it was authenticated with. Authentication (``asgi/routes.py``), the tenant id
(``episodes/budget.TenantKeys``) and the headers kept from the upstream (``upstream/client.py``)
all read this one tuple, so a new form cannot be accepted without its tenancy.

Azure's ``api-key`` header is not accepted: the Azure OpenAI clients also rewrite every path
(``/openai/deployments/<name>/...``), which the proxy does not serve, so accepting the header
would add a credential no working client sends. It is still never relayed upstream with the
client's key when client keys are set (it is dropped with the others).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CREDENTIAL_HEADERS", "DROPPED_HEADERS", "presented_key"]

# (lower-case header name, lower-case scheme prefix or ""), in precedence order.
CREDENTIAL_HEADERS: tuple[tuple[str, str], ...] = (
    ("authorization", "bearer "),
    ("x-api-key", ""),
)

# Headers that may carry a client's key: never forwarded upstream when client keys are set.
DROPPED_HEADERS: frozenset[bytes] = frozenset(
    {*(name.encode() for name, _ in CREDENTIAL_HEADERS), b"api-key"}
)


def presented_key(headers: Mapping[str, str]) -> str:
    """The client key of a request (``""`` when it sends none): the first accepted form that
    carries one, its scheme removed and surrounding whitespace stripped."""
    for name, scheme in CREDENTIAL_HEADERS:
        value = headers.get(name, "")
        if scheme:
            value = value[len(scheme) :] if value[: len(scheme)].lower() == scheme else ""
        value = value.strip()
        if value:
            return value
    return ""
