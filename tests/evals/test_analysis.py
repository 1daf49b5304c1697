"""evals.analysis.summary on results files shaped like τ²-bench v1.0.1's, numbers worked out by
hand."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evals.analysis.stats import Interval, NotAvailable, RateRatio
from evals.analysis.summary import (
    Arm,
    Episode,
    amplification,
    build_summary,
    classify_error,
    default_pairs,
    load_arm,
    read_episodes,
    success_at,
    summarize_arm,
    summarize_pair,
    summarize_pairs,
)
from tests.evals.fixtures_tau2 import Call, Turn, episode, not_found, results, write
from tests.evals.fixtures_tau2.scenario import MISSING_REASON, build


@pytest.mark.parametrize(
    ("content", "channel", "name"),
    [
        (not_found("lookup_order"), "hallucinated_name", "lookup_order"),
        ("Error: Tool 'a'b' not found.", "hallucinated_name", "a'b"),
        (MISSING_REASON, "argument", None),
        ("Error: f() got an unexpected keyword argument 'x'", "argument", None),
        ("Error: Order not found", "entity_not_found", None),
        ("Error: Item 123 not found or available", "entity_not_found", None),
        ("Error: Non-pending order cannot be cancelled", "other", None),
        ("Error: Unknown ID format or type: 555", "argument", None),  # telecom's id parser
        (None, "other", None),
    ],
)
def test_classify_error(content: str | None, channel: str, name: str | None) -> None:
    assert classify_error(content) == (channel, name)


def test_errors_are_counted_from_messages_including_multi_tool_and_user_calls() -> None:
    data = results(
        [
            episode(
                "t",
                0,
                [
                    Turn((Call("a", "Error: x"), Call("b"), Call("c", "Error: y"))),
                    Turn((Call("toggle", "Error: z"),), requestor="user"),
                ],
            )
        ]
    )
    simulation = data["simulations"][0]
    assert "num_errors" not in simulation
    assert any("tool_messages" in m for m in simulation["messages"])
    (ep,) = read_episodes(data)
    assert ep.failed_calls == 3
    assert [(c.name, c.requestor, c.error) for c in ep.calls] == [
        ("a", "assistant", True),
        ("b", "assistant", False),
        ("c", "assistant", True),
        ("toggle", "user", True),
    ]


def test_results_without_call_ids_are_matched_in_order() -> None:
    data = results([episode("t", 0, [Turn((Call("a"), Call("b", not_found("b"))))])])
    for message in data["simulations"][0]["messages"]:
        for call in message.get("tool_calls") or []:
            call["id"] = ""
        for inner in message.get("tool_messages", []):
            inner["id"] = ""
    (ep,) = read_episodes(data)
    assert [(c.name, c.error, c.channel) for c in ep.calls] == [
        ("a", False, None),
        ("b", True, "hallucinated_name"),
    ]


def test_nl_basis_without_assertions_is_not_unjudged() -> None:
    data = results(
        [
            episode("t", 0, [], reward_basis=("DB", "NL_ASSERTION"), nl_assertions=None),
            episode("u", 0, [], reward_basis=("DB", "NL_ASSERTION"), nl_assertions=None),
            episode("u", 1, [], reward_basis=("DB", "NL_ASSERTION"), nl_assertions=[{"met": 1}]),
        ]
    )
    # Task t has no assertions to judge (scored vacuously); task u has one.
    data["tasks"][1]["evaluation_criteria"]["nl_assertions"] = ["The agent apologises."]
    assert [e.nl_unjudged for e in read_episodes(data)] == [False, True, False]
    data["simulations"][0]["reward_info"]["nl_assertions_scored"] = False  # our writer's flag
    assert read_episodes(data)[0].nl_unjudged


def test_sweep_boundary_k_equal_to_errors_fails() -> None:
    data = results(
        [episode("t", 0, [Turn((Call("x", "Error: a"),)), Turn((Call("y", "Error: b"),))])]
    )
    (ep,) = read_episodes(data)
    assert ep.failed_calls == 2 and ep.success
    assert [success_at(ep, k) for k in (1, 2, 3, 10)] == [False, False, True, True]


def test_sweep_past_the_runs_budget_is_not_available() -> None:
    data = results([episode("t", 0, [Turn((Call("x", "Error: a"),))])], max_errors=3)
    arm = summarize_arm(
        Arm("k3", Path("k3/results.json"), data["info"], tuple(read_episodes(data)))
    )
    assert isinstance(arm.sweep[3], Interval) and arm.sweep[3].estimate == 1.0
    assert isinstance(arm.sweep[1], Interval) and arm.sweep[1].estimate == 0.0
    assert arm.sweep[4] == NotAvailable("beyond the run's budget K=3 (episodes stopped there)")
    assert arm.success == arm.sweep[3]


def test_dir_format_reads_simulations_folder(tmp_path: Path) -> None:
    data = results([episode("t", 0, []), episode("t", 1, [], reward=0.0)])
    for simulation in data["simulations"]:
        write(tmp_path / "simulations" / f"{simulation['id']}.json", simulation)
    data["simulations"] = []
    arm = load_arm(write(tmp_path / "results.json", data), "dir")
    summary = summarize_arm(arm)
    assert summary.episodes == 2
    assert isinstance(summary.success, Interval) and summary.success.estimate == 0.5


def test_scenario_arms_by_hand(tmp_path: Path) -> None:
    off_path, reflexive_path = build(tmp_path)
    off, reflexive = load_arm(off_path), load_arm(reflexive_path)
    assert (off.label, reflexive.label) == ("retail/off", "retail/reflexive")
    assert default_pairs([off, reflexive]) == [("retail/off", "retail/reflexive")]

    a = summarize_arm(off)
    assert isinstance(a.success, Interval) and a.success.estimate == pytest.approx(0.8)
    sweep = {k: v.estimate for k, v in a.sweep.items() if isinstance(v, Interval)}
    assert sweep == pytest.approx({1: 0.4, 2: 0.6, 3: 0.6, **{k: 0.8 for k in range(4, 11)}})
    assert a.agent_tool_calls == 12
    assert a.channel_counts == {
        "hallucinated_name": 4,
        "user_side_tool": 0,
        "argument": 1,
        "entity_not_found": 1,
        "other": 0,
        "any": 6,
    }
    assert a.channel_rates["hallucinated_name"] == pytest.approx(4 / 12)
    assert a.names == {"lookup_order": 3, "search_orders": 1}
    assert a.raw_hallucinated_calls == 4
    assert a.recovery_counts == (2, 5, 6) and a.recovery == pytest.approx(0.4)
    # Both readings, named. Next call: 1/1 + 0/1 + 1/3 (episodes 2, 3, 4). A success follows
    # before the end: 1 of 1, 0 of 2 (nothing succeeds after message 2), 3 of 3.
    next_call, eventual = a.recovery_readings
    assert (next_call.reading, next_call.recovered, next_call.of) == (
        "the next agent call succeeds",
        2,
        5,
    )
    assert (eventual.recovered, eventual.of) == (4, 6)
    assert eventual.reading == "a successful agent call follows before the episode ends"
    assert isinstance(eventual.share, Interval)
    assert eventual.share.low < 4 / 6 < eventual.share.high
    assert a.proxy.caught_by_channel["unknown_tool"] == 3  # answers, each counted once
    assert a.proxy.caught_by_channel["schema_violation"] == 1
    assert (a.proxy.caught_answers, a.proxy.fixed_answers) == (4, 0)
    assert a.proxy.fixed_share == 0.0
    assert a.repair_cost.extra_upstream_calls == 0.0
    assert a.termination == {"user_stop": 5}
    assert a.cell == "retail" and a.mode == "off"

    b = summarize_arm(reflexive)
    assert (b.episodes, b.scored, b.nl_unjudged) == (5, 4, 1)
    assert isinstance(b.success, Interval) and b.success.estimate == 1.0
    assert isinstance(b.sweep[1], Interval) and b.sweep[1].estimate == 0.75
    assert b.agent_tool_calls == 7 and b.channel_counts["any"] == 0
    assert b.user_failed_calls == 1
    assert b.names == {"lookup_order": 2, "fetch_order": 1}
    # 3 invented names the proxy removed; 7 calls ran: 3 of the 10 first-answer calls.
    assert b.raw_hallucination_rate == pytest.approx(3 / 10)
    assert b.recovery == NotAvailable("no failed agent call was followed by another")
    assert (b.proxy.caught_answers, b.proxy.fixed_answers, b.proxy.repairs) == (3, 3, 3)
    assert b.proxy.fixed_share == 1.0
    cost = b.repair_cost
    assert cost.episodes_with_headers == 5
    assert cost.extra_upstream_calls == pytest.approx(0.6)
    assert cost.prompt_tokens == pytest.approx(600)
    assert cost.completion_tokens == pytest.approx(16)
    assert cost.seconds == pytest.approx(0.5)
    assert cost.overhead_ms_per_answer == pytest.approx(7.0 / 8)
    assert b.provenance is not None and b.provenance["user_simulator"] == "scripted"


def test_scenario_pair_by_hand(tmp_path: Path) -> None:
    off_path, reflexive_path = build(tmp_path)
    arms = [load_arm(off_path), load_arm(reflexive_path)]
    summary = build_summary(arms, [("retail/off", "retail/reflexive")])
    (pair,) = summary.pairs
    assert pair.paired == 4 and pair.unpaired_reference == 1 and pair.unpaired_compared == 0
    assert (pair.table.both, pair.table.reference_only, pair.table.compared_only) == (3, 0, 1)
    assert isinstance(pair.difference, Interval) and pair.difference.estimate == 0.25
    assert pair.mcnemar_p == 1.0 and pair.mcnemar_p_holm == 1.0
    gaps = {k: v.estimate for k, v in pair.sweep_gap.items() if isinstance(v, Interval)}
    assert gaps == pytest.approx({1: 0.5, 2: 0.5, 3: 0.5, **{k: 0.25 for k in range(4, 11)}})
    assert pair.spearman == pytest.approx(0.5)
    assert pair.novel == (1, 3)
    assert any("counted apart" in note for note in summary.notes)


def test_spearman_and_novel_share_undefined_when_no_names(tmp_path: Path) -> None:
    clean = results([episode("t", 0, [Turn((Call("get_order"),))])])
    first = load_arm(write(tmp_path / "a" / "x" / "results.json", clean), "a")
    second = load_arm(write(tmp_path / "b" / "x" / "results.json", clean), "b")
    (pair,) = build_summary([first, second], [("a", "b")]).pairs
    assert pair.spearman == NotAvailable("neither arm invented a tool name")
    assert pair.novel == NotAvailable("the compared arm invented no tool names")
    assert isinstance(pair.tost, NotAvailable)


# --- property: success@10 from the sweep is the run's own success when max_errors was 10 ---

_turn = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["assistant", "user"])), min_size=1, max_size=3
)


def _simulate(turns: list[list[tuple[bool, str]]], reward: float) -> tuple[dict[str, Any], int]:
    """Play the turns as τ²-bench would with max_errors 10: stop at the 10th failed call.

    Returns the simulation and how many calls failed in it.
    """
    played: list[Turn] = []
    errors = 0
    for turn in turns:
        requestor = turn[0][1]  # one participant per turn
        calls = tuple(Call("t", "Error: failed" if failed else None) for failed, _ in turn)
        played.append(Turn(calls, requestor=requestor))
        errors += sum(failed for failed, _ in turn)
        if errors >= 10:
            # τ²-bench ends the episode and its evaluator gives 0 to a too_many_errors episode.
            return episode("t", 0, played, reward=0.0, termination="too_many_errors"), errors
    return episode("t", 0, played, reward=reward), errors


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.lists(_turn, max_size=8), st.sampled_from([0.0, 0.5, 1.0, 1.0 - 1e-7])),
        min_size=1,
        max_size=12,
    )
)
def test_success_at_10_equals_the_runs_success(cases: list[tuple[list[Any], float]]) -> None:
    played = [_simulate(turns, reward) for turns, reward in cases]
    data = json.loads(json.dumps(results([p[0] for p in played], max_errors=10)))
    for i, simulation in enumerate(data["simulations"]):
        simulation["trial"] = i
    episodes = read_episodes(data)
    own = [abs(s["reward_info"]["reward"] - 1.0) <= 1e-6 for s in data["simulations"]]
    assert [e.failed_calls for e in episodes] == [p[1] for p in played]
    assert [success_at(e, 10) for e in episodes] == own
    for e in episodes:  # a larger budget never turns a success into a failure
        assert [success_at(e, k) for k in range(1, 11)] == sorted(
            success_at(e, k) for k in range(1, 11)
        )
    arm = summarize_arm(Arm("arm", Path("arm/results.json"), data["info"], tuple(episodes)))
    assert arm.sweep[10] == arm.success
    assert isinstance(arm.success, Interval)
    assert arm.success.estimate == pytest.approx(sum(own) / len(own))


def test_agent_calls_to_the_users_side_tools_are_not_invented_names(tmp_path: Path) -> None:
    # Telecom gives the user a phone (toggle_airplane_mode, ...): an agent that calls one of
    # those tools called the wrong side, it did not invent a name.
    calls = (
        Call("toggle_airplane_mode", not_found("toggle_airplane_mode")),
        Call("nope", not_found("nope")),
    )
    data = results([episode("t", 0, [Turn(calls)])], domain="telecom")
    arm = load_arm(write(tmp_path / "c" / "off" / "results.json", data))
    summary = summarize_arm(arm)
    assert summary.channel_counts["user_side_tool"] == 1
    assert summary.channel_counts["hallucinated_name"] == 1
    assert summary.names == {"nope": 1}
    assert classify_error(not_found("check_status_bar"), arm.user_tools) == ("user_side_tool", None)


# --- one episode, two views: the transcript and the report say the same -------------------


def _agreement_episode() -> dict[str, Any]:
    promote = {"tool_errors": ["tool_call_in_content"], "repairs": 0, "promoted": 1}
    one_reask = {"tool_errors": ["unknown_tool"], "repairs": 1, "unknown_tools": ["lookup"]}
    # Two re-asks, still an invented name on delivery: the record mixes the attempts' channels.
    two_reasks = {"tool_errors": ["unknown_tool"] * 3, "repairs": 2, "unknown_tools": ["fetch"]}
    observed = {"tool_errors": ["schema_violation"], "repairs": 0}
    return episode(
        "t",
        0,
        [
            Turn((Call("get_order", arguments={"order_id": "#1"}),), proxy=promote),
            Turn((Call("get_order", arguments={"order_id": "#2"}),), proxy=one_reask),
            Turn((Call("fetch", not_found("fetch")),), proxy=two_reasks),
            Turn((Call("get_order", MISSING_REASON),), proxy=observed),
        ],
    )


def test_transcript_and_report_say_the_same_of_one_episode(tmp_path: Path) -> None:
    from evals.demo.transcript import episode_counts, turn_views
    from evals.tau2.logs import SimulationRun
    from repairproxy.validation import ToolsCache

    tools = ToolsCache().compile(
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_order",
                        "parameters": {
                            "type": "object",
                            "properties": {"order_id": {"type": "string"}},
                            "required": ["order_id"],
                        },
                    },
                }
            ]
        }
    )
    simulation = _agreement_episode()
    views = turn_views(SimulationRun.model_validate(simulation), tools)
    counts = episode_counts(views)
    arm = load_arm(write(tmp_path / "c" / "reflexive" / "results.json", results([simulation])))
    proxy = summarize_arm(arm).proxy
    # Caught in the first answer, per channel: answers, each once.
    assert dict(counts.caught) == {c: n for c, n in proxy.caught_by_channel.items() if n}
    assert dict(counts.caught) == {
        "tool_call_in_content": 1,
        "unknown_tool": 2,
        "schema_violation": 1,
    }
    assert counts.promoted == 1 and counts.reasks == proxy.repairs == 3
    # Fixed: caught, changed (a promotion counts), valid on delivery; the transcript's verdict
    # on what was delivered and the environment's agree answer by answer.
    changed = [v for v in views if v.caught and (v.promoted or v.reasks)]
    fixed = [v for v in changed if not v.delivered]
    still_invalid = [v for v in changed if v.delivered]
    assert (len(changed), len(fixed), len(still_invalid)) == (3, 2, 1)
    assert proxy.changed_answers == len(changed)
    assert proxy.fixed_answers == len(fixed)
    assert proxy.still_invalid_answers == len(still_invalid)
    assert proxy.not_separable == 1


def test_amplification_per_call_and_per_episode_by_hand() -> None:
    def arm(failed_of: list[tuple[int, int]]) -> list[Episode]:
        data = results(
            [
                episode(
                    f"t{i}",
                    0,
                    [
                        Turn(
                            tuple(
                                Call("get_order", "Error: x" if k < f else None) for k in range(n)
                            )
                        )
                    ],
                )
                for i, (f, n) in enumerate(failed_of)
            ]
        )
        return read_episodes(data)

    reference = arm([(1, 4), (1, 4)])  # 2 of 8 calls, 1 per episode
    compared = arm([(2, 8), (3, 8)])  # 5 of 16 calls, 2.5 per episode
    per_call = amplification(reference, compared)["any"]
    per_episode = amplification(reference, compared, per="episode")["any"]
    assert isinstance(per_call, RateRatio) and isinstance(per_episode, RateRatio)
    assert per_call.ratio.estimate == pytest.approx((5 / 16) / (2 / 8))
    assert per_episode.ratio.estimate == pytest.approx(2.5)
    assert per_call.ratio.low < 1.25 < per_call.ratio.high


def test_pairs_summarised_together_equal_each_pair_alone(tmp_path: Path) -> None:
    # The report's pairs share one vectorised pass (intervals, TOST, bootstrap draws); each
    # pair must read as it does alone, budgets past a run's own K included.
    def arm(name: str, seed: int, max_errors: int = 10) -> Arm:
        rng = random.Random(seed)
        simulations = [
            episode(
                f"task_{t}",
                k,
                [Turn((Call("get_order", "Error: x" if rng.random() < 0.3 else None),))],
                reward=1.0 if rng.random() < 0.5 else 0.0,
            )
            for t in range(12)
            for k in range(3)
        ]
        content = results(simulations, max_errors=max_errors)
        path = write(tmp_path / name / "results.json", content)
        return load_arm(path, name)

    arms = [arm("a", 1), arm("b", 2), arm("c", 3, max_errors=3), arm("d", 4)]
    arms.append(replace(arms[3], label="e", episodes=arms[3].episodes[:20]))  # fewer tasks
    summaries = {a.label: summarize_arm(a) for a in arms}
    pairs = [(arms[0], b, summaries["a"], summaries[b.label]) for b in arms[1:]]
    together = summarize_pairs(pairs)
    assert together == [summarize_pair(*pair) for pair in pairs]
    assert isinstance(together[1].sweep_gap[4], NotAvailable)  # c stopped at K=3
    assert together[3].tasks < together[0].tasks


def test_raw_hallucination_rate_counts_the_first_answers_calls_when_the_proxy_says(
    tmp_path: Path,
) -> None:
    """1 invented call re-asked into 3 valid calls: 1 of the first answer's 1 call (100%), not
    1 of the 3 delivered + 1 removed (25%), once X-Repairproxy-First-Tool-Calls is recorded;
    without it the old reading stays (records from before the header)."""
    valid = (Call("get_order_details"),) * 3

    def rate(proxy: dict[str, Any]) -> Any:
        content = results([episode("1", 0, [Turn(valid, proxy=proxy)])])
        path = write(tmp_path / f"r{len(proxy)}.json", content)
        return summarize_arm(load_arm(path)).raw_hallucination_rate

    record = {"tool_errors": ["unknown_tool"], "repairs": 1, "unknown_tools": ["lookup_order"]}
    assert rate(record) == pytest.approx(1 / 4)
    assert rate({**record, "first_tool_calls": 1}) == pytest.approx(1.0)
