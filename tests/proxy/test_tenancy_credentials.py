"""One key is one tenant, whichever accepted header carries it.

The credential forms are read from the authentication code itself
(``repairproxy.credentials.CREDENTIAL_HEADERS``, the tuple ``Proxy._authenticate`` iterates), and
every tenant-scoped surface is run for each: episodes, conversation chains, the Responses store
(``GET``, ``DELETE``, ``input_items``, ``previous_response_id``), its per-key memory share, and
the Redis keys, in memory and on a real ``redis-server``. A form added to the tuple is covered
here without a new line; a form authentication accepted but tenancy ignored (``x-api-key`` before
this file) makes every key that uses it one shared tenant, and these tests fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from repairproxy.credentials import CREDENTIAL_HEADERS, presented_key
from repairproxy.episodes.budget import TenantKeys
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from tests.proxy.conftest import StartProxy
from tests.support.processes import RedisServer, redis_server
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-9876543210"
SECRET = "s3cret"
Headers = Callable[[str], dict[str, str]]


def _form(name: str, scheme: str) -> Headers:
    prefix = scheme.strip().capitalize() + " " if scheme else ""
    return lambda key: {name: prefix + key}


FORMS: dict[str, Headers] = {name: _form(name, scheme) for name, scheme in CREDENTIAL_HEADERS}


def _errors(results: int) -> list[dict[str, Any]]:
    calls = [
        tool_call("get_order_details", {"order_id": f"#W{n}"}, f"c{n}") for n in range(results)
    ]
    history: list[dict[str, Any]] = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    history += [
        {"role": "tool", "tool_call_id": f"c{n}", "content": f"Error: order #W{n} not found"}
        for n in range(results)
    ]
    return history


def test_the_forms_are_the_ones_authentication_reads() -> None:
    """Every form authenticates and names its key; both sent: the Bearer key, as in auth."""
    assert [name for name, _ in CREDENTIAL_HEADERS] == ["authorization", "x-api-key"]
    for headers in FORMS.values():
        assert presented_key(headers(KEY_A)) == KEY_A
    both = {"authorization": f"Bearer {KEY_A}", "x-api-key": KEY_B}
    assert presented_key(both) == KEY_A
    assert presented_key({"authorization": "Basic abc", "x-api-key": KEY_B}) == KEY_B
    assert presented_key({"api-key": KEY_A}) == ""  # Azure's header: not accepted (documented)
    tenants = TenantKeys(SECRET)
    of = {name: tenants.tenant_of(headers(KEY_A)) for name, headers in FORMS.items()}
    assert len(set(of.values())) == 1
    assert tenants.tenant_of(both) == of["authorization"]
    assert all(tenants.tenant_of(h(KEY_B)) not in of.values() for h in FORMS.values())


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def _post(proxy: RunningProxy, path: str, headers: dict[str, str], body: Any) -> httpx.Response:
    return httpx.post(proxy.base_url + path, json=body, headers=headers, timeout=30)


def _chat(
    proxy: RunningProxy, headers: dict[str, str], messages: list[Any], episode: str | None = None
) -> httpx.Response:
    extra = {"x-episode-id": episode} if episode else {}
    body = {"model": "m", "messages": messages, "tools": TOOLS}
    response = _post(proxy, "/chat/completions", {**headers, **extra}, body)
    assert response.status_code == 200, response.text
    return response


def _stored(
    proxy: RunningProxy, method: str, headers: dict[str, str], response_id: str, tail: str = ""
) -> int:
    url = f"{proxy.base_url}/responses/{response_id}{tail}"
    return httpx.request(method, url, headers=headers, timeout=30).status_code


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("form", list(FORMS))
def test_every_surface_is_the_tenants_whichever_header_carries_its_key(
    form: str,
    store: str,
    start_proxy: StartProxy,
    upstream: ScriptedUpstream,
    request: pytest.FixtureRequest,
) -> None:
    overrides: dict[str, Any] = {"max_responses_memory": 40_000}
    if store == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        overrides["episode_store"] = server.url
        asyncio.run(_flush(server.url))
    proxy = start_proxy(
        api_keys=(KEY_A, KEY_B), tenant_secret=SECRET, upstream_apis=("chat",), **overrides
    )
    a = FORMS[form](KEY_A)
    upstream.push(*(completion(content="ok") for _ in range(200)))

    # Episodes: A's error, sent in this form, is A's in every form and nobody else's.
    assert _chat(proxy, a, _errors(1), "e").headers["x-repairproxy-episode-errors"] == "1"
    for other in FORMS.values():
        own = _chat(proxy, other(KEY_A), MESSAGES, "e")
        assert own.headers["x-repairproxy-episode-errors"] == "1"
        stranger = _chat(proxy, other(KEY_B), MESSAGES, "e")
        assert stranger.headers["x-repairproxy-episode-errors"] == "0"

    # Chains: A continues its conversation in any form; B sending the same history does not.
    opening = [{"role": "user", "content": f"chain opened with {form}"}]
    episode = _chat(proxy, a, opening).headers["x-repairproxy-episode-id"]
    follow = [*opening, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "?"}]
    for other in FORMS.values():
        assert _chat(proxy, other(KEY_A), follow).headers["x-repairproxy-episode-id"] == episode
        assert _chat(proxy, other(KEY_B), follow).headers["x-repairproxy-episode-id"] != episode

    # The Responses store: A's answer is A's in every form, never B's in any.
    made = _post(proxy, "/responses", a, {"model": "m", "input": "Remember #W1."})
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    for other in FORMS.values():
        b = other(KEY_B)
        assert _stored(proxy, "GET", b, rid) == 404
        assert _stored(proxy, "GET", b, rid, "/input_items") == 404
        assert _stored(proxy, "DELETE", b, rid) == 404
        chained = {"model": "m", "input": "and?", "previous_response_id": rid}
        assert _post(proxy, "/responses", b, chained).status_code == 404
        assert _stored(proxy, "GET", other(KEY_A), rid) == 200
        assert _stored(proxy, "GET", other(KEY_A), rid, "/input_items") == 200

    # The per-key memory share: B filling its share, in any form, never evicts A's answer.
    for n, other in enumerate(list(FORMS.values()) * 6):
        long = {"model": "m", "input": f"{n} " + "long question " * 280}
        assert _post(proxy, "/responses", other(KEY_B), long).status_code == 200
    assert _stored(proxy, "GET", a, rid) == 200

    # Message threads: A's thread is continued by A alone, whichever form either sends.
    thread_opening: dict[str, Any] = {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Hi"}],
        "thread": {"type": "create"},
    }
    created = _post(proxy, "/messages", a, thread_opening)
    assert created.status_code == 200, created.text
    turn = {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "More?"}],
        "thread": {"type": "continue", "previous_message_id": created.json()["id"]},
    }
    for other in FORMS.values():
        refused = _post(proxy, "/messages", other(KEY_B), turn)
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["details"]["error_code"] == "thread_not_found"
    assert _post(proxy, "/messages", list(FORMS.values())[-1](KEY_A), turn).status_code == 200

    # Redis: every key the run wrote is under A's or B's tenant, none under a keyless one.
    if store == "redis":
        tenants = TenantKeys(SECRET)
        expected = {tenants.tenant_of({"authorization": f"Bearer {k}"}) for k in (KEY_A, KEY_B)}
        found = asyncio.run(_tenants_in_redis(server.url))
        assert found and found <= expected, found

    last = list(FORMS.values())[-1](KEY_A)
    assert _stored(proxy, "DELETE", last, rid) == 200
    assert _stored(proxy, "GET", a, rid) == 404


async def _flush(url: str) -> None:
    from repairproxy.episodes.redis_store import redis_client

    client = redis_client(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


async def _tenants_in_redis(url: str) -> set[str]:
    """The tenant part of every episode, Responses and thread key (chain links are digests)."""
    from repairproxy.episodes.redis_store import redis_client

    client = redis_client(url)
    found: set[str] = set()
    try:
        async for raw in client.scan_iter(match="repairproxy:*"):
            key = raw.decode()
            rest = key.removeprefix("repairproxy:").removeprefix("threads:")
            kind, _, scoped = rest.partition(":")
            if kind == "ch":
                continue
            found.add(scoped.partition("/")[0])
    finally:
        await client.aclose()
    return found


@pytest.mark.parametrize(("policy", "warned"), [("allkeys-lru", True), ("volatile-lru", False)])
def test_a_redis_that_may_evict_episode_keys_is_named_at_start_up(
    policy: str, warned: bool, start_proxy: StartProxy
) -> None:
    with redis_server("--maxmemory-policy", policy) as server:
        proxy = start_proxy(episode_store=server.url)
        logged = proxy._log.snapshot().decode()
        assert ('"redis_eviction_policy"' in logged) is warned, logged[-2000:]
        if warned:
            assert policy in logged


# -- fair eviction in the in-process store ---------------------------------------------------------


def test_another_tenants_churn_neither_evicts_nor_resets_a_tenants_counts(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    """--max-episodes 40, two keys: A's 300 counted errors survive B opening 100 spent episodes
    (before: A, the largest tenant by bytes, was evicted, and B's tombstones pushed A's out)."""
    proxy = start_proxy(api_keys=(KEY_A, KEY_B), tenant_secret=SECRET, budget=1000, max_episodes=40)
    a, b = FORMS["authorization"](KEY_A), FORMS["x-api-key"](KEY_B)
    upstream.push(*(completion(content="ok") for _ in range(110)))
    spent = _chat(proxy, a, _errors(300), "a-spent")
    assert spent.headers["x-repairproxy-episode-errors"] == "300"
    for n in range(100):
        _chat(proxy, b, _errors(1), f"b-{n}")
    again = _chat(proxy, a, MESSAGES, "a-spent")
    assert again.headers["x-repairproxy-episode-errors"] == "300"


def test_a_tenants_share_of_episodes_and_tombstones_is_its_own() -> None:
    async def main() -> None:
        store = MemoryEpisodeStore(40, tenant_episodes=20)
        for n in range(5):
            await store.update(f"ta/{n}", lambda s: s.count("unknown_tool"))
        for n in range(500):  # B's churn: spent episodes, evicted into B's own tombstones
            await store.update(f"tb/{n}", lambda s: s.count("unknown_tool"))
        assert len(store) <= 40
        for n in range(5):
            kept = await store.get(f"ta/{n}")
            assert kept is not None and kept.errors == 1
        for n in range(25):  # A's own churn evicts A's own, whose counts come back
            await store.update(f"ta/x{n}", lambda s: s.count("unknown_tool"))
        revived = await store.get("ta/0")
        assert revived is not None and revived.errors == 1

    asyncio.run(main())


# -- /dashboard ------------------------------------------------------------------------------------


def _status(url: str, key: str | None = None, header: str = "authorization") -> int:
    headers = {} if key is None else FORMS[header](key)
    return httpx.get(url, headers=headers, timeout=30).status_code


def test_the_dashboard_shows_every_tenant_only_to_the_metrics_key(start_proxy: StartProxy) -> None:
    keyed = start_proxy(api_keys=(KEY_A, KEY_B), metrics_api_key="m", metrics=True)
    page = keyed.root_url + "/dashboard"
    for header in FORMS:
        assert _status(page, KEY_A, header) == 401
        assert _status(page, "m", header) == 200
    unkeyed = start_proxy(api_keys=(KEY_A, KEY_B), metrics=True)
    assert _status(unkeyed.root_url + "/dashboard", KEY_A) == 403
