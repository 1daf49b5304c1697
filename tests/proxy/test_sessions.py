"""Tests of episode identity, the bounded store and τ²-bench-faithful error counting."""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from repairproxy.episodes.budget import (
    BudgetSnapshot,
    EpisodeState,
    ErrorBudget,
    episode_id_for,
)
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.validation import CallVerdict, Channel, CompiledTools, MessageVerdict


def verdict(*channels: Channel, call_ids: tuple[str | None, ...] | None = None) -> MessageVerdict:
    """A first-answer verdict with one call per channel (ids call_0, call_1, ... unless given)."""
    ids = call_ids if call_ids is not None else tuple(f"call_{i}" for i in range(len(channels)))
    return MessageVerdict(
        tuple(
            CallVerdict(index, ids[index], f"tool_{index}", channel, "")
            for index, channel in enumerate(channels)
        )
    )


def invalid(first: MessageVerdict) -> tuple[CallVerdict, ...]:
    """The invalid calls of an answer delivered as it came (repair off)."""
    return tuple(call for call in first.calls if call.channel is not Channel.VALID)


# --- episode identity ----------------------------------------------------------------------------

OPENING = {
    "model": "qwen",
    "messages": [
        {"role": "system", "content": "policy"},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "I want to return an item."},
    ],
}


def test_header_wins_and_is_case_insensitive() -> None:
    assert episode_id_for({"x-episode-id": "ep-1"}, OPENING) == "ep-1"
    assert episode_id_for({"X-Episode-ID": "ep-2"}, OPENING) == "ep-2"
    assert episode_id_for({"x-run": "r"}, OPENING, header_name="X-Run") == "r"


def test_long_header_is_hashed_to_a_bounded_id() -> None:
    long_id = episode_id_for({"x-episode-id": "e" * 5000}, OPENING)
    assert len(long_id) < 64
    assert long_id == episode_id_for({"x-episode-id": "e" * 5000}, {})


def test_fingerprint_is_stable_across_turns_and_distinguishes_openings() -> None:
    first = episode_id_for({}, OPENING)
    later = dict(OPENING, messages=[*OPENING["messages"], {"role": "assistant", "content": "ok"}])
    assert episode_id_for({}, later) == first
    other_user = json.loads(json.dumps(OPENING))
    other_user["messages"][2]["content"] = "Cancel my order."
    other_model = dict(OPENING, model="llama")
    other_system = json.loads(json.dumps(OPENING))
    other_system["messages"][0]["content"] = "another policy"
    ids = {episode_id_for({}, body) for body in (OPENING, other_user, other_model, other_system)}
    assert len(ids) == 4
    assert episode_id_for({"x-episode-id": ""}, OPENING) == first


# --- the store -----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.anyio
async def test_store_is_a_bounded_lru() -> None:
    store = MemoryEpisodeStore(max_episodes=3)
    for name in "abc":
        await store.update(name, lambda state: state.count("x"))
    await store.update("a", lambda state: None)  # touch: b is now least recently used
    await store.update("d", lambda state: None)
    assert len(store) == 3
    evicted = await store.get("b")  # its tombstone: the count it had, never a fresh budget
    assert evicted is not None and evicted.errors == 1 and not evicted.seen
    state = await store.get("a")
    assert state is not None and state.errors == 1


@pytest.mark.anyio
async def test_store_drops_idle_episodes() -> None:
    clock = FakeClock()
    store = MemoryEpisodeStore(max_episodes=10, idle_ttl_seconds=60, clock=clock)
    await store.update("old", lambda state: state.count("x"))
    clock.now += 30
    await store.update("young", lambda state: state.count("x"))
    clock.now += 31
    assert await store.get("old") is None
    assert await store.get("young") is not None
    assert len(store) == 1
    clock.now += 60
    await store.update("new", lambda state: None)
    assert len(store) == 1


@pytest.mark.anyio
async def test_store_stays_bounded_under_many_episodes() -> None:
    store = MemoryEpisodeStore(max_episodes=1000)
    budget = ErrorBudget(store)
    for index in range(5000):
        await budget.observe_answer(f"ep-{index}", verdict(Channel.UNKNOWN_TOOL))
    assert len(store) == 1000
    assert await store.get("ep-2999") is None  # beyond the tombstones kept (as many as episodes)
    tomb = await store.get("ep-3999")
    assert tomb is not None and tomb.errors == 1
    assert (await budget.snapshot("ep-4999")).errors == 1


def test_store_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError):
        MemoryEpisodeStore(max_episodes=0)


# --- budget snapshots ----------------------------------------------------------------------------


def test_snapshot_arithmetic() -> None:
    assert BudgetSnapshot("e", 3, 10, {}).errors_before == 3
    assert BudgetSnapshot("e", 3, 10, {}, errors_before=1).errors_before == 1
    assert BudgetSnapshot("e", 3, 10, {}).remaining == 7
    assert not BudgetSnapshot("e", 9, 10, {}).exhausted
    assert BudgetSnapshot("e", 10, 10, {}).exhausted
    assert BudgetSnapshot("e", 12, 10, {}).remaining == 0


@pytest.mark.parametrize(
    ("content", "label"),
    [
        ("Error: Tool 'get_order_status' not found.", "env_unknown_tool"),
        (
            "Error: RetailTools.get_user_details() got an unexpected keyword argument 'email'",
            "env_argument_error",
        ),
        (
            "Error: get_order_details() missing 1 required positional argument: 'order_id'",
            "env_argument_error",
        ),
        ("Error: Order not found", "env_entity_not_found"),
        ("Error: User not found", "env_entity_not_found"),
        ("Error: Non-pending order cannot be cancelled", "env_other_error"),
    ],
)
def test_default_classification(content: str, label: str) -> None:
    assert ErrorBudget(MemoryEpisodeStore()).classify(content) == label


def test_classification_table_is_configurable() -> None:
    budget = ErrorBudget(
        MemoryEpisodeStore(), classifier=[("env_payment", r"payment"), ("env_any", r".")]
    )
    assert budget.classify("Error: payment declined") == "env_payment"
    assert budget.classify("Error: whatever") == "env_any"


@pytest.mark.anyio
async def test_error_pattern_is_configurable() -> None:
    budget = ErrorBudget(MemoryEpisodeStore(), tool_error_pattern=r'"status":\s*"failed"')
    body = {
        "messages": [
            {"role": "tool", "tool_call_id": "a", "content": "Error: ignored by this pattern"},
            {"role": "tool", "tool_call_id": "b", "content": '{"status": "failed", "why": "x"}'},
        ]
    }
    snapshot = await budget.observe_request("e", body)
    assert snapshot.errors == 1
    assert snapshot.by_channel == {"env_other_error": 1}


@pytest.mark.anyio
async def test_each_tool_result_counts_once() -> None:
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=3)
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    history.append({"role": "tool", "tool_call_id": "c1", "content": "Error: Order not found"})
    assert (await budget.observe_request("e", {"messages": history})).errors == 1
    assert (await budget.observe_request("e", {"messages": history})).errors == 1
    # An upstream that reuses ids: a new error under the same id is still a new error.
    history.append({"role": "tool", "tool_call_id": "c1", "content": "Error: User not found"})
    snapshot = await budget.observe_request("e", {"messages": history}, budget=5)
    assert snapshot.errors == 2 and snapshot.budget == 5 and snapshot.remaining == 3
    # Results without ids are told apart by their position in the growing history.
    history.append({"role": "function", "name": "f", "content": "Error: Order not found"})
    history.append({"role": "function", "name": "f", "content": "Error: Order not found"})
    snapshot = await budget.observe_request("e", {"messages": history})
    assert snapshot.errors == 4 and snapshot.exhausted and snapshot.remaining == 0


@pytest.mark.anyio
async def test_non_error_and_content_parts() -> None:
    budget = ErrorBudget(MemoryEpisodeStore())
    body = {
        "messages": [
            {"role": "tool", "tool_call_id": "a", "content": '{"order_id": "#W1"}'},
            {"role": "tool", "tool_call_id": "b", "content": "The word Error: mid-text"},
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "text", "text": "Error: x"}],
            },
            {"role": "user", "content": "Error: users are not tools"},
        ]
    }
    snapshot = await budget.observe_request("e", body)
    assert snapshot.by_channel == {"env_other_error": 1}


@pytest.mark.anyio
async def test_observe_answer_charges_what_tau2_bench_would() -> None:
    """unknown_tool and schema_violation cost one each (the environment would fail them); the
    silent failures are reported apart and never charged."""
    budget = ErrorBudget(MemoryEpisodeStore())
    first = verdict(
        Channel.UNKNOWN_TOOL, Channel.VALID, Channel.SCHEMA_VIOLATION, Channel.UNKNOWN_TOOL
    )
    snapshot = await budget.observe_answer("e", first)
    assert (snapshot.errors_before, snapshot.errors) == (0, 3)
    assert snapshot.by_channel == {"unknown_tool": 2, "schema_violation": 1}
    for silent in (Channel.TOOL_CALL_IN_CONTENT, Channel.INVALID_JSON, Channel.EMPTY_OUTPUT):
        snapshot = await budget.observe_answer("e", verdict(silent))
        assert snapshot.errors == snapshot.errors_before == 3
        assert snapshot.new_silent == (silent,)
    assert snapshot.silent_by_channel == {
        "tool_call_in_content": 1,
        "invalid_json": 1,
        "empty_output": 1,
    }
    mixed = await budget.observe_answer(
        "e", verdict(Channel.INVALID_JSON, Channel.SCHEMA_VIOLATION)
    )
    assert mixed.errors == 4 and mixed.silent_by_channel["invalid_json"] == 2


@pytest.mark.anyio
async def test_a_delivered_invalid_call_is_not_counted_twice() -> None:
    budget = ErrorBudget(MemoryEpisodeStore())
    # Repair off: the proxy counts the hallucinated call and lets it through ...
    first = verdict(Channel.UNKNOWN_TOOL, Channel.VALID, call_ids=("h1", None))
    await budget.observe_answer("e", first, None, invalid(first))
    # ... the agent executes it, and its error comes back in every later request.
    history = [{"role": "tool", "tool_call_id": "h1", "content": "Error: Tool 'x' not found."}]
    for _ in range(3):
        snapshot = await budget.observe_request("e", {"messages": history})
        assert snapshot.errors == 1
    assert snapshot.by_channel == {"unknown_tool": 1}
    # A later, different error under the same (reused) id is counted.
    history.append({"role": "tool", "tool_call_id": "h1", "content": "Error: Order not found"})
    assert (await budget.observe_request("e", {"messages": history})).errors == 2


@pytest.mark.anyio
async def test_two_interleaved_episodes_keep_separate_budgets() -> None:
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=2)
    a_history: list[dict[str, Any]] = []
    b_history: list[dict[str, Any]] = []
    for turn in range(3):
        a_history.append(
            {"role": "tool", "tool_call_id": f"a{turn}", "content": "Error: Order not found"}
        )
        b_history.append({"role": "tool", "tool_call_id": f"b{turn}", "content": "{}"})
        a = await budget.observe_request("A", {"messages": a_history})
        b = await budget.observe_request("B", {"messages": b_history})
        assert a.errors == turn + 1 and a.episode_id == "A"
        assert b.errors == 0 and not b.exhausted
    b = await budget.observe_answer("B", verdict(Channel.SCHEMA_VIOLATION))
    assert a.exhausted and a.remaining == 0
    assert b.errors == 1 and b.remaining == 1
    assert (await budget.snapshot("A")).errors == 3


# --- a 12-turn τ²-bench-style replay -------------------------------------------------------------

DECLARED = {
    "get_user_details": {"user_id"},
    "get_order_details": {"order_id"},
    "cancel_pending_order": {"order_id", "reason"},
}
ORDERS = {"#W1": "pending", "#W2": "delivered"}


@dataclass
class TauStyleEnvironment:
    """Answers tool calls the way τ²-bench's environment does: f"Error: {exception}" on failure,
    and counts errors the way its orchestrator does (one per tool message with error=True)."""

    num_errors: int = 0
    trajectory: list[dict[str, Any]] = field(default_factory=list)

    def respond(self, call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        error = True
        if name not in DECLARED:
            content = f"Error: Tool '{name}' not found."
        elif extra := set(arguments) - DECLARED[name]:
            content = (
                f"Error: RetailTools.{name}() got an unexpected keyword argument '{extra.pop()}'"
            )
        elif missing := DECLARED[name] - set(arguments):
            content = (
                f"Error: RetailTools.{name}() missing 1 required positional argument: "
                f"'{missing.pop()}'"
            )
        elif "order_id" in arguments and arguments["order_id"] not in ORDERS:
            content = "Error: Order not found"
        elif name == "cancel_pending_order" and ORDERS[arguments["order_id"]] != "pending":
            content = "Error: Non-pending order cannot be cancelled"
        else:
            content, error = json.dumps({"ok": name}), False
        self.num_errors += error
        return {"role": "tool", "tool_call_id": call_id, "content": content}


# Agent tool calls per turn (name, arguments); an empty turn is a text reply to the user.
SCRIPT: list[list[tuple[str, dict[str, Any]]]] = [
    [("get_user_details", {"user_id": "u1"})],
    [("get_order_status", {"order_id": "#W1"})],  # hallucinated name
    [("get_order_details", {"order_id": "#W9"})],  # entity not found
    [],
    [
        ("get_order_details", {"order_id": "#W1", "verbose": True}),  # unexpected argument
        ("get_order_details", {"order_id": "#W2"}),
    ],
    [("cancel_pending_order", {"order_id": "#W2", "reason": "no longer needed"})],  # other
    [("cancel_pending_order", {"order_id": "#W1"})],  # missing argument
    [],
    [("lookup_user", {"user_id": "u1"}), ("get_order_status", {"order_id": "#W2"})],  # 2 unknown
    [("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})],
    [("get_order_details", {"order_id": "#W3"})],  # entity not found
    [],
]


@pytest.mark.anyio
@pytest.mark.parametrize("proxy_counts_answers", [False, True], ids=["results-only", "answers-too"])
async def test_twelve_turn_replay_matches_tau2_bench(proxy_counts_answers: bool) -> None:
    """Whether or not the proxy also counted the invalid calls it let through (repair off), the
    episode ends with exactly the count τ²-bench's orchestrator reaches on the same trajectory."""
    assert len(SCRIPT) == 12
    env = TauStyleEnvironment()
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "help"},
    ]
    ids = itertools.count()
    snapshot = None
    for calls in SCRIPT:
        # The agent resends the whole history on every turn.
        snapshot = await budget.observe_request("ep", {"messages": history})
        if not calls:
            history.append({"role": "assistant", "content": "Anything else?"})
            history.append({"role": "user", "content": "yes"})
            continue
        tool_calls: list[dict[str, Any]] = [
            {
                "id": f"call_{next(ids)}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for name, arguments in calls
        ]
        if proxy_counts_answers:
            hallucinated = [c for c in tool_calls if c["function"]["name"] not in DECLARED]
            first = verdict(
                *[Channel.UNKNOWN_TOOL] * len(hallucinated),
                call_ids=tuple(c["id"] for c in hallucinated),
            )
            await budget.observe_answer("ep", first, None, invalid(first))
        history.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        for tool_call, (name, arguments) in zip(tool_calls, calls, strict=True):
            history.append(env.respond(tool_call["id"], name, arguments))
    snapshot = await budget.observe_request("ep", {"messages": history})
    assert snapshot is not None
    assert env.num_errors == sum(
        1 for m in history if m["role"] == "tool" and m["content"].startswith("Error")
    )
    assert snapshot.errors == env.num_errors
    assert snapshot.exhausted == (env.num_errors >= 10)
    unknown = snapshot.by_channel.get(
        "unknown_tool" if proxy_counts_answers else "env_unknown_tool"
    )
    assert unknown == 3
    assert snapshot.by_channel["env_argument_error"] == 2
    assert snapshot.by_channel["env_entity_not_found"] == 2
    assert snapshot.by_channel["env_other_error"] == 1


@pytest.mark.anyio
async def test_concurrent_updates_of_one_episode_are_not_lost() -> None:
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=1000)

    async def answer(index: int) -> None:
        await anyio.sleep(0)
        await budget.observe_answer("shared", verdict(Channel.UNKNOWN_TOOL))
        body = {"messages": [{"role": "tool", "tool_call_id": f"t{index}", "content": "Error: x"}]}
        await budget.observe_request("shared", body)

    async with anyio.create_task_group() as group:
        for index in range(200):
            group.start_soon(answer, index)
    snapshot = await budget.snapshot("shared")
    assert snapshot.by_channel == {"unknown_tool": 200, "env_other_error": 200}


# --- ids as upstreams and agents really send them ------------------------------------------------


def _results(call_ids: list[str | None], content: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for call_id in call_ids:
        message: dict[str, Any] = {"role": "tool", "content": content}
        if call_id is not None:
            message["tool_call_id"] = call_id
        results.append(message)
    return results


@pytest.mark.anyio
@pytest.mark.parametrize("answers_charged", [False, True], ids=["results-only", "answers-too"])
async def test_reused_ids_count_every_error(answers_charged: bool) -> None:
    """An upstream that names every call "0": three failed calls in one answer are three errors,
    and the next answer's failed "0" is a fourth, whether or not the proxy charged the answers."""
    budget = ErrorBudget(MemoryEpisodeStore())
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for calls in (3, 1):
        await budget.observe_request("e", {"messages": history})
        if answers_charged:
            first = verdict(*[Channel.UNKNOWN_TOOL] * calls, call_ids=("0",) * calls)
            await budget.observe_answer("e", first, None, invalid(first))
        history.append({"role": "assistant", "content": None, "tool_calls": []})
        history.extend(_results(["0"] * calls, "Error: Tool 'x' not found."))
    snapshot = await budget.observe_request("e", {"messages": history})
    assert snapshot.errors == 4
    label = "unknown_tool" if answers_charged else "env_unknown_tool"
    assert snapshot.by_channel == {label: 4}
    assert (await budget.observe_request("e", {"messages": history})).new_env_errors == ()


@pytest.mark.anyio
async def test_a_shared_id_absorbs_the_delivered_calls_result_not_its_neighbours() -> None:
    """[valid "0", unknown "0"]: the first result is the valid call's own failure (counted), the
    second is the unknown call's (already charged)."""
    budget = ErrorBudget(MemoryEpisodeStore())
    first = verdict(Channel.VALID, Channel.UNKNOWN_TOOL, call_ids=("0", "0"))
    await budget.observe_answer("e", first, None, invalid(first))
    history = [
        *_results(["0"], "Error: Order not found"),
        *_results(["0"], "Error: Tool 'x' not found."),
    ]
    snapshot = await budget.observe_request("e", {"messages": history})
    assert snapshot.by_channel == {"unknown_tool": 1, "env_entity_not_found": 1}
    assert snapshot.new_env_errors == ("env_entity_not_found",)


@pytest.mark.anyio
async def test_delivered_calls_without_ids_count_once() -> None:
    budget = ErrorBudget(MemoryEpisodeStore())
    # A tool call without an id, answered by a tool message without one.
    first = verdict(Channel.UNKNOWN_TOOL, call_ids=(None,))
    await budget.observe_answer("e", first, None, invalid(first))
    history: list[dict[str, Any]] = _results([None], "Error: Tool 'x' not found.")
    assert (await budget.observe_request("e", {"messages": history})).errors == 1
    # A legacy function_call, answered by a role: function message.
    first = verdict(Channel.SCHEMA_VIOLATION, call_ids=(None,))
    await budget.observe_answer("e", first, None, invalid(first))
    history.append({"role": "function", "name": "f", "content": "Error: missing 1 required x"})
    for _ in range(2):
        snapshot = await budget.observe_request("e", {"messages": history})
        assert snapshot.errors == 2
    assert snapshot.by_channel == {"unknown_tool": 1, "schema_violation": 1}
    # A later failure in the same bucket is new.
    history.append({"role": "function", "name": "f", "content": "Error: Order not found"})
    assert (await budget.observe_request("e", {"messages": history})).errors == 3


@pytest.mark.anyio
async def test_a_charged_call_that_succeeds_leaves_nothing_pending() -> None:
    """A schema violation the environment accepted: its success clears the expectation, so the
    next failure under the reused id still counts."""
    budget = ErrorBudget(MemoryEpisodeStore())
    first = verdict(Channel.SCHEMA_VIOLATION, call_ids=("0",))
    await budget.observe_answer("e", first, None, invalid(first))
    history = _results(["0"], '{"ok": true}')
    assert (await budget.observe_request("e", {"messages": history})).errors == 1
    history += _results(["0"], "Error: Order not found")
    assert (await budget.observe_request("e", {"messages": history})).errors == 2


@pytest.mark.anyio
async def test_an_answer_costs_the_larger_of_its_first_and_delivered_versions() -> None:
    """Repairs exhausted, ``pass``: the first answer had 1 charged call, the delivered one 2;
    both delivered calls fail in the environment; the episode pays 2, not 1 and not 3."""
    budget = ErrorBudget(MemoryEpisodeStore())
    first = verdict(Channel.UNKNOWN_TOOL, call_ids=("a",))
    delivered = verdict(Channel.UNKNOWN_TOOL, Channel.UNKNOWN_TOOL, call_ids=("b", "c"))
    await budget.observe_answer("e", first, None, invalid(delivered))
    history = _results(["b", "c"], "Error: Tool 'x' not found.")
    snapshot = await budget.observe_request("e", {"messages": history})
    assert snapshot.errors == 2


# --- memory bounded by configuration, not by clients ---------------------------------------------


@pytest.mark.anyio
async def test_megabyte_ids_and_texts_are_not_kept_whole() -> None:
    store = MemoryEpisodeStore()
    budget = ErrorBudget(store)
    huge_id = "i" * 1_000_000
    huge_error = "Error: " + "e" * 1_000_000
    ref = await budget.resolve_episode({"x-episode-id": "e" * 1_000_000}, {})
    assert ref.explicit and len(ref.id) < 64
    first = verdict(Channel.UNKNOWN_TOOL, call_ids=(huge_id,))
    await budget.observe_answer(ref.id, first, None, invalid(first))
    history: list[dict[str, Any]] = []
    for turn in range(5):
        history += _results([huge_id + str(turn), huge_id], huge_error + str(turn))
        snapshot = await budget.observe_request(ref.id, {"messages": history})
    assert snapshot.errors == 10
    state = await store.get(ref.id)
    assert state is not None
    kept = [*state.seen, *state.pending, *state.result_counts, *state.by_channel]
    assert max(map(len, kept)) <= 100
    assert sum(map(len, kept)) < 20_000
    assert all(len(text) <= 512 for text in budget.classify._labels)


@pytest.mark.anyio
async def test_per_episode_memory_stays_bounded_in_a_long_episode() -> None:
    store = MemoryEpisodeStore()
    budget = ErrorBudget(store, default_budget=10_000)
    history: list[dict[str, Any]] = []
    for turn in range(40):
        history += _results([f"call_{turn}_{i}" for i in range(100)], "Error: x")
        first = verdict(
            *[Channel.UNKNOWN_TOOL] * 50, call_ids=tuple(f"n{turn}_{i}" for i in range(50))
        )
        await budget.observe_answer("e", first, None, invalid(first))
    await budget.observe_request("e", {"messages": history})
    state = await store.get("e")
    assert state is not None
    assert len(state.seen) <= 1024 and len(state.pending) <= 256
    assert len(state.result_counts) <= 512


# --- identity ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_resolve_episode_with_the_header() -> None:
    budget = ErrorBudget(MemoryEpisodeStore(), episode_header="X-Run")
    ref = await budget.resolve_episode({"x-run": " r-1 "}, OPENING)
    assert (ref.id, ref.explicit, ref.new, ref.warn_missing_header) == ("r-1", True, True, False)
    await budget.observe_request(ref.id, OPENING)
    again = await budget.resolve_episode({"X-Run": "r-1"}, OPENING)
    assert (again.id, again.explicit, again.new) == ("r-1", True, False)


@pytest.mark.anyio
async def test_a_chained_first_turn_with_nothing_to_count_takes_no_store_slot() -> None:
    store = MemoryEpisodeStore()
    budget = ErrorBudget(store, default_budget=4)
    ref = await budget.resolve_episode({}, OPENING)
    snapshot = await budget.observe_request(ref, OPENING)
    assert (ref.new, ref.explicit, len(store)) == (True, False, 0)
    assert (snapshot.episode_id, snapshot.errors, snapshot.remaining) == (ref.id, 0, 4)
    # A first turn whose history already holds a failed result is counted, and so stored.
    failed = {
        "model": "qwen",
        "messages": [
            *OPENING["messages"],
            {"role": "assistant", "tool_calls": [_call("c1", "get_order_details")]},
            {"role": "tool", "tool_call_id": "c1", "content": "Error: order not found"},
        ],
    }
    ref = await budget.resolve_episode({}, failed)
    snapshot = await budget.observe_request(ref, failed)
    assert ref.new and snapshot.errors == 1 and len(store) == 1
    # A header-named episode is stored at once: its next request is not new.
    named = await budget.resolve_episode({"x-episode-id": "ep-9"}, OPENING)
    await budget.observe_request(named, OPENING)
    assert len(store) == 2
    assert not (await budget.resolve_episode({"x-episode-id": "ep-9"}, OPENING)).new


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


@pytest.mark.anyio
async def test_the_missing_header_is_flagged_once() -> None:
    budget = ErrorBudget(MemoryEpisodeStore())
    flags = [(await budget.resolve_episode({}, OPENING)).warn_missing_header for _ in range(3)]
    assert flags == [True, False, False]
    refs = {(await budget.resolve_episode({}, OPENING)).id for _ in range(3)}
    assert len(refs) == 3  # no assistant answer of ours in the history: each is a new episode


# --- the same replay through the pipeline's calls, with real verdicts and every id style -------

SCHEMAS: dict[str, dict[str, Any]] = {
    name: {
        "type": "object",
        "properties": {argument: {"type": "string"} for argument in arguments},
        "required": sorted(arguments),
    }
    for name, arguments in DECLARED.items()
}
# (name, raw arguments) per call; an empty turn is a text reply.
RAW_SCRIPT: list[list[tuple[str, str]]] = [
    [("get_user_details", '{"user_id": "u1"}')],
    [("get_order_status", '{"order_id": "#W1"}')],  # unknown_tool: charged, result absorbed
    [("get_order_details", '{"order_id": "#W9"}')],  # env: entity not found
    [],
    [
        ("get_order_details", '{"order_id": "#W1", "verbose": true}'),  # schema_violation
        ("get_order_details", '{"order_id": "#W2"}'),
    ],
    [("cancel_pending_order", '{"order_id": "#W2", "reason": "gone"}')],  # env: other
    [("cancel_pending_order", '{"order_id": "#W1"}')],  # schema_violation (missing)
    [("get_order_details", '{"order_id": "#W1"')],  # invalid_json: silent; env error counted
    [("lookup_user", '{"user_id": "u1"}'), ("get_order_status", "{}")],  # 2 unknown_tool
    [("cancel_pending_order", '{"order_id": "#W1", "reason": "gone"}')],
    [("get_order_details", '{"order_id": "#W3"}')],  # env: entity not found
    [],
]


def _tau2_result(
    env: TauStyleEnvironment, call_id: str | None, name: str, raw: str
) -> dict[str, Any]:
    try:
        arguments = json.loads(raw)
    except ValueError:
        # τ²-bench's orchestrator: unparseable arguments are a failed call.
        env.num_errors += 1
        content = f"Error: Invalid arguments for tool '{name}': expected a JSON object, got {raw!r}"
        message: dict[str, Any] = {"role": "tool", "content": content}
    else:
        message = env.respond(call_id or "", name, arguments)
    if call_id is None:
        message.pop("tool_call_id", None)
    return message


@pytest.mark.anyio
@pytest.mark.parametrize("by_ref", [False, True])
@pytest.mark.parametrize("id_style", ["unique", "all-zero", "none"])
async def test_twelve_turn_replay_through_resolve_observe_remember(
    id_style: str, by_ref: bool
) -> None:
    """Repair off, no episode header: one episode by chaining, counted exactly as τ²-bench
    counts, whether the upstream gives unique ids, "0" for every call, or no ids at all; and
    whether the episode is observed by id or by its ``EpisodeRef`` as the pipeline does (the
    first turn, with nothing to count, is then not stored)."""
    tools = CompiledTools(list(SCHEMAS.items()), forbid_extra_arguments=True)
    env = TauStyleEnvironment()
    budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "policy"},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "help"},
    ]
    ids = itertools.count()
    episodes = set()
    for calls in RAW_SCRIPT:
        body = {"model": "m", "messages": list(history)}
        ref = await budget.resolve_episode({}, body)
        episodes.add(ref.id)
        await budget.observe_request(ref if by_ref else ref.id, body)
        answer: dict[str, Any] = {
            "role": "assistant",
            "content": "Anything else?" if not calls else None,
        }
        call_ids: list[str | None] = []
        if calls:
            answer["tool_calls"] = []
            for name, raw in calls:
                call_id = {"unique": f"call_{next(ids)}", "all-zero": "0", "none": None}[id_style]
                call: dict[str, Any] = {
                    "type": "function",
                    "function": {"name": name, "arguments": raw},
                }
                if call_id is not None:
                    call["id"] = call_id
                answer["tool_calls"].append(call)
                call_ids.append(call_id)
        first = tools.check_message(answer)
        await budget.observe_answer(ref if by_ref else ref.id, first, None, invalid(first))
        await budget.remember_answer(ref, body, answer)
        history.append(answer)
        if not calls:
            history.append({"role": "user", "content": "yes"})
        for call_id, (name, raw) in zip(call_ids, calls, strict=True):
            history.append(_tau2_result(env, call_id, name, raw))
    # The same model: chaining never joins requests to different models.
    ref = await budget.resolve_episode({}, {"model": "m", "messages": history})
    snapshot = await budget.observe_request(ref.id, {"messages": history})
    assert episodes == {ref.id} and not ref.new
    assert env.num_errors == 9
    assert snapshot.errors == env.num_errors
    assert snapshot.by_channel == {
        "unknown_tool": 3,
        "schema_violation": 2,
        "env_entity_not_found": 2,
        "env_other_error": 1,
        "env_argument_error": 1,
    }
    assert snapshot.silent_by_channel == {"invalid_json": 1}


@pytest.mark.anyio
async def test_episode_state_is_plain_data_a_shared_store_can_serialise() -> None:
    store = MemoryEpisodeStore()
    budget = ErrorBudget(store)
    first = verdict(Channel.UNKNOWN_TOOL, Channel.INVALID_JSON, call_ids=("0", "1"))
    await budget.observe_answer("e", first, None, invalid(first))
    await budget.observe_request("e", {"messages": _results(["x"], "Error: Order not found")})
    state = await store.get("e")
    assert state is not None
    restored = EpisodeState(**json.loads(json.dumps(dataclasses.asdict(state))))
    assert restored == state and restored.errors == 2


# --- memory bound, tenant quotas, tombstones -----------------------------------------------------


@pytest.mark.anyio
async def test_the_store_is_bounded_in_bytes_and_counts_its_evictions() -> None:
    reasons: list[str] = []
    store = MemoryEpisodeStore(max_bytes=20_000, on_evict=reasons.append)
    for index in range(200):
        await store.update(f"ep-{index}", lambda state: state.first_sight("k"))
    assert store.bytes_used <= 20_000
    assert 0 < len(store) < 200
    assert store.evictions == 200 - len(store) == len(reasons)
    assert set(reasons) == {"memory"}


@pytest.mark.anyio
async def test_one_tenants_churn_evicts_only_its_own_episodes() -> None:
    store = MemoryEpisodeStore(max_bytes=60_000, tenant_quota=30_000)
    await store.update("t-a/keep", lambda state: state.count("unknown_tool"))
    for index in range(500):  # tenant b churns through many episodes
        await store.update(f"t-b/ep-{index}", lambda state: None)
    kept = await store.get("t-a/keep")
    assert kept is not None and kept.errors == 1 and kept.seen == {}
    assert "t-a/keep" in store._tenants["t-a"]  # still held, not a tombstone
    assert store._tenant_bytes["t-b"] <= 30_000


@pytest.mark.anyio
async def test_an_evicted_spent_explicit_episode_stays_spent() -> None:
    store = MemoryEpisodeStore(max_episodes=2)
    budget = ErrorBudget(store, default_budget=1)
    spent = await budget.observe_answer("spent", verdict(Channel.UNKNOWN_TOOL))
    assert spent.exhausted
    for name in ("other-1", "other-2", "other-3"):
        await budget.observe_answer(name, verdict())
    assert "spent" not in store._tenants.get("", {})
    ref = await budget.resolve_episode({"x-episode-id": "spent"}, {"messages": []})
    assert not ref.new
    again = await budget.observe_request(ref, {"messages": []})
    assert again.exhausted and again.errors == 1
