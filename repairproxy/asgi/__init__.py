"""The ASGI layer: routes, the per-request exchange (headers, trailer), chat, Responses and
Messages framing over HTTP, and the stream gate that holds tool-call deltas until a call is
whole."""

from repairproxy._exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "Proxy": "routes",
        "ChatCall": "chat",
        "ResponsesCall": "responses",
        "MessagesCall": "messages",
        "Exchange": "exchange",
        "Responder": "responder",
        "ClientDisconnectedError": "responder",
        "ToolCallGate": "gate",
    },
)
