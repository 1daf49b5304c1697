"""Time to first content byte added by the streaming gate (``streaming.ToolCallGate``) for prose.

A stream with declared tools passes through ``SSEParser`` and the gate; a stream without tools is
relayed as it comes. For each answer below, streamed in 4-character deltas, this measures the time
from the arrival of the first content event to the moment the gate releases it, minus the time the
parser alone takes (the relay's own work), and how many content characters the gate held first.
Prose that cannot open a call should be released with its first delta (0 characters held). The
gate gets τ²-bench retail's tool names, as the proxy passes a request's declared tools: prose that
starts like one ("cancelled ...") is held only until a character says it is not a call.

    python -m benchmarks.diagnostics.streaming_gate [--repeat 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson

from repairproxy.asgi.gate import SSEParser, ToolCallGate

__all__ = ["main"]

PROSE = [
    "Your order #W2378156 shipped yesterday and should arrive on Friday.",
    "Sure! Could you give me the email address on your account first?",
    "I'm sorry, I can't cancel a delivered order, but I can start a return.",
    "[Tracking link](https://example.com/track/123) shows it is in transit.",
    "{Note: prices include tax.} The total is $48.20.",
    "```python\nprint('hello')\n```",
    "1. Log in.\n2. Open Orders.\n3. Click Return.",
    "cancelled orders are refunded within 5 days.",
    "Done.\nget back to me if the size is wrong.",
]
# τ²-bench retail's agent tools: a word at a line start that begins one of these names is held
# until the next characters tell whether a call without a marker follows (``name(``, ``name{``).
TOOL_NAMES = (
    "calculate",
    "cancel_pending_order",
    "exchange_delivered_order_items",
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_order_details",
    "get_product_details",
    "get_user_details",
    "list_all_product_types",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
    "transfer_to_human_agents",
)
CALLS = [
    '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}',
    '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>',
    'get_order_details(order_id="#W1")',
]


def _events(text: str) -> list[bytes]:
    base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def event(delta: dict[str, str]) -> bytes:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    return [event({"role": "assistant", "content": ""}), *(event({"content": p}) for p in pieces)]


def _first_release(events: list[bytes], gated: bool) -> tuple[float, int]:
    """(seconds from the first content event's arrival to its release, characters held)."""
    parser = SSEParser()
    gate = ToolCallGate(tool_names=TOOL_NAMES)
    started = None
    held = 0
    for raw in events:
        for event in parser.feed(raw):
            if started is None and b'"content":""' not in raw:
                started = time.perf_counter()
            if not gated:
                if started is not None:
                    return time.perf_counter() - started, 0
                continue
            if gate.feed(event) and started is not None:
                return time.perf_counter() - started, held
            if started is not None:
                held = len(gate.assembler.content or "")
    return float("nan"), held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args(argv)
    print(f"{'answer':<48} {'held chars':>10} {'added us p50':>13} {'p99':>8}")
    for text in PROSE + CALLS:
        events = _events(text)
        added = []
        held = 0
        for _ in range(args.repeat):
            gated, held = _first_release(events, gated=True)
            plain, _ = _first_release(events, gated=False)
            added.append((gated - plain) * 1e6)
        added.sort()
        p99 = added[int(len(added) * 0.99) - 1]
        shown = text.replace("\n", "\\n")[:46]
        if text in CALLS:
            print(f"{shown:<48} {'whole':>10} {'(a call: held to the end)':>22}")
            continue
        print(f"{shown:<48} {held:>10} {statistics.median(added):>13.2f} {p99:>8.2f}")


if __name__ == "__main__":
    main()
