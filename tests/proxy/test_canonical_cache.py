"""CanonicalCache on long histories: a resent history costs its new turns, not a recount."""

from __future__ import annotations

import json
from typing import Any

import pytest

from repairproxy.episodes import chaining
from repairproxy.episodes.chaining import CanonicalCache, canonical_message, conversation_keys


def _history(turns: int, start: int = 0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where is my order?"}]
    for turn in range(start, start + turns):
        call_id = f"call_{turn:08d}"
        arguments = json.dumps({"order_id": f"#W{turn}"})
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "f", "arguments": arguments},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": '{"ok": true}'})
    return messages[1:] if start else messages


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many call messages' forms ``canonical_message`` computed (cache misses)."""
    count = [0]

    def counting(message: Any, *, with_call_ids: bool = True) -> bytes:
        if message.get("tool_calls"):
            count[0] += 1
        return canonical_message(message, with_call_ids=with_call_ids)

    monkeypatch.setattr(chaining, "canonical_message", counting)
    return count


def _turn(history: list[dict[str, Any]], cache: CanonicalCache) -> None:
    # A request whose chain lookup missed: the pass with call ids, then the one without.
    cached = conversation_keys(history, scope=b"s", cache=cache)
    cached.plain_resume()


def test_a_resent_history_within_the_bound_costs_only_its_new_turn(computed: list[int]) -> None:
    # Both passes' forms of 2,000 call turns fit in 1 MiB: one entry a turn, the form without
    # ids a prefix of the one with. (Held apart, each under its own key, they outgrew the bound
    # and every resend recomputed all 4,000 forms.)
    cache = CanonicalCache(max_bytes=1 << 20)
    history = _history(2_000)
    _turn(history, cache)
    assert computed[0] == 4_000
    computed[0] = 0
    resent = [*json.loads(json.dumps(history)), *_history(1, start=2_000)]
    _turn(resent, cache)
    assert computed[0] == 2  # the new call turn, with ids and without
    assert len(cache) == 2_001
    assert cache.size <= cache.max_bytes
    plain = conversation_keys(resent, scope=b"s")
    cached = conversation_keys(resent, scope=b"s", cache=cache)
    assert cached == plain
    assert cached.plain_resume() == plain.plain_resume()


def test_a_history_past_the_bound_keeps_hitting_the_turns_that_fit(computed: list[int]) -> None:
    # A scan never evicts what it has read: the turns that fit stay, the others are computed
    # afresh (least recently used eviction, or first-in first-out, hit none of them).
    cache = CanonicalCache(max_bytes=64 << 10)
    history = _history(1_000)
    conversation_keys(history, scope=b"s", cache=cache)
    held = len(cache)
    assert 0 < held < 1_000
    for _ in range(3):
        computed[0] = 0
        conversation_keys(json.loads(json.dumps(history)), scope=b"s", cache=cache)
        assert computed[0] == 1_000 - held
        assert len(cache) == held
        assert cache.size <= cache.max_bytes


def test_the_next_conversation_evicts_the_turns_the_last_scan_left() -> None:
    cache = CanonicalCache(max_bytes=64 << 10)
    conversation_keys(_history(1_000), scope=b"s", cache=cache)
    other = _history(1_000, start=5_000)
    conversation_keys(other, scope=b"s", cache=cache)
    # None of the first conversation's turns was read by this scan: its own replaced them.
    keys = [chaining._cache_key(message) for message in other if message.get("tool_calls")]
    assert 0 < len(cache) < 1_000
    assert list(cache._forms) == keys[: len(cache)]
    assert cache.size <= cache.max_bytes


@pytest.mark.parametrize(
    "message",
    [
        # Two calls: the form without ids is not a prefix of the one with, and is held apart.
        {
            "role": "assistant",
            "content": "Both.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "[1]"}},
            ],
        },
        # Null arguments: never cached (their form is the empty string's as JSON, ``""``).
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
        {
            "role": "assistant",
            "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": ""}}],
        },
        # A NUL would make the joined key ambiguous: never cached either.
        {"role": "assistant", "tool_calls": [{"id": "a\x00", "function": {"arguments": "{}"}}]},
    ],
)
def test_both_forms_come_back_as_computed(message: dict[str, Any]) -> None:
    cache = CanonicalCache()
    for _ in range(2):
        for ids in (True, False, True):
            assert cache.canonical(message, with_call_ids=ids) == canonical_message(
                message, with_call_ids=ids
            )


def test_null_and_empty_arguments_never_share_an_entry() -> None:
    call = {"id": "a", "function": {"name": "f"}}
    empty = {
        "role": "assistant",
        "tool_calls": [{**call, "function": {"name": "f", "arguments": ""}}],
    }
    null = {"role": "assistant", "tool_calls": [call]}
    assert canonical_message(empty) != canonical_message(null)
    cache = CanonicalCache()
    assert cache.canonical(empty) == canonical_message(empty)
    assert cache.canonical(null) == canonical_message(null)
    assert chaining._cache_key({"role": "assistant", "tool_calls": [{"id": "a\x00"}]}) is None
