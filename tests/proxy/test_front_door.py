"""The front door's invariants (issue 51), one test per finding of the hostile review, each
against the real server or pool on loopback. Nothing is timed: the tests count answers,
statuses, closes, queue lengths, bytes fed to the parser and the refusal counter (the
deadlines are set short so the tests end soon; every read has a generous bound).

On the parent: this file (with ``tests/support/raw_http.py``) run in a worktree of d113a65, the
commit the hostile review ran on, with ``repairproxy`` imported from the worktree: 26 of 28 fail.
"name" marks a failure only because a flag or name the fix added does not exist there.

== ======================================================== ====================================
#  test                                                     on d113a65
== ======================================================== ====================================
1  pipelining client queues at most the cap                 name: ``max_pipelined_requests``
2  keyless client answered before its body is closed        fails: 401 without ``connection: close``
2  body that stops coming gets 408                          name: ``body_timeout``
2  slow body that makes progress is not cut                 name: ``body_timeout``
3  trailers capped before the app                           fails: no answer at all, not 431
3  chunk extension capped before the app                    fails: no answer at all, not 431
4  GET with a body refused, never upstream                  fails: 200, the body forwarded
4  the pool never sends a GET body                          fails: the pool connects to send it
5  stray bytes never reach the next request                 fails: the next client got ``stray!``
5  bytes after the answer in the same read close            passes (held on the parent already)
6  bad pipelined request answered after earlier (400)       fails: the 400 written first
6  bad pipelined request answered after earlier (431)       fails: the 431 written first
7  many small pipelined heads in one read all pass          fails: 431 and no 200
8  refused 100-continue closes, sends no continue           fails: 401 left the connection open
8  unknown expectation gets 417                             fails: 502 (passed on to the upstream)
9  upstream status 600 is a 502                             fails: an empty reply
9  8 MiB upstream header is a 502                           fails: 200 with the header relayed
9  content-encoding dropped from a rewritten body           fails: ``content-encoding`` relayed
9  transfer coding other than chunked gets 501              fails: 502 (accepted, forwarded)
11 connection caps clamped to the descriptor limit          name: ``fit_descriptors``
11 soft descriptor limit raised to the hard one             name: ``fit_descriptors``
10 pattern too costly to compile is refused                 fails: answered from upstream, no 400
10 tools larger than the cap refused before compiling       name: ``max_tools_bytes``
10 patterns of every tool counted before compiling          name: ``compile(max_patterns=)``
10 tools over the pattern cap never reach the upstream      fails: forwarded upstream, no 400
10 tools at the pattern cap go through                      passes (the positive control)
10 tools over the node cap never reach the upstream         name: ``max_schema_nodes``
10 the loop lag is exported                                 fails: no loop-lag sample
== ======================================================== ====================================
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace

import pytest

from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from repairproxy.upstream.http1 import ConnectionPool, InvalidTargetError
from tests.support.raw_http import (
    RawUpstream,
    connect,
    read_until_close,
    send_all,
    serving,
    statuses,
)
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion

BASE = Settings(upstream="http://127.0.0.1:9/v1", repair=RepairMode.OFF)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


# -- 1. a pipelining client is held to a bounded queue ---------------------------------------------


def test_1_a_pipelining_client_queues_at_most_the_cap_and_gets_every_answer_in_order() -> None:
    settings = replace(BASE, max_pipelined_requests=4)
    requests = 3000
    with serving(settings) as server, connect(server.port) as client:
        payload = HEALTHZ * requests

        def write() -> None:  # 40 KB writes, as the review's client did
            for start in range(0, len(payload), 40_000):
                send_all(client, payload[start : start + 40_000])

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        received = b""
        while received.count(b'{"status":"ok"}') < requests:
            chunk = client.recv(1 << 20)
            assert chunk, "the connection closed before every answer came"
            received += chunk
        writer.join(timeout=30)
    assert statuses(received) == [200] * requests
    # The queue holds the cap, plus the heads of one 256-byte piece at most (36-byte requests).
    assert server.most_queued <= 4 + 256 // 36 + 1, server.most_queued
    assert server.most_stashed <= 256 * 1024  # one socket read, not the client's whole stream


# -- 2. bodies have deadlines; an answer before the body closes ------------------------------------


def test_2_a_keyless_client_answered_before_its_body_is_closed_not_drained() -> None:
    settings = replace(BASE, api_keys=("k",))
    with serving(settings) as server, connect(server.port, timeout=5) as client:
        send_all(client, CHAT + b"content-length: 100\r\n\r\n" + b"x" * 10)
        data, closed = read_until_close(client)
    assert statuses(data) == [401] and b"connection: close" in data.lower()
    assert closed, "the server kept a keyless connection open for a body nobody reads"


def test_2_a_body_that_stops_coming_gets_408_after_the_body_timeout() -> None:
    settings = replace(BASE, body_timeout=0.5)
    with serving(settings) as server, connect(server.port) as client:
        send_all(client, CHAT + b"content-length: 100\r\n\r\n" + b"x" * 10)
        data, closed = read_until_close(client)
        assert statuses(data) == [408] and closed
        assert server.refused("body_timeout") == 1


def test_2_a_slow_body_that_makes_progress_is_not_cut() -> None:
    settings = replace(BASE, body_timeout=0.6, header_timeout=0.6)
    body = BODY
    with serving(settings) as server, connect(server.port) as client:
        send_all(client, CHAT + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body))
        for start in range(0, len(body), 8):  # longer in all than both timeouts
            time.sleep(0.1)
            send_all(client, body[start : start + 8])
        data, _ = read_until_close(client)
    # Nothing listens upstream: 502 means the whole body reached the app and went on.
    assert statuses(data) == [502], data[:200]
    assert server.refused("body_timeout") == 0


# -- 3. trailers and chunk extensions count against the head cap -----------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        b"2\r\n{}\r\n0\r\n" + b"x-trailer: " + b"a" * 100 + b"\r\n" * 1,
        b"1;" + b"e" * (1 << 20),
    ],
    ids=["trailers", "chunk extension"],
)
def test_3_trailers_and_chunk_extensions_are_capped_before_the_app(tail: bytes) -> None:
    cap = 16 * 1024
    settings = replace(BASE, max_header_bytes=cap)
    if tail.startswith(b"2"):
        tail = tail[: tail.index(b"x-trailer")] + (b"x-trailer: " + b"a" * 100 + b"\r\n") * 10_000
    with serving(settings) as server, connect(server.port) as client:
        send_all(client, CHAT + b"transfer-encoding: chunked\r\n\r\n" + tail)
        data, closed = read_until_close(client)
        assert statuses(data) == [431] and closed, data[:200]
        assert server.refused("header_bytes") == 1
        assert sum(server.fed) <= 3 * cap, sum(server.fed)


# -- 4. GET and HEAD bodies are refused, never forwarded -------------------------------------------


def test_4_a_get_with_a_body_is_refused_and_never_reaches_the_upstream() -> None:
    with ScriptedUpstream() as upstream:
        settings = replace(BASE, upstream=upstream.base_url)
        with serving(settings) as server:
            with connect(server.port) as client:
                smuggled = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
                send_all(
                    client,
                    b"GET /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(smuggled), smuggled),
                )
                data, closed = read_until_close(client)
            assert statuses(data) == [400] and b"body_not_allowed" in data and closed
            with connect(server.port) as client:  # an empty body is no body: served
                send_all(
                    client,
                    b"GET /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n"
                    b"connection: close\r\n\r\n",
                )
                assert statuses(read_until_close(client)[0]) == [200]
        assert [r.method for r in upstream.requests] == ["GET"]


def test_4_the_pool_never_sends_a_get_body() -> None:
    async def go() -> None:
        pool = ConnectionPool("http://127.0.0.1:9")
        with pytest.raises(InvalidTargetError):
            await pool.request("GET", "/v1/models", [], b"GET / HTTP/1.1\r\n\r\n")
        await pool.aclose()

    asyncio.run(go())


# -- 5. stray upstream bytes never become the next client's answer ---------------------------------


def test_5_stray_bytes_after_a_framed_answer_never_reach_the_next_request() -> None:
    first_read = threading.Event()

    def script(conn: socket.socket, number: int) -> None:
        if number == 1:
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nfirst!")
            first_read.wait(10)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nstray!")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nyours!")

    async def go(upstream: RawUpstream) -> list[bytes]:
        pool = ConnectionPool(f"http://127.0.0.1:{upstream.port}")
        bodies = []
        response = await pool.request("GET", "/a", [])
        bodies.append(await response.read())
        first_read.set()
        # The loop is held (as a busy proxy's is) while the stray answer lands unread in the
        # socket's buffer; the next request then takes the pooled connection.
        time.sleep(0.3)
        response = await pool.request("GET", "/b", [])
        bodies.append(await response.read())
        await pool.aclose()
        return bodies

    with RawUpstream(script) as upstream:
        assert asyncio.run(go(upstream)) == [b"first!", b"yours!"]


def test_5_bytes_after_the_answer_in_the_same_read_close_the_connection() -> None:
    def script(conn: socket.socket, number: int) -> None:
        body = b"n%d" % number
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        conn.sendall(answer + (answer if number == 1 else b""))

    async def go(upstream: RawUpstream) -> list[bytes]:
        pool = ConnectionPool(f"http://127.0.0.1:{upstream.port}")
        bodies = []
        for _ in range(3):
            response = await pool.request("GET", "/", [])
            bodies.append(await response.read())
        await pool.aclose()
        return bodies

    with RawUpstream(script) as upstream:
        assert asyncio.run(go(upstream)) == [b"n1", b"n2", b"n3"]


# -- 6. answers leave in order; a bad request is answered after the ones before it ---------------


@pytest.mark.parametrize(
    ("bad", "status"),
    [(b"BAD\x01 / HTTP/1.1\r\n\r\n", 400), (b"GET /healthz HTTP/1.1\r\nx: " + b"a" * 70_000, 431)],
    ids=["unparseable", "head too large"],
)
def test_6_a_bad_pipelined_request_is_answered_after_the_earlier_ones(
    bad: bytes, status: int
) -> None:
    with serving(BASE) as server, connect(server.port) as client:
        send_all(client, HEALTHZ * 3 + bad)
        data, closed = read_until_close(client)
    assert statuses(data) == [200, 200, 200, status] and closed, data[-300:]


# -- 7. the head cap is per request head, not per read ---------------------------------------------


def test_7_many_small_pipelined_heads_in_one_read_all_pass() -> None:
    settings = replace(BASE, max_header_bytes=4096)
    head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"p" * 54 + b"\r\n\r\n"
    assert len(head) == 97
    with serving(settings) as server, connect(server.port) as client:
        send_all(client, head * 59 + head.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
        data, closed = read_until_close(client)
    assert statuses(data) == [200] * 60 and closed
    assert server.refused("header_bytes") == 0


# -- 8. Expect -------------------------------------------------------------------------------------


def test_8_a_refused_100_continue_closes_and_sends_no_continue() -> None:
    settings = replace(BASE, api_keys=("k",))
    with serving(settings) as server, connect(server.port, timeout=5) as client:
        send_all(client, CHAT + b"expect: 100-continue\r\ncontent-length: 10\r\n\r\n")
        first = client.recv(65536)
        # The client, told no, goes on to its next request: it must not be read as the body.
        send_all(client, HEALTHZ)
        rest, closed = read_until_close(client)
    data = first + rest
    assert statuses(data) == [401] and closed, data
    assert b"connection: close" in first.lower() and b"100 Continue" not in data


def test_8_an_unknown_expectation_gets_417() -> None:
    with serving(BASE) as server, connect(server.port) as client:
        send_all(client, CHAT + b"expect: 200-ok\r\ncontent-length: 2\r\n\r\n{}")
        data, closed = read_until_close(client)
        assert statuses(data) == [417] and closed
        assert server.refused("expectation_failed") == 1


# -- 9. upstream answers are checked; rewritten bodies are described truly -------------------------


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 600 Odd\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (8 << 20) + b"\r\ncontent-length: 2\r\n\r\n{}",
    ],
    ids=["status 600", "8 MiB header"],
)
def test_9_a_malformed_upstream_answer_is_a_502_not_relayed(answer: bytes) -> None:
    with RawUpstream(lambda conn, _: conn.sendall(answer)) as upstream:
        settings = replace(BASE, upstream=upstream.base_url)
        with serving(settings) as server, connect(server.port) as client:
            send_all(client, b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            data, _ = read_until_close(client)
    assert statuses(data) == [502], data[:200]
    assert len(data) < 64 * 1024


def test_9_content_encoding_is_dropped_from_a_body_the_proxy_rewrote() -> None:
    with ScriptedUpstream() as upstream:
        reply = completion(content="hi")
        upstream.push(Reply(body=reply.body, headers=(("Content-Encoding", "gzip"),)))
        settings = replace(BASE, upstream=upstream.base_url, repair=RepairMode.REFLEXIVE)
        with serving(settings) as server, connect(server.port) as client:
            send_all(
                client,
                CHAT + b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY),
            )
            data, _ = read_until_close(client)
    assert statuses(data) == [200], data[:300]
    assert b"content-encoding" not in data.lower()


def test_9_a_transfer_coding_other_than_chunked_gets_501() -> None:
    with serving(BASE) as server, connect(server.port) as client:
        send_all(client, CHAT + b"transfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
        data, closed = read_until_close(client)
        assert statuses(data) == [501] and closed
        assert server.refused("unsupported_coding") == 1


# -- 11. the caps fit the descriptor limit ---------------------------------------------------------


def test_11_connection_caps_are_clamped_to_the_descriptor_limit() -> None:
    from repairproxy.server import fit_descriptors

    fitted, warning = fit_descriptors(BASE, limits=(1024, 1024))
    assert fitted.max_client_connections + fitted.max_connections <= 1024 - 64
    assert warning is not None and "--max-client-connections 1024 ->" in warning
    redis = replace(BASE, episode_store="redis://127.0.0.1:6379/0")
    fitted, _ = fit_descriptors(redis, limits=(1024, 1024))
    redis_pool = max(redis.max_connections, 16)
    assert fitted.max_client_connections + fitted.max_connections + redis_pool <= 1024
    roomy, warning = fit_descriptors(BASE, limits=(65536, 65536))
    assert roomy == BASE and warning is None


def test_11_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip("the hard limit leaves no room to test")
    code = (
        "import resource\n"
        "from repairproxy.server import fit_descriptors\n"
        "from repairproxy.settings import Settings\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))\n"
        "settings, warning = fit_descriptors(Settings(upstream='http://127.0.0.1:9'))\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 128)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "True", out.stderr


# -- 10. the loop is never held by what a client declares ------------------------------------------


def _chat_with_tools(tools: list[dict[str, object]]) -> bytes:
    import orjson

    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    return CHAT + b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def _tool(name: str, properties: Mapping[str, object]) -> dict[str, object]:
    parameters = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_10_a_pattern_too_large_to_compile_cheaply_is_refused_as_an_invalid_schema() -> None:
    pattern = {f"p{i}": {"type": "string", "pattern": r"(\w{100}){30}"} for i in range(40)}
    with ScriptedUpstream() as upstream:
        settings = replace(BASE, upstream=upstream.base_url)
        with serving(settings) as server, connect(server.port) as client:
            send_all(client, _chat_with_tools([_tool("slow", pattern)]))
            data, _ = read_until_close(client)
        assert statuses(data) == [400] and b"valid JSON Schema" in data, data[-300:]
        assert upstream.requests == []  # refused before anything went upstream


def test_10_tools_larger_than_the_cap_are_refused_before_compiling() -> None:
    settings = replace(BASE, max_tools_bytes=64 * 1024)
    many = [_tool(f"t{i}", {"a": {"type": "string", "description": "d" * 200}}) for i in range(400)]
    with serving(settings) as server, connect(server.port) as client:
        send_all(client, _chat_with_tools(many))
        data, _ = read_until_close(client)
    assert statuses(data) == [400] and b"bytes of JSON" in data, data[-300:]


def _patterns(count: int, first: int = 0) -> dict[str, object]:
    return {f"p{i}": {"type": "string", "pattern": f"^x{i}$"} for i in range(first, count)}


def test_10_the_patterns_of_every_tool_are_counted_before_compiling() -> None:
    from repairproxy.errors import InvalidToolsError
    from repairproxy.validation import ToolsCache

    nested = {
        "list": {"type": "array", "items": {"anyOf": [{"pattern": "^a$"}, {"pattern": "^b$"}]}},
        "keyed": {"type": "object", "patternProperties": {"^c$": {"pattern": "^d$"}}},
        "again": {"type": "string", "pattern": "^a$"},  # one tool compiles a regex once
    }
    # Each tool compiles on its own: the same four regexes in two tools are eight.
    body = {"tools": [_tool("one", nested), _tool("two", nested)]}
    assert ToolsCache().compile(body, max_patterns=8) is not None
    cache = ToolsCache()
    with pytest.raises(InvalidToolsError, match="8 distinct regular expressions") as caught:
        cache.compile(body, max_patterns=7)
    assert caught.value.param == "tools" and len(cache) == 0
    # Refused before compiling: an invalid regex over the cap gets the cap's answer.
    broken = {"tools": [_tool("bad", {**_patterns(8), "x": {"type": "string", "pattern": "("}})]}
    with pytest.raises(InvalidToolsError, match="--max-schema-patterns"):
        cache.compile(broken, max_patterns=8)


def test_10_tools_over_the_pattern_cap_are_refused_and_never_reach_the_upstream() -> None:
    tools = [_tool("a", _patterns(10)), _tool("b", _patterns(17, first=10))]
    with ScriptedUpstream() as upstream:
        settings = replace(BASE, upstream=upstream.base_url)
        with serving(settings) as server, connect(server.port) as client:
            send_all(client, _chat_with_tools(tools))
            data, _ = read_until_close(client)
        assert statuses(data) == [400], data[-300:]
        assert b"17 distinct regular expressions" in data and b"at most 16" in data, data[-300:]
        assert b"--max-schema-patterns" in data
        assert upstream.requests == []


def test_10_tools_at_the_pattern_cap_go_through() -> None:
    tools = [_tool("a", _patterns(10)), _tool("b", _patterns(16, first=10))]
    with ScriptedUpstream() as upstream:
        upstream.push(completion(content="ok"))
        settings = replace(BASE, upstream=upstream.base_url)
        with serving(settings) as server, connect(server.port) as client:
            send_all(client, _chat_with_tools(tools))
            data, _ = read_until_close(client)
        assert statuses(data) == [200], data[-300:]
        assert len(upstream.requests) == 1


def test_10_tools_over_the_node_cap_are_refused_and_never_reach_the_upstream() -> None:
    wide = [_tool(f"t{i}", {"a": {"type": "string"}}) for i in range(20)]
    with ScriptedUpstream() as upstream:
        settings = replace(BASE, upstream=upstream.base_url, max_schema_nodes=100)
        with serving(settings) as server, connect(server.port) as client:
            send_all(client, _chat_with_tools(wide))
            data, _ = read_until_close(client)
        assert statuses(data) == [400], data[-300:]
        assert b"JSON objects and arrays; at most 100" in data, data[-300:]
        assert b"--max-schema-nodes" in data
        assert upstream.requests == []
        upstream.push(completion(content="ok"))
        with serving(settings) as server, connect(server.port) as client:
            send_all(client, _chat_with_tools(wide[:10]))  # 5 nodes a tool, and the list
            data, _ = read_until_close(client)
        assert statuses(data) == [200], data[-300:]


def test_10_the_loop_lag_is_exported() -> None:
    with serving(BASE) as server:
        deadline = time.monotonic() + 10
        registry = server.app.metrics.registry
        while not registry.get_sample_value("repairproxy_event_loop_lag_seconds_count"):
            assert time.monotonic() < deadline, "no loop-lag sample"
            time.sleep(0.05)
        assert registry.get_sample_value("repairproxy_event_loop_lag_max_seconds") is not None
