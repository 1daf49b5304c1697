"""Tenancy: with client keys, each key is its own tenant; nobody spends or reads another's budget.

Real proxies on loopback before scripted upstreams (chat and Responses), the official openai
client where it helps; the start-up refusal runs ``python -m repairproxy`` as a child process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.proxy.conftest import StartProxy
from tests.support.processes import ROOT, free_port
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call, message
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES, TOOLS

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-9876543210"
ERROR_HISTORY = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("get_order_details", {"order_id": "#W1"}, "call_x")],
    },
    {"role": "tool", "tool_call_id": "call_x", "content": "Error: order #W1 not found"},
]


def _chat(proxy: RunningProxy, key: str, messages: list[Any], **headers: str) -> httpx.Response:
    return httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": messages, "tools": TOOLS},
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def _keyed(start_proxy: StartProxy, **overrides: Any) -> RunningProxy:
    return start_proxy(api_keys=(KEY_A, KEY_B), tenant_secret="s3cret", **overrides)


def test_a_stranger_naming_anothers_episode_id_spends_its_own_budget(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    proxy = _keyed(start_proxy, budget=1, on_budget_exhausted="reject")
    upstream.push(completion(content="Here it is."))
    # B spends "shared-1" to its budget of 1 (its error result is counted, the request refused) ...
    spent = _chat(proxy, KEY_B, ERROR_HISTORY, **{"x-episode-id": "shared-1"})
    assert spent.status_code == 403
    assert spent.headers["x-repairproxy-episode-errors"] == "1"
    # ... and A's episode of the same name is untouched.
    own = _chat(proxy, KEY_A, MESSAGES, **{"x-episode-id": "shared-1"})
    assert own.status_code == 200, own.text
    assert own.headers["x-repairproxy-episode-errors"] == "0"
    assert own.headers["x-repairproxy-episode-id"] == "shared-1"
    # B's own episode is spent: reject applies to B alone.
    assert _chat(proxy, KEY_B, MESSAGES, **{"x-episode-id": "shared-1"}).status_code == 403
    logged = proxy._log.snapshot()
    assert KEY_A.encode() not in logged and KEY_B.encode() not in logged


def test_chaining_joins_neither_another_tenant_nor_another_model(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    proxy = _keyed(start_proxy)
    answer = {"role": "assistant", "content": "It shipped yesterday."}
    upstream.push(*(completion(content=answer["content"]) for _ in range(4)))
    first = _chat(proxy, KEY_A, MESSAGES)
    episode = first.headers["x-repairproxy-episode-id"]
    follow = [*MESSAGES, answer, {"role": "user", "content": "Thanks!"}]
    assert _chat(proxy, KEY_A, follow).headers["x-repairproxy-episode-id"] == episode
    assert _chat(proxy, KEY_B, follow).headers["x-repairproxy-episode-id"] != episode
    other_model = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "another-model", "messages": follow, "tools": TOOLS},
        headers={"authorization": f"Bearer {KEY_A}"},
        timeout=30,
    )
    assert other_model.headers["x-repairproxy-episode-id"] != episode


@pytest.fixture
def responses_upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as scripted:
        yield scripted


def test_a_foreign_previous_response_id_is_unknown_and_charges_nothing(
    responses_upstream: ResponsesUpstream,
) -> None:
    settings = Settings(
        upstream=responses_upstream.base_url,
        api_keys=(KEY_A, KEY_B),
        tenant_secret="s3cret",
        repair=RepairMode.OFF,
    )
    with ExitStack() as stack:
        proxy = stack.enter_context(running_proxy(settings))
        a = openai.OpenAI(base_url=proxy.base_url, api_key=KEY_A, max_retries=0)
        b = openai.OpenAI(base_url=proxy.base_url, api_key=KEY_B, max_retries=0)
        responses_upstream.push([function_call("get_order_details", {"order_id": "#W1"})])
        tools: Any = [{"type": "function", "name": "get_order_details", "parameters": {}}]
        raw = a.responses.with_raw_response.create(model="m", input="Where?", tools=tools)
        turn = raw.parse()
        episode = raw.headers["x-repairproxy-episode-id"]
        call = next(i for i in turn.output if i.type == "function_call")
        output: Any = [
            {"type": "function_call_output", "call_id": call.call_id, "output": "Error: no"}
        ]
        sent_before = len(responses_upstream.requests)
        with pytest.raises(openai.NotFoundError) as caught:
            b.responses.create(model="m", previous_response_id=turn.id, input=output)
        assert episode not in caught.value.response.text
        assert episode not in str(dict(caught.value.response.headers))
        assert len(responses_upstream.requests) == sent_before  # never forwarded
        # A's episode was charged nothing by B: A's own continuation counts only its result.
        responses_upstream.push([message("Done.")])
        again = a.responses.with_raw_response.create(
            model="m", previous_response_id=turn.id, input=output
        )
        assert again.headers["x-repairproxy-episode-id"] == episode
        assert again.headers["x-repairproxy-episode-errors"] == "1"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1000000", "--allow-client-budget"),
        (b"\xb2", "X-Repairproxy-Budget"),  # "²" in Latin-1: str.isdigit() says yes
        ("9" * 5000, "X-Repairproxy-Budget"),
        ("-3", "X-Repairproxy-Budget"),
    ],
    ids=["raise", "superscript", "5000-digits", "negative"],
)
def test_a_client_budget_may_only_lower_the_proxys(
    value: str | bytes, needle: str, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(budget=10, on_budget_exhausted="reject")
    response = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers=[(b"x-repairproxy-budget", value if isinstance(value, bytes) else value.encode())],
        timeout=30,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert needle in error["message"]
    assert error["param"] == "x-repairproxy-budget"


def test_a_lower_client_budget_applies_and_the_flag_allows_a_higher_one(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    upstream.push(completion(content="a"), completion(content="b"))
    lower = start_proxy(budget=10)
    sent = httpx.post(
        lower.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers={"x-repairproxy-budget": "3"},
        timeout=30,
    )
    assert sent.status_code == 200
    assert sent.headers["x-repairproxy-budget-remaining"] == "3"
    higher = start_proxy(budget=10, allow_client_budget=True)
    sent = httpx.post(
        higher.base_url + "/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers={"x-repairproxy-budget": "50"},
        timeout=30,
    )
    assert sent.status_code == 200
    assert sent.headers["x-repairproxy-budget-remaining"] == "50"


def test_an_empty_api_key_refuses_to_start() -> None:
    command = [sys.executable, "-m", "repairproxy", "serve", "--upstream", "http://127.0.0.1:9"]
    command += ["--port", str(free_port()), "--api-key", ""]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--api-key is empty" in done.stderr


def test_an_evicted_spent_episode_stays_spent_and_evictions_are_counted(
    start_proxy: StartProxy, upstream: ScriptedUpstream
) -> None:
    proxy = _keyed(
        start_proxy,
        budget=1,
        on_budget_exhausted="reject",
        max_episode_memory=40_000,
        metrics=True,
    )
    assert _chat(proxy, KEY_A, ERROR_HISTORY, **{"x-episode-id": "spent"}).status_code == 403
    upstream.push(*(completion(content="ok") for _ in range(40)))
    for index in range(40):  # A's own churn pushes "spent" out of its share (20,000 bytes)
        assert _chat(proxy, KEY_A, MESSAGES, **{"x-episode-id": f"new-{index}"}).status_code == 200
    again = _chat(proxy, KEY_A, MESSAGES, **{"x-episode-id": "spent"})
    assert again.status_code == 403, again.text  # back from its tombstone, not with a full budget
    exposition = httpx.get(proxy.root_url + "/metrics", timeout=30).text
    evicted = [
        line
        for line in exposition.splitlines()
        if line.startswith('repairproxy_episode_evictions_total{reason="tenant_quota"}')
    ]
    assert evicted and float(evicted[0].split()[-1]) > 0
