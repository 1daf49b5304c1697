"""vLLM for CPU behind the proxy: set-up figures, start-up, speed, and what vLLM's hermes parser
did with each answer beside what the proxy did with it.

``python -m benchmarks.vllm_cpu``

Sets vLLM up if needed (``repairproxy.local.vllm_cpu``: venv, bf16 conversion; the conversion's
time and peak memory come from its ``convert.json``), starts one server (seconds to healthy, the
server's resident memory summed over its processes), times a plain 64-token decode, then sends
each scenario twice, straight to vLLM and through the proxy, and records per scenario the calls
vLLM returned (structured ``tool_calls`` / function_call items / tool_use blocks) or left in the
text, and the calls the client of the proxy got with the proxy's headers. Greedy, one run each,
on a shared 2-core machine: the speed figures are noisy. Writes ``benchmarks/results/vllm_cpu.*``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.support.results import run_recorded, write_json, write_text
from evals.grid.launch import ManagedProcess, free_port
from repairproxy.local.vllm_cpu import SERVER_ENV, ensure_vllm_cpu
from repairproxy.settings import Settings
from tests.support.proxy_server import running_proxy

QUESTION = "What does vLLM on CPU serve behind the proxy: set-up, start-up, speed, each answer?"

COMMAND = "python -m benchmarks.vllm_cpu"
WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CHAT_TOOLS = [{"type": "function", "function": WEATHER}]
ASK = "What is the weather in Paris right now? Use a tool."
INVENTED = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather_lookup", "arguments": '{"city": "Rome"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    {"role": "assistant", "content": "It is 21 °C in Rome."},
    {"role": "user", "content": "And in Paris? Call weather_lookup again."},
]


def _chat(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "messages": messages,
        "tools": CHAT_TOOLS,
        "temperature": 0,
        "seed": 1,
        "max_tokens": 60,
        **extra,
    }


# name -> (path, body, repair mode through the proxy)
SCENARIOS: dict[str, tuple[str, dict[str, Any], str]] = {
    "chat auto": ("chat/completions", _chat([{"role": "user", "content": ASK}]), "promote"),
    "chat auto, streamed": (
        "chat/completions",
        _chat([{"role": "user", "content": ASK}], stream=True),
        "promote",
    ),
    "chat required": (
        "chat/completions",
        _chat([{"role": "user", "content": ASK}], tool_choice="required"),
        "promote",
    ),
    "chat, invented name in history": ("chat/completions", _chat(INVENTED), "constrained"),
    "responses auto": (
        "responses",
        {
            "input": ASK,
            "tools": [{"type": "function", **WEATHER}],
            "temperature": 0,
            "max_output_tokens": 60,
        },
        "promote",
    ),
    "messages auto": (
        "messages",
        {
            "messages": [{"role": "user", "content": ASK}],
            "max_tokens": 60,
            "temperature": 0,
            "tools": [
                {
                    "name": WEATHER["name"],
                    "description": WEATHER["description"],
                    "input_schema": WEATHER["parameters"],
                }
            ],
        },
        "promote",
    ),
}


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and every descendant (vLLM runs an engine core child)."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        children.setdefault(int(fields["PPid"]), []).append(int(status.parent.name))
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        stack.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _read_sse(response: httpx.Response) -> dict[str, Any]:
    """A streamed chat answer assembled: text, calls (name + arguments), the proxy's comment."""
    content, comment = "", ""
    calls: dict[int, dict[str, str]] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            comment += line
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                entry["name"] += call.get("function", {}).get("name") or ""
                entry["arguments"] += call.get("function", {}).get("arguments") or ""
    return {"content": content, "calls": list(calls.values()), "comment": comment}


def _summary(path: str, body: dict[str, Any], response: httpx.Response) -> dict[str, Any]:
    """The calls an answer carries as structure, and the head of its text."""
    if body.get("stream"):
        assembled = _read_sse(response)
        calls = [c["name"] for c in assembled["calls"]]
        return {"calls": calls, "text": assembled["content"][:160], "sse": assembled["comment"]}
    data = response.json()
    if response.status_code != 200:
        return {"status": response.status_code, "error": data.get("error", data)}
    if path == "chat/completions":
        message = data["choices"][0]["message"]
        calls = [c["function"]["name"] for c in message.get("tool_calls") or []]
        text = message.get("content") or ""
    elif path == "responses":
        calls = [i["name"] for i in data["output"] if i["type"] == "function_call"]
        text = " ".join(
            part.get("text", "")
            for item in data["output"]
            if item["type"] == "message"
            for part in item.get("content", [])
        )
    else:
        calls = [b["name"] for b in data["content"] if b["type"] == "tool_use"]
        text = " ".join(b.get("text", "") for b in data["content"] if b["type"] == "text")
    return {"calls": calls, "text": text[:160]}


def _send(base: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    with (
        httpx.Client(timeout=600, trust_env=False) as client,
        client.stream("POST", f"{base}/{path}", json=body, headers=headers) as response,
    ):
        response.read() if not body.get("stream") else None
        summary = _summary(path, body, response)
        kept = {k: v for k, v in response.headers.items() if k.startswith("x-repairproxy-")}
    summary["seconds"] = round(time.monotonic() - started, 1)
    if kept:
        summary["headers"] = kept
    return summary


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    started = time.monotonic()
    setup = ensure_vllm_cpu()
    set_up_s = time.monotonic() - started
    port = free_port()
    log = Path("benchmarks/results/vllm_cpu-server.log")
    log.unlink(missing_ok=True)
    server = ManagedProcess(
        "vllm",
        setup.server_command("127.0.0.1", port),
        f"http://127.0.0.1:{port}/health",
        log,
        env=SERVER_ENV,
        ready_timeout_s=900,
    )
    started = time.monotonic()
    server.start()
    ready_s = time.monotonic() - started
    figures: dict[str, Any] = {
        "set_up_seconds_this_run": round(set_up_s, 1),
        "conversion": {
            k: setup.manifest[k]
            for k in ("seconds", "load_seconds", "peak_rss_bytes", "parameters")
        },
        "checkpoint_sha256": setup.manifest["files"],
        "server_ready_seconds": round(ready_s, 1),
        "server_command": setup.server_command("127.0.0.1", port),
        "server_env": SERVER_ENV,
    }
    base = f"http://127.0.0.1:{port}/v1"
    try:
        model = httpx.get(f"{base}/models", timeout=30).json()["data"][0]["id"]
        started = time.monotonic()
        plain = httpx.post(
            f"{base}/completions",
            json={
                "model": model,
                "prompt": "def fib(n):",
                "max_tokens": 64,
                "temperature": 0,
                "ignore_eos": True,
            },
            timeout=600,
        ).json()
        decode_s = time.monotonic() - started
        tokens = plain["usage"]["completion_tokens"]
        figures["decode_tokens_per_second"] = round(tokens / decode_s, 2)
        figures["server_rss_bytes"] = _tree_rss_bytes(server.pid or 0)
        rows: dict[str, Any] = {}
        with running_proxy(Settings(upstream=base, max_repairs=2)) as proxy:
            for name, (path, body, mode) in SCENARIOS.items():
                full = {"model": model, **body}
                rows[name] = {
                    "repair": mode,
                    "vllm": _send(base, path, full, {}),
                    "proxy": _send(proxy.base_url, path, full, {"X-Repairproxy-Repair": mode}),
                }
                print(name, json.dumps(rows[name])[:400], flush=True)
        figures["scenarios"] = rows
    finally:
        server.stop()
    figures["server_rss_bytes_note"] = "VmRSS of the API server and its engine-core children"
    write_json("vllm_cpu", figures, command=COMMAND)
    lines = [
        f"set-up this run {set_up_s:.0f} s; conversion {setup.manifest['seconds']} s, peak "
        f"{int(str(setup.manifest['peak_rss_bytes'])) / 1e9:.1f} GB; server ready {ready_s:.0f} s, "
        f"{figures['server_rss_bytes'] / 1e9:.1f} GB RSS; decode "
        f"{figures['decode_tokens_per_second']} tokens/s",
        "",
        f"{'scenario':34} {'vLLM: calls | text':44} proxy: calls (headers)",
    ]
    for name, row in rows.items():
        vllm, proxied = row["vllm"], row["proxy"]
        head = f"{vllm.get('calls')} | {vllm.get('text', '')[:30]!r}"
        marks = proxied.get("headers", {})
        note = ", ".join(
            f"{k.removeprefix('x-repairproxy-')}={v}"
            for k, v in marks.items()
            if k.endswith(("promoted", "repairs", "tool-errors")) and v not in ("", "0")
        )
        if proxied.get("sse"):
            note = proxied["sse"][:80]
        lines.append(f"{name:34} {head:44} {proxied.get('calls')} ({note or '-'})")
    table = "\n".join(lines)
    print(table)
    write_text("vllm_cpu", table, command=COMMAND)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_recorded("vllm_cpu", main))
