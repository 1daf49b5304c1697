"""The system turn's KV state kept on disk: computed once, loaded by a later engine, same answer.

Needs the embedded model; a short system turn (a low threshold instead of a long policy) keeps the
prefills cheap.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repairproxy.local import ARMS, resolve_cache_dir
from repairproxy.local.engine import Engine, EngineConfig, SamplingParams
from repairproxy.local.prompt import render_prompt
from tests.local.model_fixtures import requires_model
from tests.local.retail_tools import RETAIL_SYSTEM

pytestmark = [pytest.mark.model, requires_model]

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, seed=0)


def _engine(cache: Path) -> Engine:
    model = resolve_cache_dir() / "models" / ARMS["q4_k_m"].filename
    config = EngineConfig(
        model, n_ctx=1024, n_threads=2, prompt_cache_dir=cache, prompt_cache_min_tokens=16
    )
    return Engine(config)


def _prompt(user: str, extra: str = "") -> str:
    system = RETAIL_SYSTEM + extra
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return render_prompt(messages)


def test_the_system_turn_is_computed_once_then_loaded_by_a_new_engine(tmp_path: Path) -> None:
    first = _engine(tmp_path)
    try:
        cold = first.generate(_prompt("Hi, I need to cancel an order."), GREEDY)
        again = first.generate(_prompt("Where is my package?"), GREEDY)
    finally:
        first.llm.close()
    assert cold.prefix_source == "computed" and cold.cached_tokens == 0
    assert again.prefix_source == "ram" and again.cached_tokens > 16
    [saved] = list(tmp_path.rglob("*.kvstate"))

    second = _engine(tmp_path)  # a later process: empty KV, the file on disk
    try:
        warm = second.generate(_prompt("Hi, I need to cancel an order."), GREEDY)
    finally:
        second.llm.close()
    assert warm.prefix_source == "disk"
    assert 16 < warm.cached_tokens <= again.cached_tokens  # the system turn, not prefilled
    assert warm.text == cold.text  # the loaded state is what this engine would have computed

    saved.write_bytes(b"not a llama.cpp state")
    third = _engine(tmp_path)
    try:
        recovered = third.generate(_prompt("Hi, I need to cancel an order."), GREEDY)
    finally:
        third.llm.close()
    assert recovered.prefix_source == "computed" and recovered.text == cold.text
    assert saved.stat().st_size > 1000  # written again

    # A system turn that only differs at its end (e.g. the proxy appended its repair instruction)
    # loads the common start from disk and evaluates the rest.
    fourth = _engine(tmp_path)
    try:
        longer = fourth.generate(_prompt("Hi.", extra="\n\nAlways answer briefly."), GREEDY)
    finally:
        fourth.llm.close()
    assert longer.prefix_source == "disk+computed"
    assert 16 < longer.cached_tokens < warm.cached_tokens + 10
    assert len(list(tmp_path.rglob("*.kvstate"))) == 2


def test_short_system_turns_and_disabled_caches_are_not_saved(tmp_path: Path) -> None:
    model = resolve_cache_dir() / "models" / ARMS["q4_k_m"].filename
    engine = Engine(EngineConfig(model, n_ctx=1024, n_threads=2, prompt_cache_dir=tmp_path))
    try:  # the default threshold (512 tokens) is above this system turn
        result = engine.generate(_prompt("Hello"), SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        engine.llm.close()
    assert result.prefix_source == "none"
    assert list(tmp_path.rglob("*.kvstate")) == []


def test_a_state_that_shares_only_the_turn_opening_or_does_not_fit_is_left_alone(
    tmp_path: Path,
) -> None:
    """Another system turn shares only ``<|im_start|>system``: nothing is loaded, nothing removed.

    Before, any shared token made a state the best match: a short test prompt loaded the demo's
    140 MB policy state to reuse 3 tokens, and an engine with a smaller context than that state
    failed to load it and deleted it as if it were corrupt (the next demo prefilled for minutes).
    """
    model = resolve_cache_dir() / "models" / ARMS["q4_k_m"].filename
    long_policy = " ".join([RETAIL_SYSTEM] * 6)  # ~300 tokens: longer than the small context
    first = _engine(tmp_path)
    try:
        first.generate(_prompt("Hi, I need to cancel an order.", extra=long_policy), GREEDY)
    finally:
        first.llm.close()
    [saved] = list(tmp_path.rglob("*.kvstate"))
    topics = {1024: "the weather", 256: "train times"}  # each context its own system turn

    for n_ctx in (1024, 256):  # a context the saved state fits, and one it does not
        other = f"You answer questions about {topics[n_ctx]} in one short sentence, and no more."
        messages = [{"role": "system", "content": other}, {"role": "user", "content": "Today?"}]
        config = EngineConfig(
            model, n_ctx=n_ctx, n_threads=2, prompt_cache_dir=tmp_path, prompt_cache_min_tokens=16
        )
        engine = Engine(config)
        try:
            result = engine.generate(render_prompt(messages), GREEDY)
        finally:
            engine.llm.close()
        assert result.prefix_source == "computed" and result.cached_tokens == 0, n_ctx
        assert saved.is_file() and saved.with_suffix(".tokens").is_file(), n_ctx
