"""Conversation chaining: episodes without a header, as agents really resend their histories."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repairproxy.episodes.budget import BudgetSnapshot, EpisodeRef, ErrorBudget
from repairproxy.episodes.chaining import (
    CanonicalCache,
    ChainLink,
    MemoryChainIndex,
    canonical_message,
    conversation_keys,
)
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.validation import CallVerdict, Channel, CompiledTools
from tests.proxy.conftest import StartProxy
from tests.support.scripted_upstream import Reply, ScriptedUpstream, completion, tool_call
from tests.support.tools import MESSAGES
from tests.support.tools import TOOLS as ROUTE_TOOLS

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "f", "arguments": '{"b":1,"a":[2]}'},
}
ANSWER: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [CALL]}


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


_DROP = object()
_REWRITTEN_CALL = {
    "id": "call_regenerated",
    "name": "f",
    "type": "function",
    "index": 0,
    "function": {"name": "f", "arguments": json.dumps({"a": [2], "b": 1}, indent=None)},
}


@pytest.mark.parametrize(
    "resent",
    [
        _with(ANSWER, content=""),
        _with(ANSWER, content=_DROP),
        _with(ANSWER, refusal=None, annotations=[], audio=None, function_call=None),
        _with(ANSWER, reasoning_content="thinking...", name="agent"),
        _with(ANSWER, tool_calls=[_REWRITTEN_CALL]),  # τ²-bench/LangChain re-serialise arguments
        _with(
            ANSWER,
            tool_calls=[_with(CALL, function={"name": "f", "arguments": {"a": [2], "b": 1}})],
        ),
    ],
    ids=[
        "empty-content",
        "no-content",
        "null-fields",
        "extra-fields",
        "rewritten-call",
        "dict-args",
    ],
)
def test_resent_forms_of_an_answer_digest_alike(resent: dict[str, Any]) -> None:
    with_ids = resent["tool_calls"][0].get("id") == CALL["id"] if "tool_calls" in resent else True
    if with_ids:
        assert canonical_message(resent) == canonical_message(ANSWER)
    plain = canonical_message(resent, with_call_ids=False)
    assert plain == canonical_message(ANSWER, with_call_ids=False)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (
            ANSWER,
            _with(ANSWER, tool_calls=[_with(CALL, function={"name": "g", "arguments": "{}"})]),
        ),
        (
            ANSWER,
            _with(ANSWER, tool_calls=[_with(CALL, function={"name": "f", "arguments": '{"b":2}'})]),
        ),
        (ANSWER, _with(ANSWER, content="text too")),
        (
            {"role": "tool", "tool_call_id": "a", "content": "x"},
            {"role": "tool", "tool_call_id": "b", "content": "x"},
        ),
        ({"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}),
    ],
)
def test_different_messages_digest_differently(one: dict[str, Any], other: dict[str, Any]) -> None:
    assert canonical_message(one) != canonical_message(other)


def test_text_parts_and_strings_digest_alike_and_system_prompts_are_left_out() -> None:
    plain = [{"role": "system", "content": "today is Monday"}, {"role": "user", "content": "hi"}]
    parts = [
        {"role": "system", "content": "today is Tuesday"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    assert conversation_keys(plain) == conversation_keys(parts)
    assert conversation_keys(plain).resume is None
    answer = {"role": "assistant", "content": "hello"}
    keys = conversation_keys([*plain, answer, {"role": "user", "content": "?"}])
    assert keys.resume == conversation_keys(plain).answer_key(answer)
    assert keys.history != keys.resume and keys.plain_resume() is None


def test_answers_without_call_ids_are_remembered_without_ids() -> None:
    """A client that invents ids for id-less calls still finds the conversation."""
    opening = [{"role": "user", "content": "hi"}]
    answer = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    resent = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "pyd_ai_1", "function": {"name": "f", "arguments": "{}"}}],
    }
    remembered = conversation_keys(opening).answer_key(answer)
    later = conversation_keys([*opening, resent, {"role": "tool", "tool_call_id": "pyd_ai_1"}])
    assert later.resume != remembered and later.plain_resume() == remembered
    # With ids present, the id-carrying key is the one remembered and tried first.
    assert conversation_keys(opening).answer_key(resent) == later.resume
    assert canonical_message(answer) != canonical_message(resent)


# --- the index -----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_index_is_bounded_expires_and_marks_ambiguity() -> None:
    clock = FakeClock()
    index = MemoryChainIndex(max_links=3, idle_ttl_seconds=60, clock=clock)
    for key in (b"a", b"b", b"c"):
        await index.link(key, "e-" + key.decode())
    assert await index.lookup(b"a") == ChainLink("e-a")  # touched: b is now the oldest
    await index.link(b"d", "e-d")
    assert len(index) == 3 and await index.lookup(b"b") is None
    await index.link(b"a", "e-a")
    assert await index.lookup(b"a") == ChainLink("e-a")  # the same episode again: not ambiguous
    await index.link(b"a", "e-x")
    assert await index.lookup(b"a") == ChainLink("e-x", ambiguous=True)
    clock.now += 61
    assert await index.lookup(b"a") is None and len(index) == 0
    with pytest.raises(ValueError):
        MemoryChainIndex(max_links=0)


# --- an agent loop without the header ------------------------------------------------------------

TOOLS = CompiledTools(
    [
        ("get_order_details", {"type": "object", "properties": {"order_id": {"type": "string"}}}),
        ("get_user_details", {"type": "object", "properties": {"user_id": {"type": "string"}}}),
    ],
    forbid_extra_arguments=True,
)


def _script(task: int) -> list[tuple[str, str] | None]:
    """One call per turn (None: a text reply); failures as τ²-bench's environment sees them.

    Task t fails 5 + t % 5 calls (5 to 9): two runs merged would exceed τ²-bench's 10.
    """
    failures = 5 + task % 5
    turns: list[tuple[str, str] | None] = [
        ("get_user_details", json.dumps({"user_id": f"u{task}"}))
    ]
    for turn in range(failures):
        if turn % 3 == 1:
            turns.append(("get_order_status", json.dumps({"order_id": f"#W{task}"})))  # unknown
        else:
            turns.append(("get_order_details", json.dumps({"order_id": "#W404"})))  # env failure
        if turn == 2:
            turns.append(None)
    turns.append(("get_order_details", json.dumps({"order_id": "#W1"})))
    turns.append(None)
    return turns


def _execute(name: str, raw: str) -> tuple[str, bool]:
    if name not in TOOLS.names:
        return f"Error: Tool '{name}' not found.", True
    if json.loads(raw).get("order_id") == "#W404":
        return "Error: Order not found", True
    return json.dumps({"ok": name}), False


class Run:
    """One agent run of a task through ErrorBudget, turn by turn, as a pipeline would drive it."""

    def __init__(self, budget: ErrorBudget, task: int, call_id: Callable[[], str]) -> None:
        self.budget = budget
        self.turns = _script(task)
        self.call_id = call_id
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": "retail policy"},
            {"role": "assistant", "content": "Hi! How can I help you today?"},
            {"role": "user", "content": f"I am customer {task}; my order is lost."},
        ]
        self.refs: list[EpisodeRef] = []
        self.tau2_errors = 0

    @property
    def done(self) -> bool:
        return len(self.refs) == len(self.turns)

    async def step(self) -> None:
        turn = self.turns[len(self.refs)]
        body = {"model": "m", "messages": list(self.history)}
        ref = await self.budget.resolve_episode({}, body)
        self.refs.append(ref)
        await self.budget.observe_request(ref.id, body)
        if turn is None:
            answer: dict[str, Any] = {"role": "assistant", "content": "Could you confirm?"}
        else:
            name, raw = turn
            call = {
                "id": self.call_id(),
                "type": "function",
                "function": {"name": name, "arguments": raw},
            }
            answer = {"role": "assistant", "content": None, "tool_calls": [call]}
        first = TOOLS.check_message(answer)
        delivered = tuple(c for c in first.calls if c.channel is not Channel.VALID)
        await self.budget.observe_answer(ref.id, first, None, delivered)
        await self.budget.remember_answer(ref, body, answer)
        self.history.append(answer)
        if turn is None:
            self.history.append({"role": "user", "content": "Yes."})
            return
        content, failed = _execute(*turn)
        self.tau2_errors += failed
        self.history.append(
            {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": content}
        )

    async def final(self) -> BudgetSnapshot:
        """What the budget says once the last results are in (the agent's next request)."""
        ref = await self.budget.resolve_episode({}, {"messages": self.history})
        return await self.budget.observe_request(ref.id, {"messages": self.history})


def _counting_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"  # the same in every run, like a deterministic upstream


def _random_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"chatcmpl-tool-{next(counter):08x}"  # unique across runs, like vLLM's uuids


@pytest.mark.anyio
@pytest.mark.parametrize("ids", ["upstream-unique", "deterministic"])
async def test_tau2_cli_runs_without_the_header_never_merge(ids: str) -> None:
    """τ²-bench's CLI: 2 trials of 20 tasks, one after another, no header. 40 episodes, each
    counted as τ²-bench counts it (≤ 10); the fingerprint merged them into 20 counting up to 18.
    With deterministic ids (identical histories across trials) the counts stay exact too."""
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10)
    unique = _random_ids()
    started = []
    for _trial in range(2):
        for task in range(20):
            run = Run(budget, task, unique if ids == "upstream-unique" else _counting_ids())
            while not run.done:
                await run.step()
            final = await run.final()
            assert final.errors == run.tau2_errors == 5 + task % 5
            assert not final.exhausted
            started.append(run.refs[0].id)
            assert run.refs[0].new and not any(ref.new for ref in run.refs[1:])
            if ids == "upstream-unique":
                assert {ref.id for ref in run.refs} == {run.refs[0].id}  # one stable id
    assert len(set(started)) == 40


@pytest.mark.anyio
async def test_identical_concurrent_runs_keep_their_own_counts() -> None:
    """Two runs of one task in lockstep, byte-identical (a deterministic model and ids): the
    proxy cannot tell them apart, so it forks; neither run is charged the other's errors."""
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10)
    runs = [Run(budget, 3, _counting_ids()) for _ in range(2)]
    while not runs[0].done:
        for run in runs:
            await run.step()
    for run in runs:
        final = await run.final()
        assert final.errors == run.tau2_errors == 8


@pytest.mark.anyio
async def test_different_concurrent_runs_keep_stable_episodes() -> None:
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10)
    ids = _random_ids()
    runs = [Run(budget, task, ids) for task in (1, 1, 2)]
    while not all(run.done for run in runs):
        for run in runs:
            if not run.done:
                await run.step()
    episodes = [{ref.id for ref in run.refs} for run in runs]
    assert all(len(one) == 1 for one in episodes)
    assert len(set.union(*episodes)) == 3
    assert [(await run.final()).errors for run in runs] == [6, 6, 7]


@pytest.mark.anyio
async def test_a_retried_request_continues_its_episode() -> None:
    budget = ErrorBudget(MemoryEpisodeStore())
    body = {"messages": [{"role": "user", "content": "hi"}]}
    first = await budget.resolve_episode({}, body)
    await budget.remember_answer(first, body, {"role": "assistant", "content": "hello"})
    follow = {
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "x"},
        ]
    }
    for _ in range(2):  # the client timed out and sent the same request again
        again = await budget.resolve_episode({}, follow)
        assert (again.id, again.new, again.explicit) == (first.id, False, False)
        await budget.remember_answer(again.id, follow, {"role": "assistant", "content": "answer"})
    # An answer the proxy never gave starts a new episode.
    forged = {"messages": [*body["messages"], {"role": "assistant", "content": "other"}]}
    assert (await budget.resolve_episode({}, forged)).new


# --- the openai SDK resending what it received ---------------------------------------------------


def _upstream_answer(turn: int) -> dict[str, Any]:
    """A chat completion as vLLM returns one: compact arguments, null and extra fields."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": [],
        "reasoning_content": "let me look",
        "tool_calls": [
            {
                "id": f"chatcmpl-tool-{turn}",
                "type": "function",
                "function": {"name": "get_order_status", "arguments": '{"order_id":"#W1"}'},
            }
        ],
    }
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


RESENDS: dict[str, Callable[[Any], Any]] = {
    "the-message-object": lambda message: message,
    "model_dump": lambda message: message.model_dump(),
    "model_dump-exclude-none": lambda message: message.model_dump(exclude_none=True),
    "tau2-litellm-dict": lambda message: {
        "role": "assistant",
        "content": message.content,
        "tool_calls": [
            {
                "id": call.id,
                "name": call.function.name,
                "function": {
                    "name": call.function.name,
                    "arguments": json.dumps(json.loads(call.function.arguments)),
                },
                "type": "function",
            }
            for call in message.tool_calls
        ],
    },
}


@pytest.mark.anyio
@pytest.mark.parametrize("resend", list(RESENDS))
async def test_openai_sdk_resent_histories_keep_chaining(resend: str) -> None:
    """The real openai client serialises each request; a transport at the seam hands the bytes
    to the budget exactly as the proxy would receive them."""
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10)
    refs: list[EpisodeRef] = []
    snapshots: list[BudgetSnapshot] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        ref = await budget.resolve_episode(dict(request.headers), body)
        refs.append(ref)
        snapshots.append(await budget.observe_request(ref.id, body))
        completion = _upstream_answer(len(refs))
        message = completion["choices"][0]["message"]
        first = TOOLS.check_message(message)
        invalid: tuple[CallVerdict, ...] = tuple(
            c for c in first.calls if c.channel is not Channel.VALID
        )
        await budget.observe_answer(ref.id, first, None, invalid)
        await budget.remember_answer(ref, body, message)
        return httpx.Response(200, json=completion)

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport) as http:
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", http_client=http)
        messages: list[Any] = [
            {"role": "system", "content": "policy"},
            {"role": "user", "content": "where is #W1?"},
        ]
        for _ in range(4):
            completion = await client.chat.completions.create(model="m", messages=messages)
            message = completion.choices[0].message
            messages.append(RESENDS[resend](message))
            for call in message.tool_calls or ():
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": "Error: Tool 'get_order_status' not found.",
                    }
                )
    assert refs[0].new and len({ref.id for ref in refs}) == 1
    # Each hallucinated call charged once in its answer, its environment error absorbed.
    assert [s.errors for s in snapshots] == [0, 1, 2, 3]


# --- end to end: the openai client through a real proxy on loopback, no header -------------------


def _agent_turns(
    proxy_url: str, upstream: ScriptedUpstream, replies: list[Reply], *, stream: bool
) -> list[tuple[str, int]]:
    """One agent conversation: (episode id, episode errors) per turn, as the headers say."""
    seen: list[tuple[str, int]] = []
    messages: list[Any] = list(MESSAGES)
    with openai.OpenAI(base_url=proxy_url, api_key="k", max_retries=0) as client:
        for reply in replies:
            upstream.push(reply)
            raw = client.chat.completions.with_raw_response.create(
                model="scripted-model", messages=messages, tools=ROUTE_TOOLS, stream=stream
            )
            seen.append(
                (
                    raw.headers["x-repairproxy-episode-id"],
                    int(raw.headers["x-repairproxy-episode-errors"]),
                )
            )
            if stream:
                content, calls = "", {}
                for chunk in raw.parse():
                    delta = chunk.choices[0].delta if chunk.choices else None
                    content += (delta.content or "") if delta else ""
                    for call in (delta.tool_calls or []) if delta else []:
                        entry = calls.setdefault(
                            call.index, {"id": call.id, "name": "", "args": ""}
                        )
                        entry["name"] += call.function.name or ""
                        entry["args"] += call.function.arguments or ""
                message: Any = {"role": "assistant", "content": content or None}
                if calls:
                    message["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["args"]},
                        }
                        for c in calls.values()
                    ]
                tool_calls = message.get("tool_calls") or []
                ids_names = [(c["id"], c["function"]["name"]) for c in tool_calls]
            else:
                message = raw.parse().choices[0].message
                ids_names = [(c.id, c.function.name) for c in message.tool_calls or []]
            messages.append(message)
            for call_id, name in ids_names:
                declared = name in {t["function"]["name"] for t in ROUTE_TOOLS}
                content = (
                    '{"status": "delivered"}' if declared else f"Error: Tool '{name}' not found."
                )
                messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
            if not ids_names:
                messages.append({"role": "user", "content": "Thanks, and my other order?"})
    return seen


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_sequential_runs_through_the_proxy_chain_without_the_header(
    stream: bool, upstream: ScriptedUpstream, start_proxy: StartProxy
) -> None:
    """Two runs of one task, one after the other, no X-Episode-ID, reject policy on: each run is
    one episode with its own count, and a spent chained episode is never refused (not explicit)."""
    proxy = start_proxy(repair="off", budget=1, on_budget_exhausted="reject")
    runs = []
    for _ in range(2):
        replies = [
            completion(tool_calls=[tool_call("get_order_status", {"order_id": "#W1"})]),
            completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]),
            completion(content="It was delivered."),
            completion(content="Anything else?"),
        ]
        runs.append(_agent_turns(proxy.base_url, upstream, replies, stream=stream))
    for run in runs:
        assert len({episode for episode, _ in run}) == 1
        # The hallucinated call is charged once, its environment error absorbed; spent, not refused.
        assert [errors for _, errors in run] == [1, 1, 1, 1]
    assert runs[0][0][0] != runs[1][0][0]


# --- properties over generated histories ---------------------------------------------------------

_words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_arguments = st.dictionaries(
    st.text("abcxyz", min_size=1, max_size=3),
    st.one_of(st.integers(-5, 5), _words, st.lists(st.integers(0, 3), max_size=2)),
    max_size=3,
)


@st.composite
def _calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(["f", "g", "get_order_details"]), min_size=1, max_size=2))
    return [
        {
            "id": f"call_{index}_{draw(st.integers(0, 999))}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(draw(_arguments))},
        }
        for index, name in enumerate(names)
    ]


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
    if role == "assistant" and draw(st.booleans()):
        return {"role": role, "content": None, "tool_calls": draw(_calls())}
    if role == "tool":
        return {"role": role, "tool_call_id": f"call_{draw(st.integers(0, 3))}", "content": "x"}
    return {"role": role, "content": draw(_words)}


_histories = st.lists(_message(), max_size=6)
_answers = st.one_of(
    st.builds(lambda text: {"role": "assistant", "content": text}, _words),
    st.builds(lambda calls: {"role": "assistant", "content": None, "tool_calls": calls}, _calls()),
)


def _as_resent(answer: dict[str, Any]) -> dict[str, Any]:
    """What a client sends back: arguments re-serialised (spacing, key order), a null content
    dropped, a ``refusal`` added, a call's ``type`` left out."""
    resent: dict[str, Any] = {"role": "assistant", "refusal": None}
    if answer.get("content") is not None:
        resent["content"] = answer["content"]
    calls = []
    for call in answer.get("tool_calls") or ():
        arguments = json.loads(call["function"]["arguments"])
        rewritten = json.dumps(dict(reversed(list(arguments.items()))), indent=1)
        calls.append({"id": call["id"], "function": {**call["function"], "arguments": rewritten}})
    if calls:
        resent["tool_calls"] = calls
    return resent


@settings(max_examples=200, deadline=None, derandomize=True)
@given(history=_histories, answer=_answers, after=_histories)
def test_a_resent_answer_continues_its_history(
    history: list[dict[str, Any]], answer: dict[str, Any], after: list[dict[str, Any]]
) -> None:
    remembered = conversation_keys(history).answer_key(answer)
    # The next turn: the history, the answer as the client resends it, then anything but another
    # assistant message (a request is looked up by its last assistant message).
    tail = [m for m in after if m["role"] != "assistant"]
    keys = conversation_keys([*history, _as_resent(answer), *tail])
    assert keys.resume == remembered


@settings(max_examples=200, deadline=None, derandomize=True)
@given(history=_histories, system=st.lists(_words, min_size=1, max_size=3), at=st.integers(0, 6))
def test_system_prompts_anywhere_leave_the_keys_alone(
    history: list[dict[str, Any]], system: list[str], at: int
) -> None:
    inserted = list(history)
    for text in system:
        inserted.insert(min(at, len(inserted)), {"role": "system", "content": text})
    assert conversation_keys(inserted) == conversation_keys(history)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    history=_histories,
    answer=_answers,
    scopes=st.lists(st.binary(max_size=8), min_size=2, max_size=2, unique=True),
)
def test_histories_under_different_scopes_never_share_a_key(
    history: list[dict[str, Any]], answer: dict[str, Any], scopes: list[bytes]
) -> None:
    one, other = (conversation_keys(history, scope=scope) for scope in scopes)
    assert one.history != other.history
    assert one.answer_key(answer) != other.answer_key(answer)


# -- the per-turn cache of canonical forms ---------------------------------------------------------


def _call_message(arguments: Any, call_id: Any = "call_1") -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(history=_histories, answer=_answers)
def test_the_cache_gives_the_keys_the_plain_pass_gives(
    history: list[dict[str, Any]], answer: dict[str, Any]
) -> None:
    cache = CanonicalCache()
    for _ in range(2):  # the first pass fills the cache, the second reads it
        cached = conversation_keys([*history, _as_resent(answer)], scope=b"s", cache=cache)
        plain = conversation_keys([*history, _as_resent(answer)], scope=b"s")
        assert cached == plain
        assert cached.plain_resume() == plain.plain_resume()
        assert cached.answer_key(answer) == plain.answer_key(answer)
    for message in [*history, answer]:
        for ids in (True, False):
            assert cache.canonical(message, with_call_ids=ids) == canonical_message(
                message, with_call_ids=ids
            )


def test_the_cache_keeps_only_assistant_call_messages_and_hits_on_the_same_bytes() -> None:
    cache = CanonicalCache()
    history = [{"role": "user", "content": "hi"}, ANSWER, {"role": "tool", "content": "ok"}]
    conversation_keys(history, cache=cache)
    assert len(cache) == 1
    held = cache.size
    conversation_keys(json.loads(json.dumps(history)), cache=cache)  # the same turn, resent
    assert (len(cache), cache.size) == (1, held)


@pytest.mark.parametrize(
    ("one", "other", "equal"),
    [
        # Equal as Python values (1 == 1.0 == True), different forms: never one cache entry.
        (_call_message(1), _call_message(True), True),
        (_call_message(1), _call_message(1.0), True),
        (_call_message('{"a": 1}'), _call_message('{"a": 1.0}'), False),
        (_call_message('{"a": 1}'), _call_message('{"a": true}'), False),
    ],
)
def test_messages_equal_as_dicts_keep_their_own_forms(
    one: dict[str, Any], other: dict[str, Any], equal: bool
) -> None:
    assert (one == other) is equal
    assert canonical_message(one) != canonical_message(other)
    cache = CanonicalCache()
    for first, second in ((one, other), (other, one)):
        assert cache.canonical(first) == canonical_message(first)
        assert cache.canonical(second) == canonical_message(second)


def test_the_cache_stays_within_its_bytes_and_drops_the_oldest_first() -> None:
    messages = [_call_message(json.dumps({"n": n, "pad": "x" * 100})) for n in range(50)]
    cache = CanonicalCache(max_bytes=2_000)
    for message in messages:
        assert cache.canonical(message) == canonical_message(message)
        assert cache.size <= 2_000
    assert 0 < len(cache) < 50
    assert cache.canonical(messages[-1]) == canonical_message(messages[-1])
    kept = len(cache)
    assert cache.canonical(messages[0]) == canonical_message(messages[0])  # dropped, made again
    assert len(cache) <= kept
