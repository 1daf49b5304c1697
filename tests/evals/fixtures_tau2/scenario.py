"""A two-arm grid cell (repair off vs reflexive) whose every number is worked out by hand.

Layout: ``<root>/runs/demo/retail/{off,reflexive}/results.json`` plus a ``provenance.json``
beside the reflexive arm. Budget K = 10.

off (the proxy only observes; headers recorded, nothing repaired):
  t0/0  get_order ok, find_user ok                                   reward 1, 0 errors
  t0/1  lookup_order NOT FOUND; get_order ok                         reward 1, 1 error
  t1/0  [get_user ok + cancel_order "Order not found"] (one MultiToolMessage);
        cancel_order missing argument                                 reward 0, 2 errors
  t1/1  lookup_order NF; lookup_order NF; search_orders NF; get_order ok   reward 1, 3 errors
  t2/0  get_order ok                                                 reward 1, 0 errors
  -> success 4/5; success@1 2/5, @2 3/5, @3 3/5 (boundary: 3 errors is not < 3), @4..10 4/5
  -> 12 agent calls: hallucinated 4, argument 1, entity 1, other 0; names lookup_order 3,
     search_orders 1; recovery 2 of 5 followed (6 failed)
reflexive (each invented name caught and repaired before the agent saw it):
  t0/0  first answer lookup_order (repaired) -> get_order ok; find_user ok   reward 1
  t0/1  first answer lookup_order (repaired) -> get_order ok; get_order ok   reward 1
  t1/0  get_user ok; the USER's toggle_airplane_mode fails                   reward 1, 1 error
  t1/1  first answer fetch_order (repaired) -> get_order ok                  reward 1
  t2/0  get_order ok, NL assertions in the basis and no judge verdict  -> counted apart
  -> success 4/4; success@1 3/4 (the user's error counts); names lookup_order 2, fetch_order 1
  -> 7 agent calls, 0 failed; raw hallucinated 3 (3 of the 7 + 3 first-answer calls: 3/10);
     proxy fixed 3 of 3 caught answers
  -> cost per episode (5 episodes): extra upstream calls 3/5, prompt tokens 3000/5,
     completion tokens 80/5, seconds 2.5/5
pair off -> reflexive on (task, trial) t0/0 t0/1 t1/0 t1/1: both 3, compared only 1;
  difference +0.25; McNemar p 1.0; sweep gap @1 +0.5, @2 +0.5, @3 +0.5, @4 +0.25;
  Spearman over {fetch_order, lookup_order, search_orders}: (0,3,1) vs (1,2,0) -> 0.5;
  novel share 1/3 (fetch_order).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.evals.fixtures_tau2 import Call, Turn, episode, not_found, results, write

MISSING_REASON = (
    "Error: RetailTools.cancel_pending_order() missing 1 required positional argument: 'reason'"
)


def _off(channels: str = "", names: str = "") -> dict[str, Any]:
    """The headers the engine records in mode off: the verdict, no repair."""
    return {
        "tool_errors": [c for c in channels.split(",") if c],
        "repairs": 0,
        "unknown_tools": [n for n in names.split(",") if n],
        "upstream_calls": 1,
        "overhead_ms": 0.5,
    }


def _repaired(name: str, prompt: int, completion: int, seconds: float) -> dict[str, Any]:
    return {
        "tool_errors": ["unknown_tool"],
        "repairs": 1,
        "unknown_tools": [name],
        "upstream_calls": 2,
        "repair_prompt_tokens": prompt,
        "repair_completion_tokens": completion,
        "repair_seconds": seconds,
        "overhead_ms": 1.5,
    }


def off_arm() -> dict[str, Any]:
    ok = _off()
    return results(
        [
            episode("t0", 0, [Turn((Call("get_order"),), proxy=ok), Turn((Call("find_user"),))]),
            episode(
                "t0",
                1,
                [
                    Turn(
                        (Call("lookup_order", not_found("lookup_order")),),
                        proxy=_off("unknown_tool", "lookup_order"),
                    ),
                    Turn((Call("get_order"),), proxy=ok),
                ],
                final_proxy=ok,
            ),
            episode(
                "t1",
                0,
                [
                    Turn(
                        (Call("get_user"), Call("cancel_pending_order", "Error: Order not found"))
                    ),
                    Turn(
                        (Call("cancel_pending_order", MISSING_REASON),),
                        proxy=_off("schema_violation"),
                    ),
                ],
                reward=0.0,
            ),
            episode(
                "t1",
                1,
                [
                    Turn(
                        (Call("lookup_order", not_found("lookup_order")),),
                        proxy=_off("unknown_tool", "lookup_order"),
                    ),
                    Turn((Call("lookup_order", not_found("lookup_order")),)),
                    Turn(
                        (Call("search_orders", not_found("search_orders")),),
                        proxy=_off("unknown_tool", "search_orders"),
                    ),
                    Turn((Call("get_order"),)),
                ],
            ),
            episode("t2", 0, [Turn((Call("get_order"),))]),
        ],
        agent_model="openai/qwen2.5-1.5b-q4",
    )


def reflexive_arm() -> dict[str, Any]:
    plain = {"tool_errors": [], "repairs": 0, "upstream_calls": 1, "overhead_ms": 0.5}
    arm = results(
        [
            episode(
                "t0",
                0,
                [
                    Turn((Call("get_order"),), proxy=_repaired("lookup_order", 1500, 40, 1.5)),
                    Turn((Call("find_user"),), proxy=plain),
                ],
                final_proxy=plain,
            ),
            episode(
                "t0",
                1,
                [
                    Turn((Call("get_order"),), proxy=_repaired("lookup_order", 500, 20, 0.5)),
                    Turn((Call("get_order"),), proxy=plain),
                ],
            ),
            episode(
                "t1",
                0,
                [
                    Turn((Call("get_user"),), proxy=plain),
                    Turn(
                        (Call("toggle_airplane_mode", "Error: Airplane mode is locked"),),
                        requestor="user",
                    ),
                ],
            ),
            episode(
                "t1",
                1,
                [Turn((Call("get_order"),), proxy=_repaired("fetch_order", 1000, 20, 0.5))],
            ),
            episode(
                "t2",
                0,
                [Turn((Call("get_order"),), proxy=plain)],
                reward_basis=("DB", "NL_ASSERTION"),
                nl_assertions=None,
            ),
        ],
        agent_model="openai/qwen2.5-1.5b-q4",
    )
    (t2,) = (t for t in arm["tasks"] if t["id"] == "t2")
    t2["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]
    t2["evaluation_criteria"]["nl_assertions"] = ["The agent confirms the order number."]
    return arm


PROVENANCE = {
    "project_commit": "abc1234",
    "proxy": {"repair": "reflexive", "max_repairs": 2},
    "repair_template": {"version": "repair_v1", "sha256": "f" * 64},
    "user_simulator": "scripted",
}


def build(root: Path) -> tuple[Path, Path]:
    """Write both arms under ``root``; return (off, reflexive) results paths."""
    cell = root / "runs" / "demo" / "retail"
    off = write(cell / "off" / "results.json", off_arm())
    reflexive = write(cell / "reflexive" / "results.json", reflexive_arm())
    (reflexive.parent / "provenance.json").write_text(json.dumps(PROVENANCE), encoding="utf-8")
    return off, reflexive
