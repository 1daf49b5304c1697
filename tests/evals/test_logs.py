"""The results file: reads τ²-bench-shaped files (extra fields tolerated), writes atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.tau2.logs import (
    AgentInfo,
    AssistantMessage,
    EnvironmentInfo,
    Info,
    Results,
    ResultsWriter,
    ToolMessage,
    UserInfo,
    load_results,
    save_results,
)
from evals.tau2.run import summarize


def tau2_style_file(num_trials: int = 2) -> dict[str, Any]:
    """A results file shaped as τ²-bench v1.0.1 writes it, including fields we do not model."""

    def simulation(task_id: str, trial: int, reward: float) -> dict[str, Any]:
        return {
            "id": f"sim-{task_id}-{trial}",
            "task_id": task_id,
            "timestamp": "2025-07-01T10:00:00.000001",
            "start_time": "2025-07-01T10:00:00.000001",
            "end_time": "2025-07-01T10:01:00.000001",
            "duration": 60.0,
            "termination_reason": "user_stop",
            "agent_cost": 0.01,
            "user_cost": 0.002,
            "reward_info": {
                "reward": reward,
                "db_check": {"db_match": reward == 1.0, "db_reward": reward},
                "env_assertions": None,
                "action_checks": [
                    {
                        "action": {"action_id": "a", "name": "get_order_details", "arguments": {}},
                        "action_match": True,
                        "action_reward": 1.0,
                        "tool_type": "read",
                    }
                ],
                "nl_assertions": None,
                "communicate_checks": [],
                "reward_basis": ["DB", "COMMUNICATE"],
                "reward_breakdown": {"DB": reward, "COMMUNICATE": 1.0},
                "info": {"env": None, "nl": None},
            },
            "messages": [
                {
                    "role": "assistant",
                    "content": "Hi! How can I help you today?",
                    "tool_calls": None,
                    "turn_idx": 0,
                    "timestamp": "2025-07-01T10:00:00.000001",
                    "cost": 0.0,
                    "usage": None,
                    "raw_data": None,
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "name": "get_order_details",
                            "arguments": {"order_id": "#W1"},
                            "requestor": "assistant",
                        }
                    ],
                    "turn_idx": 1,
                    "timestamp": "2025-07-01T10:00:01.000001",
                    "cost": 0.001,
                    "usage": {"prompt_tokens": 10},
                    "raw_data": {"id": "x"},
                },
                {
                    "id": "c1",
                    "role": "tool",
                    "content": "Error: Order not found",
                    "requestor": "assistant",
                    "error": True,
                    "turn_idx": 2,
                    "timestamp": "2025-07-01T10:00:02.000001",
                },
            ],
            "trial": trial,
            "seed": 300 + trial,
            "mode": "half_duplex",
        }

    return {
        "timestamp": "2025-07-01T10:00:00",
        "info": {
            "git_commit": "abc",
            "num_trials": num_trials,
            "max_steps": 200,
            "max_errors": 10,
            "user_info": {
                "implementation": "user_simulator",
                "llm": "gpt-4.1",
                "llm_args": {"temperature": 0.0},
                "global_simulation_guidelines": "# g",
            },
            "agent_info": {"implementation": "llm_agent", "llm": "gpt-4.1", "llm_args": {}},
            "environment_info": {"domain_name": "retail", "policy": "p", "tool_defs": None},
            "seed": 300,
            "text_streaming_config": None,
        },
        "tasks": [{"id": "0"}, {"id": "1"}],
        "simulations": [
            simulation("0", 0, 1.0),
            simulation("0", 1, 1.0),
            simulation("1", 0, 1.0),
            simulation("1", 1, 0.0),
        ],
    }


def test_reads_a_tau2_bench_results_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(tau2_style_file()))
    results = load_results(path)
    assert len(results.simulations) == 4
    tool = results.simulations[0].messages[2]
    assert isinstance(tool, ToolMessage) and tool.error and tool.content == "Error: Order not found"
    call = results.simulations[0].messages[1]
    assert isinstance(call, AssistantMessage) and call.tool_calls is not None
    assert call.tool_calls[0].arguments == {"order_id": "#W1"}
    summary = summarize(results)
    assert summary["successes"] == 3
    assert summary["pass_hat_k"][1] == pytest.approx((1 + 0.5) / 2)
    assert summary["pass_hat_k"][2] == pytest.approx((1 + 0) / 2)


def test_save_is_atomic_and_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out" / "results.json"
    info = Info(
        num_trials=1,
        max_steps=200,
        max_errors=10,
        user_info=UserInfo(implementation="gold_user"),
        agent_info=AgentInfo(implementation="gold_agent"),
        environment_info=EnvironmentInfo(domain_name="retail", policy="p"),
    )
    results = Results(info=info, tasks=[{"id": "0"}], simulations=[])
    save_results(path, results)
    assert load_results(path) == results

    def crash(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("evals.tau2.logs.os.replace", crash)
    changed = results.model_copy(update={"tasks": [{"id": "0"}, {"id": "1"}]})
    with pytest.raises(OSError, match="disk full"):
        save_results(path, changed)
    assert load_results(path) == results  # the old file is intact
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp file left


def test_results_writer_appends_and_reloads(tmp_path: Path) -> None:
    source = tmp_path / "tau2.json"
    source.write_text(json.dumps(tau2_style_file()))
    complete = load_results(source)
    partial = complete.model_copy(update={"simulations": complete.simulations[:1]}, deep=True)
    path = tmp_path / "results.json"
    writer = ResultsWriter(path, partial)
    writer.flush()
    assert load_results(path).simulations == complete.simulations[:1]
    for simulation in complete.simulations[1:]:
        writer.append(simulation)
        assert load_results(path).simulations == writer.results.simulations
    assert load_results(path) == complete


def test_errors_are_counted_from_the_messages_when_the_file_has_no_counts(tmp_path: Path) -> None:
    raw = tau2_style_file()
    parallel = {
        "role": "tool",
        "tool_messages": [
            {"id": "c2", "role": "tool", "content": "ok", "requestor": "assistant"},
            {"id": "c3", "role": "tool", "content": "Error: x", "requestor": "user", "error": True},
        ],
    }
    raw["simulations"][0]["messages"].append(parallel)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    results = load_results(path)
    first = results.simulations[0]
    assert [m.role for m in first.messages] == ["assistant", "assistant", "tool", "tool", "tool"]
    assert first.num_errors == 2 and first.errors_by_requestor == {"assistant": 1, "user": 1}
    assert all(s.num_errors == 1 for s in results.simulations[1:])
    assert summarize(results)["tool_errors"] == {"assistant": 4, "user": 1}
    # Our own files carry the counts; they are read as written.
    save_results(path, results)
    assert load_results(path).simulations[0].errors_by_requestor == {"assistant": 1, "user": 1}
