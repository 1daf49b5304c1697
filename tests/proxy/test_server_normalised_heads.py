"""Heads llhttp refuses and h11 reads (issue 51): the server rewrites them as h11 reads them
(``repairproxy.server.normalise_head``), finding where such a head starts by replaying what it
fed (``head_start``). The differential test compares whole streams with h11; these pin the
rewrite itself and its bounds: a head arriving in pieces, the head cap, the head's start."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from repairproxy.server import head_start, normalise_head
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.raw_http import connect, read_until_close, send_all, serving, statuses

BASE = Settings(upstream="http://127.0.0.1:9/v1", repair=RepairMode.OFF)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET / HTTP/1.1\nhost: x\n\n", b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"),
        (
            b"GET / HTTP/1.1\r\nx-a: one\r\n \t two\r\n\r\n",
            b"GET / HTTP/1.1\r\nx-a: one two\r\n\r\n",
        ),
        (
            b"POST / HTTP/1.1\r\ncontent-length: 3\r\nx: y\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 3\r\nx: y\r\n\r\n",
        ),
        (
            b"POST / HTTP/1.1\r\ncontent-length: 3, 3\r\n\n",
            b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\n",
        ),
        (b"POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\ncontent-length: 3,\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\n x: y\r\nhost: x\r\n\r\n", None),  # a fold before any field
    ],
)
def test_a_head_is_rewritten_as_h11_reads_it(head: bytes, expected: bytes | None) -> None:
    assert normalise_head(head) == expected


def test_the_refused_head_is_found_after_bodies_of_both_framings() -> None:
    body = b"GET / HTTP/1.1\r\nx: \n\nab"  # looks like a head, and ends inside a line
    first = b"POST /a HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    second = b"POST /b HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n4\r\nab\nc\r\n0\r\n\r\n"
    bad = b"POST /c HTTP/1.1\nhost: x\n\n"
    assert head_start(first + second + bad) == len(first) + len(second)
    assert head_start(first + second) is None  # no refusal: nothing to find


def test_a_rewritten_head_may_arrive_in_pieces() -> None:
    pieces = [
        b"GET /healthz HTTP/1.1\n",
        b"host: x\n",
        b"x-a: one\n two\n",
        b"connection: close\n\n",
    ]
    with serving(BASE) as server, connect(server.port, timeout=10) as client:
        for piece in pieces:
            send_all(client, piece)
            time.sleep(0.1)  # each piece its own read
        data, closed = read_until_close(client)
    assert statuses(data) == [200] and closed


def test_a_rewritten_head_is_held_to_the_head_cap() -> None:
    settings = replace(BASE, max_header_bytes=4096)
    with serving(settings) as server, connect(server.port, timeout=10) as client:
        send_all(client, b"GET /healthz HTTP/1.1\n")
        time.sleep(0.1)
        for _ in range(10):
            send_all(client, b"x-a: " + b"a" * 1000 + b"\n")
        data, closed = read_until_close(client)
        assert statuses(data) == [431] and closed
        assert server.refused("header_bytes") == 1


def test_a_rewritten_head_keeps_the_header_deadline() -> None:
    settings = replace(BASE, header_timeout=0.3)
    with serving(settings) as server, connect(server.port, timeout=10) as client:
        send_all(client, b"GET /healthz HTTP/1.1\nhost: x\n")  # and never the blank line
        data, closed = read_until_close(client)
        assert statuses(data) == [408] and closed
        assert server.refused("header_timeout") == 1
