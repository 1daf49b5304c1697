"""upstream.Upstream in process, against the scripted transport: URL mapping, headers, proxies,
errors. (The pool itself is tested on real sockets in test_http1.py and test_conformance.py.)"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from repairproxy.errors import (
    BadRequestError,
    UpstreamBadAnswerError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from repairproxy.settings import Settings
from repairproxy.upstream.client import (
    Upstream,
    UpstreamTimer,
    UpstreamURL,
    chat_completion_of,
    proxy_from_environment,
    response_headers,
    timed,
)
from tests.support.mock_transport import MockTransport
from tests.support.proxy_server import running_proxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion, error_reply
from tests.support.servers import raw_server


@pytest.mark.parametrize(
    ("base", "path", "query", "expected"),
    [
        ("http://h:8000", "/v1/chat/completions", b"", "/v1/chat/completions"),
        ("http://h:8000/", "/v1/models", b"", "/v1/models"),
        ("http://h:8000/v1", "/v1/chat/completions", b"", "/v1/chat/completions"),
        ("http://h:8000/v1/", "/v1/files/a%2Fb", b"x=1", "/v1/files/a%2Fb?x=1"),
        ("http://h/v1beta/openai/", "/v1/chat/completions", b"", "/v1beta/openai/chat/completions"),
        ("http://h/v1beta/openai", "/v1/models", b"", "/v1beta/openai/models"),
        ("https://h/openai?api-version=1", "/v1/models", b"", "/openai/models?api-version=1"),
        ("https://h/openai?v=1", "/v1/files", b"limit=2", "/openai/files?v=1&limit=2"),
    ],
)  # fmt: skip
def test_the_base_url_is_kept_as_given(base: str, path: str, query: bytes, expected: str) -> None:
    assert UpstreamURL.parse(base).target(path, query) == expected


@pytest.mark.anyio
async def test_requests_reach_the_mapped_target_with_userinfo_as_basic_auth() -> None:
    transport = MockTransport(completion(content="hi"))
    upstream = Upstream("http://us%40er:p%3Ass@h/v1beta/openai/?k=v", transport=transport)
    headers = upstream.outbound_headers([], keep_encoding=False)
    answer = await upstream.complete({"model": "m", "messages": []}, headers, UpstreamTimer())
    assert answer["choices"][0]["message"]["content"] == "hi"
    sent = transport.requests[0]
    assert sent.path == "/v1beta/openai/chat/completions?k=v"
    assert sent.headers["authorization"] == "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    assert await upstream.ready()
    assert transport.requests[1].path == "/v1beta/openai/models?k=v"


def test_an_api_key_takes_precedence_over_userinfo_and_client_auth_is_dropped() -> None:
    upstream = Upstream("http://u:p@h/v1", api_key="sk-up", transport=MockTransport())
    out = upstream.outbound_headers([(b"authorization", b"Bearer client")], keep_encoding=True)
    assert out == [(b"authorization", b"Bearer sk-up")]


def test_hop_by_hop_request_headers_are_never_forwarded() -> None:
    upstream = Upstream("http://h/v1", transport=MockTransport())
    client = [
        (b"host", b"proxy:8080"),
        (b"content-length", b"12"),
        (b"expect", b"100-continue"),
        (b"connection", b"keep-alive, X-Secret-Hop"),
        (b"x-secret-hop", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"te", b"trailers"),
        (b"trailer", b"x-digest"),
        (b"transfer-encoding", b"chunked"),
        (b"upgrade", b"websocket"),
        (b"proxy-authorization", b"Basic eA=="),
        (b"proxy-connection", b"keep-alive"),
        (b"x-repairproxy-repair", b"off"),
        (b"content-type", b"application/json"),
        (b"x-episode-id", b"ep-1"),
    ]
    out = upstream.outbound_headers(client, keep_encoding=True)
    assert out == [(b"content-type", b"application/json"), (b"x-episode-id", b"ep-1")]


def test_head_answers_keep_their_content_length() -> None:
    raw = [(b"content-length", b"42"), (b"connection", b"close"), (b"etag", b'"x"')]
    assert response_headers(raw, head=True) == [(b"content-length", b"42"), (b"etag", b'"x"')]
    assert response_headers(raw) == [(b"etag", b'"x"')]


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        ("http://api.example.com", {"HTTP_PROXY": "http://p:3128"}, "http://p:3128"),
        ("http://api.example.com", {"http_proxy": "http://low:1", "HTTP_PROXY": "http://up:2"}, "http://low:1"),
        ("https://api.example.com", {"HTTP_PROXY": "http://p:3128"}, None),
        ("https://api.example.com", {"HTTPS_PROXY": "http://p:3128"}, "http://p:3128"),
        ("http://api.example.com", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com"}, None),
        ("http://api.example.com", {"HTTP_PROXY": "http://p:1", "no_proxy": ".example.com"}, None),
        ("http://api.example.org", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://p:1"),
        ("http://notexample.com", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://p:1"),
        ("http://h:8000", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "h:8000"}, None),
        ("http://10.1.2.3:8000", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
        ("http://api.example.com", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
        ("http://127.0.0.1:8000", {"HTTP_PROXY": "http://p:1"}, None),
        ("http://localhost:8000", {"HTTP_PROXY": "http://p:1"}, None),
        ("http://[::1]:8000", {"HTTP_PROXY": "http://p:1"}, None),
        ("http://api.example.com", {}, None),
    ],
)  # fmt: skip
def test_proxy_from_environment(url: str, environ: dict[str, str], expected: str | None) -> None:
    assert proxy_from_environment(url, environ) == expected


@pytest.mark.anyio
async def test_the_environment_proxy_is_used_unless_trust_env_is_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://corporate-proxy:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    proxied = Upstream("http://api.example.com/v1")
    assert proxied._transport.proxy is not None  # type: ignore[attr-defined]
    assert proxied._transport.proxy.host == "corporate-proxy"  # type: ignore[attr-defined]
    direct = Upstream("http://api.example.com/v1", trust_env=False)
    assert direct._transport.proxy is None  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_2xx_that_is_not_a_json_object_is_the_upstreams_fault() -> None:
    for raw in (b"<html>gateway</html>", b"[1, 2]", b""):
        upstream = Upstream("http://h/v1", transport=MockTransport(Reply(raw=raw)))
        with pytest.raises(UpstreamBadAnswerError) as caught:
            await upstream.complete({"messages": []}, [], UpstreamTimer())
        assert caught.value.status_code == 502
        assert "not a JSON object" in caught.value.message


@pytest.mark.anyio
async def test_non_2xx_answers_are_data_for_the_route() -> None:
    upstream = Upstream("http://h/v1", transport=MockTransport(error_reply(429, "slow down")))
    with pytest.raises(UpstreamStatusError) as caught:
        await upstream.complete({"messages": []}, [], UpstreamTimer())
    assert caught.value.reply.status_code == 429


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("refused", UpstreamUnavailableError),
        ("close", UpstreamUnavailableError),
        ("timeout", UpstreamTimeoutError),
        ("reset-mid-body", UpstreamUnavailableError),
        ("timeout-mid-body", UpstreamTimeoutError),
    ],
)
@pytest.mark.anyio
async def test_transport_faults_become_our_errors(fault: str, error: type[Exception]) -> None:
    transport = MockTransport(completion(content="x" * 100, fault=fault))
    upstream = Upstream("http://h/v1", transport=transport)
    timer = UpstreamTimer()
    with pytest.raises(error):
        await upstream.request("POST", "/v1/chat/completions", [], b"{}", timer)
    assert timer.calls == 1


@pytest.mark.anyio
async def test_a_stream_left_early_closes_the_response() -> None:
    transport = MockTransport(completion(content="a long answer in many pieces"))
    upstream = Upstream("http://h/v1", transport=transport)
    body = b'{"stream": true}'
    async with upstream.stream("POST", "/v1/chat/completions", [], body, UpstreamTimer()) as r:
        assert r.header(b"content-type") == b"text/event-stream"
        async for first in r.iter_body():
            assert first.startswith(b"data: ")
            break
    assert transport.aborted_streams == 1


@pytest.mark.anyio
async def test_an_unsafe_target_is_a_400_even_if_a_route_let_it_through() -> None:
    upstream = Upstream("http://127.0.0.1:9/v1", trust_env=False)
    with pytest.raises(BadRequestError):
        await upstream.request("GET", "/v1/a\r\nb", [], b"", UpstreamTimer())
    await upstream.aclose()


def test_the_proxy_reaches_its_upstream_through_http_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End to end: HTTP_PROXY names a forward proxy; it sees absolute-form requests."""
    seen: list[bytes] = []

    with ScriptedUpstream() as upstream:

        async def forward(reader: object, writer: asyncio.StreamWriter, request: bytes) -> None:
            line, _, rest = request.partition(b"\r\n")
            method, target, version = line.split(b" ")
            seen.append(target)
            path = b"/" + target.split(b"/", 3)[3]  # http://host:port/path -> /path
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream.port)
            up_writer.write(b"%s %s %s\r\n%s" % (method, path, version, rest))
            await up_writer.drain()
            head = await up_reader.readuntil(b"\r\n\r\n")
            length = next(
                int(h.split(b":")[1]) for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length:")
            )  # fmt: skip
            writer.write(head + await up_reader.readexactly(length))
            up_writer.close()

        with raw_server(forward) as proxy_url:  # type: ignore[arg-type]
            for name in ("http_proxy", "no_proxy", "NO_PROXY"):
                monkeypatch.delenv(name, raising=False)
            monkeypatch.setenv("HTTP_PROXY", proxy_url)
            upstream.push(completion(content="via the proxy"))
            settings = Settings(upstream="http://upstream.test:8000/v1", repair="off")
            with running_proxy(settings) as proxy:
                answer = httpx.post(
                    proxy.base_url + "/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                    trust_env=False,
                )
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "via the proxy"
    assert seen == [b"http://upstream.test:8000/v1/chat/completions"]
    assert upstream.requests[0].headers["host"] == "upstream.test:8000"


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"choices": {}}', b'{"id": "x"}'])
def test_a_body_that_is_not_a_chat_completion_is_the_upstreams_fault(body: bytes) -> None:
    with pytest.raises(UpstreamBadAnswerError) as caught:
        chat_completion_of(body, 200)
    assert "answered 200 with a body that is not a chat completion" in str(caught.value)
    assert chat_completion_of(b'{"choices": []}', 200) == {"choices": []}


async def _relay_counting_turns(chunks: int, work_seconds: float) -> tuple[int, int]:
    """Relay ``chunks`` already-buffered chunks through ``timed``, spending ``work_seconds`` on
    each; returns (chunks relayed, turns another task got meanwhile)."""

    async def buffered() -> AsyncIterator[bytes]:
        for _ in range(chunks):
            yield b"data: {}\n\n"

    turns = 0
    relaying = True

    async def other_request() -> None:
        nonlocal turns
        while relaying:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.ensure_future(other_request())
    await asyncio.sleep(0)  # it is now waiting for its next turn
    turns = 0
    relayed = 0
    async for _ in timed(buffered(), UpstreamTimer()):
        relayed += 1
        deadline = time.perf_counter() + work_seconds
        while time.perf_counter() < deadline:
            pass
    relaying = False
    await other
    return relayed, turns


@pytest.mark.anyio
async def test_a_long_buffered_relay_lets_other_requests_run() -> None:
    relayed, turns = await _relay_counting_turns(100, 0.0002)  # >= 20 ms of relaying
    assert relayed == 100
    assert turns >= 10  # a turn every RELAY_SLICE_SECONDS (0.5 ms) of held loop


@pytest.mark.anyio
async def test_a_short_buffered_answer_is_relayed_without_a_turn_per_chunk() -> None:
    relayed, turns = await _relay_counting_turns(50, 0.0)
    assert relayed == 50
    assert turns < 10  # was one turn of the loop per chunk
