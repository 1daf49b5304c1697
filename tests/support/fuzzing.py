"""Fuzzing the request path: hypothesis-generated requests, tool schemas, model answers and SSE
chunk boundaries, through the real proxy in front of a raw upstream that tags every answer.

Every request carries a unique ``x-fuzz-tag`` header; the proxy forwards it upstream (re-asks
too), and the upstream answers with ids that end in the tag. A client that receives another
client's answer sees a foreign tag: that is the check that matters most. Each case also checks
that the proxy made no 5xx of its own for client input, and that the process still answers.

Tenants: the proxy runs with three client keys. Each case is sent with key A or B, and half of
the cases name an episode id from a small pool every tenant uses (``EPISODE_POOL``); its
concurrent neighbour is a third tenant, the sentinel, that names the same episode id and only
ever sends plain requests. Its episode must stay untouched: 200, 0 errors, whatever A and B
spent on their episodes of that name (``_check_isolated``). Every request (the sentinel's too)
presents its key in one of the forms authentication accepts (``credentials.CREDENTIAL_HEADERS``,
drawn per request), so a form that authentication accepts but tenancy ignores would merge
tenants and spend the sentinel's episode. ``fuzz_rig(episode_store=...)`` runs the same against
Redis.

Used by ``tests/proxy/test_fuzz.py`` (a few hundred cases) and ``benchmarks/fuzz.py`` (10,000+).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from hypothesis import strategies as st

from repairproxy.credentials import CREDENTIAL_HEADERS
from repairproxy.settings import Settings
from repairproxy.types import BudgetPolicy
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.servers import raw_server

__all__ = [
    "EPISODE_POOL",
    "FORMS",
    "KEYS",
    "SENTINEL_KEY",
    "Case",
    "FuzzRig",
    "cases",
    "credential",
    "fuzz_rig",
]

# Client keys of the fuzzed tenants, and the sentinel's; episode ids every tenant reuses.
KEYS = ("fuzz-key-a", "fuzz-key-b")
SENTINEL_KEY = "fuzz-key-sentinel"
EPISODE_POOL = tuple(f"shared-{n}" for n in range(4))
# The header names of every credential form authentication accepts, in its order.
FORMS = tuple(name for name, _ in CREDENTIAL_HEADERS)


def credential(form: str, key: str) -> dict[str, str]:
    """The header that presents ``key`` in ``form`` (one of ``FORMS``)."""
    scheme = dict(CREDENTIAL_HEADERS)[form]
    return {form: (scheme.strip().capitalize() + " " if scheme else "") + key}


_tags = itertools.count(1)
_NAMES = ["get_order", "find_user", "cancel_order", "refund", "lookup", "x" * 70, "名前", ""]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=12))
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def tool_schemas(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["object", "object", "object", "weird"]))
    if kind == "weird":
        return draw(st.one_of(json_value, st.just({"type": "nonsense"})))
    props = draw(
        st.dictionaries(
            st.sampled_from(["order_id", "email", "items", "n", "reason"]),
            st.sampled_from(
                [
                    {"type": "string"},
                    {"type": "integer"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "string", "enum": ["a", "b"]},
                ]
            ),
            max_size=3,
        )
    )
    return {"type": "object", "properties": props, "required": sorted(props)[:1]}


@st.composite
def tools(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 19)) == 0:
        return draw(json_value)  # not a list of tools at all
    names = draw(st.lists(st.sampled_from(_NAMES[:5]), min_size=1, max_size=3, unique=True))
    return [
        {"type": "function", "function": {"name": n, "parameters": draw(tool_schemas())}}
        for n in names
    ]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def arguments(draw: st.DrawFn) -> str:
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return draw(st.text(max_size=20))  # usually not JSON
    if choice == 1:
        return _deep(draw(st.sampled_from([10, 300, 5000])))
    return orjson.dumps(draw(st.dictionaries(st.text(max_size=8), json_value, max_size=3))).decode()


@st.composite
def answers(draw: st.DrawFn) -> dict[str, Any]:
    """A model's message: text (maybe a call written as text), tool calls, or nothing."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    kind = draw(st.sampled_from(["calls", "calls", "text", "textcall", "empty"]))
    if kind == "calls":
        message["tool_calls"] = [
            {
                "id": draw(st.sampled_from(["0", "call_1", "", "c" * 300])),
                "type": "function",
                "function": {"name": draw(st.sampled_from(_NAMES)), "arguments": draw(arguments())},
            }
            for _ in range(draw(st.integers(1, 3)))
        ]
    elif kind == "text":
        message["content"] = draw(st.text(max_size=60))
    elif kind == "textcall":
        name = draw(st.sampled_from(_NAMES))
        body = (
            orjson.dumps({"name": name}).decode()[:-1] + ', "arguments": ' + draw(arguments()) + "}"
        )
        wrap = draw(
            st.sampled_from(["%s", "```json\n%s\n```", "<tool_call>%s</tool_call>", "x %s y"])
        )
        message["content"] = wrap % body
    return message


@dataclass
class Case:
    """One generated exchange: what the client sends and what the upstream will answer."""

    body: Any
    stream: bool
    status: int
    raw_answer: bytes | None  # garbage instead of a completion, when set
    message: dict[str, Any]
    chunk_sizes: list[int] = field(default_factory=list)
    mode: str = "reflexive"
    key: str = KEYS[0]
    episode: str | None = None  # X-Episode-ID, from EPISODE_POOL; None: chained
    form: str = FORMS[0]  # the header that carries the key


@st.composite
def cases(draw: st.DrawFn) -> Case:
    messages: Any = [{"role": "user", "content": draw(st.text(max_size=30))}]
    if draw(st.integers(0, 9)) == 0:
        messages = draw(json_value)
    elif draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": draw(st.text(max_size=30))})
        messages.append(
            {"role": "tool", "tool_call_id": "0", "content": "Error: " + draw(st.text(max_size=20))}
        )
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["m", "名", "x" * 100])),
        "messages": messages,
    }
    if draw(st.integers(0, 3)) > 0:
        body["tools"] = draw(tools())
    if draw(st.integers(0, 5)) == 0:
        body["tool_choice"] = draw(st.sampled_from(["none", "auto", "required", 7]))
    if draw(st.integers(0, 7)) == 0:
        body["n"] = draw(st.integers(1, 3))
    stream = draw(st.booleans())
    body["stream"] = stream
    status = draw(st.sampled_from([200] * 8 + [400, 429, 500]))
    raw = draw(st.sampled_from([None] * 9 + [b"not json", b'{"object": "list"}', b"[]"]))
    return Case(
        body=body,
        stream=stream,
        status=status,
        raw_answer=raw,
        message=draw(answers()),
        chunk_sizes=draw(st.lists(st.integers(1, 64), min_size=1, max_size=6)),
        mode=draw(st.sampled_from(["off", "prompt", "promote", "reflexive", "constrained"])),
        key=draw(st.sampled_from(KEYS)),
        episode=draw(st.sampled_from([None, *EPISODE_POOL])) if draw(st.booleans()) else None,
        form=draw(st.sampled_from(FORMS)),
    )


def _completion(tag: str, message: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{tag}",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": i,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
            for i in range(n)
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _sse(completion: dict[str, Any]) -> bytes:
    message = completion["choices"][0]["message"]
    base = {k: completion[k] for k in ("id", "created", "model")} | {
        "object": "chat.completion.chunk"
    }
    chunks = [{"role": "assistant", "content": message.get("content") or ""}]
    for index, call in enumerate(message.get("tool_calls") or ()):
        chunks.append({"tool_calls": [{"index": index, **call}]})
    events = [
        b"data: "
        + orjson.dumps({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]})
        + b"\n\n"
        for d in chunks
    ]
    events.append(
        b"data: "
        + orjson.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + b"\n\n"
    )
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


@dataclass
class FuzzRig:
    proxy: RunningProxy
    plans: dict[str, Case]
    client: httpx.Client
    lock: threading.Lock

    def run(self, case: Case) -> None:
        """Send the case (plus a concurrent plain neighbour) and check what came back."""
        tag, neighbour = f"t{next(_tags)}", f"t{next(_tags)}"
        plain = Case(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            False,
            200,
            None,
            {"role": "assistant", "content": "hello"},
            key=SENTINEL_KEY,
            episode=case.episode or EPISODE_POOL[0],
            form=FORMS[int(tag[1:]) % len(FORMS)],  # the sentinel mixes every form too
        )
        with self.lock:
            self.plans[tag], self.plans[neighbour] = case, plain
        results: dict[str, httpx.Response] = {}

        def send(which: str, plan: Case) -> None:
            try:
                content = orjson.dumps(plan.body)
            except TypeError:
                content = b"{}"
            headers = {
                "x-fuzz-tag": which,
                "x-repairproxy-repair": plan.mode,
                "content-type": "application/json",
                **credential(plan.form, plan.key),
            }
            if plan.episode is not None:
                headers["x-episode-id"] = plan.episode
            results[which] = self.client.post(
                self.proxy.base_url + "/chat/completions", content=content, headers=headers
            )

        other = threading.Thread(target=send, args=(neighbour, plain))
        other.start()
        try:
            send(tag, case)
        finally:
            other.join()
        for which, response in results.items():
            _check(which, response)
        _check_isolated(neighbour, results[neighbour])
        with self.lock:
            del self.plans[tag], self.plans[neighbour]


def _check(tag: str, response: httpx.Response) -> None:
    text = response.text
    assert "internal proxy error" not in text, text[:300]
    foreign = [t for t in _ids(text) if t != tag]
    assert not foreign, f"client {tag} received the answer of {foreign}"
    if response.status_code >= 500:
        body = orjson.loads(response.content)
        assert body["error"]["message"], text[:300]  # the upstream's own 5xx or an OpenAI error


def _check_isolated(tag: str, response: httpx.Response) -> None:
    """The sentinel tenant's episode saw only its own plain requests: nothing spent."""
    errors = response.headers.get("x-repairproxy-episode-errors")
    assert response.status_code == 200 and errors == "0", (
        f"cross-tenant effect on sentinel {tag}: {response.status_code}, errors {errors}"
    )


def _ids(text: str) -> list[str]:
    out = []
    for part in text.split("chatcmpl-")[1:]:
        tag = part.split('"', 1)[0]
        out.append(tag)
    return out


def _upstream_handler(plans: dict[str, Case], lock: threading.Lock) -> Any:
    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> None:
        head = request.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
        tag = next(
            (
                line.split(":", 1)[1].strip()
                for line in head.split("\r\n")
                if line.startswith("x-fuzz-tag:")
            ),
            "",
        )
        with lock:
            case = plans.get(tag)
        if case is None:
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return
        is_reask = b'"stream":false' in request and case.stream  # repairs never stream
        if case.status != 200:
            payload = orjson.dumps({"error": {"message": f"upstream {case.status} chatcmpl-{tag}"}})
            writer.write(
                b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (case.status, len(payload), payload)
            )
            return
        if case.raw_answer is not None:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(case.raw_answer), case.raw_answer)
            )
            return
        n = (
            case.body.get("n", 1)
            if isinstance(case.body, dict) and isinstance(case.body.get("n"), int)
            else 1
        )
        completion = _completion(tag, case.message, max(1, min(n, 3)))
        if case.stream and not is_reask:
            payload = _sse(completion)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            position, sizes = 0, itertools.cycle(case.chunk_sizes)
            while position < len(payload):
                piece = payload[position : position + next(sizes)]
                position += len(piece)
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            return
        payload = orjson.dumps(completion)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )

    return handle


@contextmanager
def fuzz_rig(episode_store: str = "memory") -> Iterator[FuzzRig]:
    """The proxy (episodes in ``episode_store``: memory or a Redis URL) before the tagging
    upstream."""
    plans: dict[str, Case] = {}
    lock = threading.Lock()
    with ExitStack() as stack:
        url = stack.enter_context(raw_server(_upstream_handler(plans, lock)))
        proxy = stack.enter_context(
            running_proxy(
                Settings(
                    upstream=url + "/v1",
                    max_repairs=1,
                    upstream_timeout=10,
                    api_keys=(*KEYS, SENTINEL_KEY),
                    tenant_secret="fuzz",
                    budget=2,
                    on_budget_exhausted=BudgetPolicy.REJECT,
                    episode_store=episode_store,
                )
            )
        )
        client = stack.enter_context(httpx.Client(timeout=30, trust_env=False))
        yield FuzzRig(proxy, plans, client, lock)
        assert client.get(proxy.root_url + "/healthz").status_code == 200
