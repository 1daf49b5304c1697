"""Failures are OpenAI-shaped errors with the right status; upstream errors pass through as they
are; keys never leak; other routes are relayed; a client that hangs up cancels the upstream."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.proxy.conftest import StartProxy
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import (
    Reply,
    ScriptedUpstream,
    completion,
    error_reply,
    tool_call,
)
from tests.support.tools import MESSAGES, TOOLS


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens once the socket is closed


def _assert_openai_error(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["message"]
    return dict(error)


def _post(proxy: RunningProxy, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(
        proxy.base_url + "/chat/completions",
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=10,
    )


def test_malformed_json_is_400(upstream: ScriptedUpstream, proxy: RunningProxy) -> None:
    _assert_openai_error(_post(proxy, b'{"model": "m", "messages": ['), 400, "invalid_json")
    _assert_openai_error(_post(proxy, b"[1, 2]"), 400, "invalid_json")
    assert upstream.requests == []


def test_body_over_the_limit_is_413(upstream: ScriptedUpstream, start_proxy: StartProxy) -> None:
    proxy = start_proxy(max_body_bytes=2_000)
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5_000}]}
    _assert_openai_error(_post(proxy, big), 413, "payload_too_large")
    assert upstream.requests == []


def test_invalid_tool_schema_is_400_naming_the_tool(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    broken = {
        "type": "function",
        "function": {"name": "broken_tool", "parameters": {"type": "objekt"}},
    }
    with (
        openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client.chat.completions.create(model="m", messages=MESSAGES, tools=[*TOOLS, broken])
    assert caught.value.status_code == 400
    assert "broken_tool" in str(caught.value)
    assert upstream.requests == []


def test_upstream_refused_is_502(start_proxy: StartProxy) -> None:
    proxy = start_proxy(upstream=f"http://127.0.0.1:{_closed_port()}/v1")
    _assert_openai_error(
        _post(proxy, {"model": "m", "messages": MESSAGES}), 502, "upstream_unavailable"
    )
    stream = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True}
    _assert_openai_error(_post(proxy, stream), 502, "upstream_unavailable")
    assert httpx.get(proxy.root_url + "/healthz").status_code == 200  # still alive


def test_upstream_dropping_the_connection_is_502(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(Reply(fault="close"))
    _assert_openai_error(
        _post(proxy, {"model": "m", "messages": MESSAGES}), 502, "upstream_unavailable"
    )


def test_upstream_timeout_is_504(upstream: ScriptedUpstream, start_proxy: StartProxy) -> None:
    proxy = start_proxy(upstream_timeout=0.3)
    upstream.push(completion(content="late", delay=1.0))
    started = time.monotonic()
    _assert_openai_error(
        _post(proxy, {"model": "m", "messages": MESSAGES}), 504, "upstream_timeout"
    )
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_error_status_passes_through(
    status: int, stream: bool, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    reply = error_reply(status, f"upstream says {status}")
    upstream.push(reply)
    response = _post(proxy, {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": stream})
    assert response.status_code == status
    assert response.content == orjson.dumps(reply.body)


def test_proxy_keys_are_checked_and_never_forwarded(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(api_keys=("sk-proxy-1", "sk-proxy-2"))
    body = {"model": "m", "messages": MESSAGES}
    _assert_openai_error(_post(proxy, body), 401, "invalid_api_key")
    _assert_openai_error(
        _post(proxy, body, authorization="Bearer sk-wrong"), 401, "invalid_api_key"
    )
    assert upstream.requests == []
    upstream.push(completion(content="ok"))
    assert _post(proxy, body, authorization="Bearer sk-proxy-2").status_code == 200
    assert "authorization" not in upstream.requests[-1].headers
    models = httpx.get(proxy.base_url + "/models")
    _assert_openai_error(models, 401, "invalid_api_key")


def test_upstream_key_replaces_the_client_key(
    upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    proxy = start_proxy(upstream_api_key="sk-upstream-secret")
    upstream.push(completion(content="ok"))
    response = _post(proxy, {"model": "m", "messages": MESSAGES}, authorization="Bearer sk-client")
    assert response.status_code == 200
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream-secret"
    assert "sk-upstream-secret" not in repr(response.headers) + response.text
    models = httpx.get(proxy.base_url + "/models", headers={"authorization": "Bearer sk-client"})
    assert models.status_code == 200
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream-secret"


def test_without_keys_the_client_authorization_is_forwarded(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    upstream.push(completion(content="ok"))
    _post(proxy, {"model": "m", "messages": MESSAGES}, authorization="Bearer sk-end-to-end")
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-end-to-end"


def test_other_v1_routes_are_relayed(upstream: ScriptedUpstream, proxy: RunningProxy) -> None:
    with openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["scripted-model"]
    response = httpx.post(proxy.base_url + "/embeddings?dims=8", json={"input": "hello"})
    assert response.status_code == 200
    echoed = response.json()
    assert echoed["path"] == "/v1/embeddings?dims=8"
    assert orjson.loads(echoed["body"]) == {"input": "hello"}


def test_health_and_readiness(
    upstream: ScriptedUpstream, proxy: RunningProxy, start_proxy: StartProxy
) -> None:
    assert httpx.get(proxy.root_url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(proxy.root_url + "/readyz").status_code == 200
    dead = start_proxy(upstream=f"http://127.0.0.1:{_closed_port()}")
    assert httpx.get(dead.root_url + "/healthz").status_code == 200
    assert httpx.get(dead.root_url + "/readyz").status_code == 503


def test_unknown_route_is_404(proxy: RunningProxy) -> None:
    _assert_openai_error(httpx.get(proxy.root_url + "/nope"), 404, "not_found")


@pytest.mark.parametrize(
    "header", [{"x-repairproxy-repair": "sometimes"}, {"x-repairproxy-budget": "-3"}]
)
def test_bad_override_headers_are_400(header: dict[str, str], proxy: RunningProxy) -> None:
    _assert_openai_error(_post(proxy, {"model": "m", "messages": MESSAGES}, **header), 400, None)


@pytest.mark.parametrize("tools", [False, True])
def test_client_disconnect_cancels_the_upstream_stream(
    tools: bool, upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    content = "Let me check that order for you right now, one moment please."
    upstream.push(completion(content=content, event_delay=0.25))
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
    if tools:
        body["tools"] = TOOLS
    with httpx.stream(
        "POST", proxy.base_url + "/chat/completions", json=body, timeout=10
    ) as response:
        first = next(response.iter_bytes())
        assert b"data:" in first
    deadline = time.monotonic() + 5
    while upstream.aborted_streams == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.aborted_streams == 1
    deadline = time.monotonic() + 2
    while not proxy.log_lines() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.log_lines()[-1]["status"] == 499


def test_a_crash_inside_a_request_is_a_500_not_a_dead_process(
    upstream: ScriptedUpstream, proxy: RunningProxy
) -> None:
    # An answer whose message is not an object makes no sense; the proxy must still answer.
    body = completion(tool_calls=[tool_call("get_order_details", {"order_id": "1"})]).body
    body["choices"][0]["message"]["tool_calls"] = "garbage"
    upstream.push(Reply(body=body))
    response = _post(proxy, {"model": "m", "messages": MESSAGES, "tools": TOOLS})
    assert response.status_code in (200, 500)
    assert httpx.get(proxy.root_url + "/healthz").status_code == 200
