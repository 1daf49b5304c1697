"""Validation cost per tool call: fastjsonschema vs jsonschema-rs (vs jsonschema), and the proxy.

Uses the 16 τ²-bench Retail tool schemas (``evals.tau2.domains.retail.tools``) and a mix of valid
and invalid arguments. Prints microseconds per call (best of several repeats) and what each library
says about a failing call, which is what the repair diagnosis needs.

    python -m benchmarks.diagnostics.validation [--number 20000]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import fastjsonschema
import jsonschema
import jsonschema_rs
import orjson

from evals.tau2.domains.retail.tools import agent_tool_schemas
from repairproxy.repair import promote
from repairproxy.validation import ToolsCache

__all__ = ["main"]

# (tool, arguments, valid?) resembling what agents send in the Retail domain.
CALLS: list[tuple[str, dict[str, Any], bool]] = [
    ("get_order_details", {"order_id": "#W2378156"}, True),
    ("get_user_details", {"user_id": "yusuf_rossi_9620"}, True),
    (
        "exchange_delivered_order_items",
        {
            "order_id": "#W2378156",
            "item_ids": ["1151293680", "4983901480"],
            "new_item_ids": ["7706410293", "7747408585"],
            "payment_method_id": "credit_card_9513926",
        },
        True,
    ),
    (
        "modify_pending_order_address",
        {
            "order_id": "#W2378156",
            "address1": "1 Main St",
            "address2": "",
            "city": "Austin",
            "state": "TX",
            "country": "USA",
            "zip": "78701",
        },
        True,
    ),
    ("get_order_details", {}, False),
    ("cancel_pending_order", {"order_id": 2378156, "reason": "bored"}, False),
    ("exchange_delivered_order_items", {"order_id": "#W1", "item_ids": "1151293680"}, False),
]


def _best_us(function: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6


def _fastjsonschema_check(validate: Callable[[Any], Any], arguments: Any) -> bool:
    try:
        validate(arguments)
    except fastjsonschema.JsonSchemaValueException:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="calls per timing repeat")
    number = parser.parse_args(argv).number

    tools = agent_tool_schemas()
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    fast = {name: fastjsonschema.compile(schema) for name, schema in schemas.items()}
    rust = {name: jsonschema_rs.validator_for(schema) for name, schema in schemas.items()}
    python = {name: jsonschema.Draft202012Validator(schema) for name, schema in schemas.items()}
    body = {"tools": tools}
    cache = ToolsCache()
    compiled = cache.compile(body)
    assert compiled is not None

    print(f"{len(tools)} Retail tools; microseconds per call, best of 5 x {number}")
    header = (
        f"{'call':34} {'ok':>3} {'fastjsonschema':>15} {'jsonschema-rs':>14} {'jsonschema':>11}"
    )
    print(header + f" {'check_call(str)':>16}")
    totals = {"fast": 0.0, "rust": 0.0, "python": 0.0, "proxy": 0.0}
    for name, arguments, valid in CALLS:
        raw = orjson.dumps(arguments).decode()
        assert _fastjsonschema_check(fast[name], arguments) is valid
        assert rust[name].is_valid(arguments) is valid
        assert compiled.check_call(name, raw).channel.value == (
            "valid" if valid else "schema_violation"
        )
        timings = {
            "fast": _best_us(lambda n=name, a=arguments: _fastjsonschema_check(fast[n], a), number),
            # jsonschema-rs: the boolean fast path, plus every error path when it fails.
            "rust": _best_us(
                lambda n=name, a=arguments: rust[n].is_valid(a) or list(rust[n].iter_errors(a)),
                number,
            ),
            "python": _best_us(
                lambda n=name, a=arguments: list(python[n].iter_errors(a)), max(number // 10, 1)
            ),
            "proxy": _best_us(lambda n=name, r=raw: compiled.check_call(n, r), number),
        }
        for key, value in timings.items():
            totals[key] += value
        print(
            f"{name[:34]:34} {'y' if valid else 'n':>3} {timings['fast']:15.2f} "
            f"{timings['rust']:14.2f} {timings['python']:11.2f} {timings['proxy']:16.2f}"
        )
    count = len(CALLS)
    print(
        f"{'mean':34} {'':>3} {totals['fast'] / count:15.2f} {totals['rust'] / count:14.2f} "
        f"{totals['python'] / count:11.2f} {totals['proxy'] / count:16.2f}"
    )

    name, arguments, _ = CALLS[5]
    print(f"\nWhat each library reports for {name}({orjson.dumps(arguments).decode()}):")
    try:
        fast[name](arguments)
    except fastjsonschema.JsonSchemaValueException as exc:
        print(f"  fastjsonschema: first error only: {exc.message} (path {exc.path})")
    for error in rust[name].iter_errors(arguments):
        print(f"  jsonschema-rs:  {list(error.instance_path)}: {error.message}")
    print(f"  proxy:          {compiled.check_call(name, arguments).error_paths}")

    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": n, "arguments": orjson.dumps(a).decode()},
            }
            for n, a, _ in CALLS[:2]
        ],
    }
    print("\nPer request (microseconds):")
    print(
        f"  ToolsCache.compile, cache hit ({len(orjson.dumps(tools))} B of tools): "
        f"{_best_us(lambda: cache.compile(body), number):.2f}"
    )
    print(
        f"  ToolsCache.compile, cold (16 validators):          "
        f"{_best_us(lambda: ToolsCache().compile(body), max(number // 100, 1)):.2f}"
    )
    print(
        f"  check_message, 2 valid parallel calls:            "
        f"{_best_us(lambda: compiled.check_message(message), number):.2f}"
    )
    text = {"role": "assistant", "content": "Your order #W2378156 was delivered on May 2. " * 8}
    print(
        f"  check_message, plain text answer (~360 chars):    "
        f"{_best_us(lambda: compiled.check_message(text), number):.2f}"
    )
    in_text = {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_order", "arguments": {}}</tool_call>',
    }
    print(
        f"  check_message, call written as text:              "
        f"{_best_us(lambda: compiled.check_message(in_text), number):.2f}"
    )
    bare = {
        "role": "assistant",
        "content": 'Let me check. {"name": "get_order_details", "arguments": '
        '{"order_id": "#W2378156"}}',
    }

    def promote_bare() -> object:
        return promote(bare, compiled.check_message(bare))

    print(
        f"  check_message + promote, bare JSON call in text:  {_best_us(promote_bare, number):.2f}"
    )
    data = {
        "role": "assistant",
        "content": 'The order record is {"order_id": "#W2378156", "status": "delivered", '
        '"items": [{"name": "lamp", "price": 48.2}]}. Anything else?',
    }
    print(
        f"  check_message, prose holding JSON (not a call):   "
        f"{_best_us(lambda: compiled.check_message(data), number):.2f}"
    )
    print(
        f"  check_call, unknown tool, name seen before:       "
        f"{_best_us(lambda: compiled.check_call('get_order_status', '{}'), number):.2f}"
    )
    fresh = iter([f"lookup_order_{i}" for i in range(10 * number)])
    print(
        f"  check_call, unknown tool, new name (difflib):     "
        f"{_best_us(lambda: compiled.check_call(next(fresh), '{}'), max(number // 10, 1)):.2f}"
    )


if __name__ == "__main__":
    main()
