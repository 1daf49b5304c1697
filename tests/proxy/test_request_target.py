"""Pass-through paths reach the upstream exactly as the client sent them.

A decoded ``%0d%0a`` pasted into the upstream request line would smuggle a second request that
carries the upstream key; its answer would go to a later client. The proxy forwards the raw,
still-encoded path and refuses bytes no URL may hold with an OpenAI-style 400.
"""

from __future__ import annotations

import socket

import orjson
import pytest

from tests.proxy.conftest import StartProxy
from tests.support.scripted_upstream import ScriptedUpstream


def _raw_request(host: str, port: int, target: bytes) -> tuple[int, bytes]:
    """Send one GET with a request target of our choosing (no client library would let us)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/models%0d%0aGET%20/v1/secret%20HTTP/1.1%0d%0ax:%20y",
        b"/v1/models%20x",
        b"/v1/caf%C3%A9",
        b"/v1/files?name=a%0d%0ab",
    ],
)
def test_encoded_paths_are_forwarded_raw_and_never_smuggle(
    start_proxy: StartProxy, upstream: ScriptedUpstream, target: bytes
) -> None:
    proxy = start_proxy(upstream_api_key="sk-upstream-secret")
    host, port = proxy.base_url.split("//", 1)[1].split("/", 1)[0].split(":")
    status, _ = _raw_request(host, int(port), target)
    assert status == 200
    # Exactly one request reached the upstream, with the path still percent-encoded.
    seen = [r for r in upstream.requests if r.path.startswith("/v1/")]
    assert len(seen) == 1
    assert seen[0].path.encode() == target
    assert all("secret" not in r.path.split("%")[0] for r in seen)


@pytest.mark.parametrize("target", [b"/v1/models\x01", b"/v1/caf\xc3\xa9", b"/v1/files?x=\x7f"])
def test_bytes_no_url_may_hold_are_a_400(
    start_proxy: StartProxy, upstream: ScriptedUpstream, target: bytes
) -> None:
    proxy = start_proxy()
    host, port = proxy.base_url.split("//", 1)[1].split("/", 1)[0].split(":")
    try:
        status, body = _raw_request(host, int(port), target)
    except ConnectionError:
        status, body = 400, b""  # uvicorn's parser refused the line itself
    assert status == 400
    if body.startswith(b"{"):  # ours (uvicorn's own refusal is plain text)
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert not [r for r in upstream.requests if r.path.startswith("/v1/")]
