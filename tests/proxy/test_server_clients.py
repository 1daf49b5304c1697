"""The proxy's own HTTP protocol (``repairproxy.server``) against what real clients send: pipelined
requests on one connection, chunked request bodies sent in pieces, ``Expect: 100-continue``, HEAD,
a client leaving mid-stream, and the official SDK and httpx streaming on a kept-alive connection.
Raw sockets where the bytes matter; each answer is parsed with httptools, as a client would."""

from __future__ import annotations

import socket
import time
from typing import Any

import httptools
import httpx
import orjson

from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, completion
from tests.support.tools import MESSAGES

_BODY = orjson.dumps({"model": "m", "messages": MESSAGES})


class _Answers:
    """Responses read off one connection, in order: (status, headers, body)."""

    def __init__(self) -> None:
        self.done: list[tuple[int, dict[bytes, bytes], bytes]] = []
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        self.done.append((status, self._headers, b"".join(self._body)))
        self._headers, self._body = {}, []

    def read(
        self, client: socket.socket, count: int
    ) -> list[tuple[int, dict[bytes, bytes], bytes]]:
        deadline = time.monotonic() + 15
        while len(self.done) < count and time.monotonic() < deadline:
            data = client.recv(65536)
            if not data:
                break
            self._parser.feed_data(data)
        return self.done


def _post(body: bytes, *, extra: bytes = b"", chunked: bool = False) -> bytes:
    framing = (
        b"transfer-encoding: chunked\r\n" if chunked else b"content-length: %d\r\n" % len(body)
    )
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + framing
        + extra
        + b"\r\n"
        + (b"" if chunked else body)
    )


def _connect(proxy: RunningProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=15)


def test_pipelined_requests_are_answered_in_order(
    proxy: RunningProxy, upstream: ScriptedUpstream
) -> None:
    upstream.push(*(completion(content=f"answer {i}") for i in range(3)))
    healthz = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    with _connect(proxy) as client:
        client.sendall(_post(_BODY) + healthz + _post(_BODY) + _post(_BODY))  # one write
        answers = _Answers().read(client, 4)
    assert [status for status, _, _ in answers] == [200, 200, 200, 200]
    contents = [orjson.loads(body) for _, _, body in answers]
    assert contents[1] == {"status": "ok"}
    chats = [contents[0], *contents[2:]]
    assert [c["choices"][0]["message"]["content"] for c in chats] == [
        f"answer {i}" for i in range(3)
    ]


def test_a_chunked_request_body_sent_in_pieces_reaches_the_upstream_whole(
    proxy: RunningProxy, upstream: ScriptedUpstream
) -> None:
    upstream.push(completion(content="ok"))
    pieces = [_BODY[:7], _BODY[7:50], _BODY[50:]]
    with _connect(proxy) as client:
        client.sendall(_post(b"", chunked=True))
        for piece in pieces:
            client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.05)  # each piece in its own read
        client.sendall(b"0\r\n\r\n")
        (status, _, body), *_ = _Answers().read(client, 1)
    assert status == 200
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "ok"
    assert upstream.chat_requests[0]["messages"] == MESSAGES


def test_expect_100_continue_gets_its_interim_answer_before_the_body_is_sent(
    proxy: RunningProxy, upstream: ScriptedUpstream
) -> None:
    upstream.push(completion(content="ok"))
    with _connect(proxy) as client:
        client.sendall(_post(_BODY, extra=b"expect: 100-continue\r\n")[: -len(_BODY)])
        interim = client.recv(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        client.sendall(_BODY)
        answers = _Answers()
        answers.read(client, 1)
    (status, _, body), *_ = answers.done
    assert status == 200
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "ok"


def test_head_gets_headers_without_a_body_and_the_connection_serves_the_next_request(
    proxy: RunningProxy,
) -> None:
    with _connect(proxy) as client:
        client.sendall(b"HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        head = client.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        assert b"content-length: 15\r\n" in head
        client.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        (status, _, body), *_ = _Answers().read(client, 1)
    assert (status, body) == (200, b'{"status":"ok"}')


def test_a_client_leaving_mid_stream_stops_the_upstream_stream(
    proxy: RunningProxy, upstream: ScriptedUpstream
) -> None:
    upstream.push(completion(content="a long answer " * 40, event_delay=0.05))
    body = orjson.dumps({"model": "m", "messages": MESSAGES, "stream": True})
    with _connect(proxy) as client:
        client.sendall(_post(body))
        first = client.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked\r\n" in first
    deadline = time.monotonic() + 10
    while not upstream.aborted_streams and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.aborted_streams == 1
    while time.monotonic() < deadline:
        lines = [line for line in proxy.log_lines() if line.get("path") == "/v1/chat/completions"]
        if lines:
            break
        time.sleep(0.05)
    assert [line["status"] for line in lines] == [499]


def test_the_official_client_and_httpx_stream_on_one_kept_alive_connection(
    proxy: RunningProxy, upstream: ScriptedUpstream
) -> None:
    upstream.push(*(completion(content=f"streamed {i}") for i in range(4)))
    client = proxy.client()
    for i in range(2):
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == f"streamed {i}"
    seen: list[Any] = []
    with httpx.Client(base_url=proxy.base_url, timeout=15) as http:
        for _ in range(2):
            payload = {"model": "m", "messages": MESSAGES, "stream": True}
            with http.stream("POST", "/chat/completions", json=payload) as response:
                assert response.status_code == 200
                data = b"".join(response.iter_bytes())
            events = [line[6:] for line in data.split(b"\n") if line.startswith(b"data: {")]
            seen.append(
                "".join(
                    orjson.loads(event)["choices"][0]["delta"].get("content") or ""
                    for event in events
                    if orjson.loads(event)["choices"]
                )
            )
    assert seen == ["streamed 2", "streamed 3"]
    assert data.rstrip().endswith(b"data: [DONE]")
