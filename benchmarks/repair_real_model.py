"""Real-model check of repair: what reaches the agent with off, promote, reflexive, constrained.

One proxy per precision arm serves every repair mode (``X-Repairproxy-Repair`` per request); the
prompts tempt the model to call tools that are not declared. Each delivered answer is re-validated
client-side with the proxy's own validator, so the counts are of what the agent actually received:
answers with an invalid call (or a call left as text), and answers whose first call is the right
tool. With repair off the delivered answer is the model's own, so its per-channel counts (and the
invented tool names) describe the model.

    python -m benchmarks.repair_real_model                      # embedded CPU model, q4_k_m
    python -m benchmarks.repair_real_model --arms q4_k_m q3_k_m-requant --prompts 10
    python -m benchmarks.repair_real_model --upstream URL --model NAME
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx

from benchmarks.support.results import run_recorded
from repairproxy.validation import ToolsCache

__all__ = ["main"]

QUESTION = (
    "What reaches the agent on a real model with repair off, promote, reflexive, constrained?"
)


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in properties.items()},
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


TOOLS = [
    _tool("get_order_details", "Get the status and items of an order.", order_id="string"),
    _tool("find_user_id_by_email", "Find a user id by email address.", email="string"),
    _tool("get_user_details", "Get a user's profile, addresses and orders.", user_id="string"),
    _tool(
        "modify_pending_order_address",
        "Change the shipping address of a pending order.",
        order_id="string",
        address="string",
    ),
]
SYSTEM = (
    "You are a retail customer-service agent. Act only through the listed tools, one call at a "
    "time, and never invent order ids."
)
# (prompt, the right first tool among the declared ones)
PROMPTS = [
    ("Cancel my order #W2378156 right now, I don't want it anymore.", "get_order_details"),
    ("Please refund order #W7654321 to my credit card.", "get_order_details"),
    ("Track the package for order #W1111111, where is the truck?", "get_order_details"),
    ("My email is ana@example.com. Delete my account please.", "find_user_id_by_email"),
    ("Return the shoes from order #W5555555, they are too small.", "get_order_details"),
    ("Apply a 10% discount code SAVE10 to order #W3333333.", "get_order_details"),
    ("Change the payment method of order #W4444444 to PayPal.", "get_order_details"),
    ("What is the status of order #W2378156?", "get_order_details"),
    ("My email is bo@example.com, which address do you have for me?", "find_user_id_by_email"),
    (
        "Ship pending order #W2222222 to 5 Main St, Austin TX 78701 instead.",
        "modify_pending_order_address",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run_mode(
    client: httpx.Client,
    model: str,
    mode: str,
    prompts: list[tuple[str, str]],
    verbose: bool,
    max_tokens: int = 160,
) -> dict[str, Any]:
    validator = ToolsCache().compile({"tools": TOOLS})
    assert validator is not None
    declared = set(validator.names)
    delivered: Counter[str] = Counter()  # channels of the calls the agent received
    caught: Counter[str] = Counter()  # channels the proxy caught (first answer and re-asks)
    invented: Counter[str] = Counter()  # undeclared names in what the agent received
    invalid_answers = right = repairs = promoted = failed = 0
    seconds = 0.0
    for prompt, expected in prompts:
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt},
            ],
            "tools": TOOLS,
            "temperature": 0.0,
            "max_tokens": max_tokens,
        }
        started = time.perf_counter()
        response = client.post(
            "/v1/chat/completions", json=body, headers={"X-Repairproxy-Repair": mode}
        )
        seconds += time.perf_counter() - started
        if response.status_code != 200:
            delivered["http_" + str(response.status_code)] += 1
            invalid_answers += 1
            continue
        repairs += int(response.headers.get("x-repairproxy-repairs", "0"))
        promoted += int(response.headers.get("x-repairproxy-promoted", "0"))
        failed += "x-repairproxy-repair-failed" in response.headers
        for channel in filter(
            None, response.headers.get("x-repairproxy-tool-errors", "").split(",")
        ):
            caught[channel] += 1
        message = response.json()["choices"][0]["message"]
        verdict = validator.check_message(message)
        for call in verdict.calls:
            delivered[str(call.channel)] += 1
            if call.name and call.name not in declared:
                invented[call.name] += 1
        invalid_answers += not verdict.ok
        calls = [c["function"]["name"] for c in message.get("tool_calls") or ()]
        right += bool(calls) and calls[0] == expected
        if verbose:
            print(
                f"  [{mode}] {time.perf_counter() - started:5.1f}s "
                f"caught={response.headers.get('x-repairproxy-tool-errors')!r} "
                f"delivered={[str(c.channel) for c in verdict.calls]} calls={calls} "
                f"text={(message.get('content') or '')[:80]!r}",
                flush=True,
            )
    return {
        "delivered": delivered,
        "caught": caught,
        "invented": invented,
        "invalid_answers": invalid_answers,
        "right": right,
        "repairs": repairs,
        "promoted": promoted,
        "failed": failed,
        "seconds": seconds,
    }


# Only an order lookup declared, and a request no declared tool can serve: the right answer is
# text. A re-ask that must produce a call made one up (get_order_details for an email).
EMAIL_PROMPT = "Send an email to bob@example.com saying that his refund is on its way."


def _send_email_case(client: httpx.Client, model: str, mode: str, max_tokens: int) -> str:
    """What the agent receives for ``EMAIL_PROMPT`` with only ``get_order_details`` declared:
    ``text`` or ``call:NAME(ARGUMENTS)`` (or ``http_STATUS``), the proxy's account of the first
    answer and its re-asks (headers), and the delivered text."""
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": EMAIL_PROMPT},
        ],
        "tools": TOOLS[:1],
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    response = client.post(
        "/v1/chat/completions", json=body, headers={"X-Repairproxy-Repair": mode}
    )
    if response.status_code != 200:
        return f"http_{response.status_code}"
    message = response.json()["choices"][0]["message"]
    calls = [
        f"{c['function']['name']}({c['function']['arguments']})"
        for c in message.get("tool_calls") or ()
    ]
    answer = "call:" + ",".join(calls) if calls else "text"
    headers = response.headers
    # What the model's first answer held (its errors, invented names) and what the proxy did.
    seen = {
        name: headers[f"x-repairproxy-{name}"]
        for name in ("repairs", "first-tool-errors", "unknown-tools", "promoted", "repair-failed")
        if f"x-repairproxy-{name}" in headers
    }
    text = " ".join((message.get("content") or "").split())
    return f"{answer} {seen} content={text[:160]!r}"


def _serve_proxy(upstream: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "repairproxy", "serve", "--upstream", upstream, "--port", str(port)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
    )
    return proxy, port


def _run_arm(label: str, upstream: str, args: argparse.Namespace) -> None:
    proxy, port = _serve_proxy(upstream)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.get("/healthz")
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            prompts = PROMPTS[: args.prompts]
            print(f"\n== {label}: {len(prompts)} prompts, upstream {upstream}", flush=True)
            header = ("mode", "invalid answers", "right tool", "promoted", "repairs", "s/answer")
            print("{:<12} {:>15} {:>10} {:>8} {:>7} {:>8}".format(*header), flush=True)
            for mode in args.modes if prompts else ():
                result = _run_mode(client, args.model, mode, prompts, args.verbose, args.max_tokens)
                print(
                    f"{mode:<12} {result['invalid_answers']:>9}/{len(prompts):<5} "
                    f"{result['right']:>6}/{len(prompts):<3} {result['promoted']:>8} "
                    f"{result['repairs']:>7} {result['seconds'] / len(prompts):>8.1f}   "
                    f"delivered={dict(result['delivered'])} caught={dict(result['caught'])} "
                    f"invented={dict(result['invented'])}"
                    + (f" repair_failed={result['failed']}" if result["failed"] else ""),
                    flush=True,
                )
            print("send-email case, only get_order_details declared (right: text):", flush=True)
            for mode in args.modes:
                answer = _send_email_case(client, args.model, mode, args.max_tokens)
                print(f"  {mode:<12} {answer}", flush=True)
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", help="OpenAI-compatible base URL (default: embedded model)")
    parser.add_argument("--model", default="local")
    parser.add_argument("--arms", nargs="+", default=["q4_k_m"], help="embedded precision arms")
    parser.add_argument(
        "--modes", nargs="+", default=["off", "promote", "reflexive", "constrained"]
    )
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=None, help="embedded model threads")
    parser.add_argument("--verbose", action="store_true", help="one line per answer")
    args = parser.parse_args(argv)
    if args.upstream is not None:
        _run_arm(args.model, args.upstream, args)
        return
    from repairproxy.local import start_embedded_upstream

    for arm in args.arms:
        with start_embedded_upstream(arm, n_ctx=4096, n_threads=args.threads) as embedded:
            _run_arm(arm, embedded.base_url, args)


if __name__ == "__main__":
    raise SystemExit(run_recorded("repair_real_model", main))
