"""The only code that talks to the upstream: the client behind a transport protocol, and
the keep-alive HTTP/1.1 pool it uses."""

from repairproxy._exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "Upstream": "client",
        "UpstreamReply": "client",
        "UpstreamURL": "client",
        "Transport": "client",
        "TransportResponse": "client",
        "ConnectionPool": "http1",
    },
)
