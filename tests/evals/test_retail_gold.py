"""Gold replay: each `base` task's gold actions, replayed through ``call_tool``, behave as expected.

A few gold trajectories fail on purpose (the user first gives a wrong email, zip or order id) and a
few fail because of how the data is (τ²-bench's own run of them fails the same way, and its DB
reward then compares against the state the failed call left unchanged). Those are listed below with
their reasons; any other error, or any expected error that does not happen, fails the test.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from evals.tau2.domains.retail import WRITE_TOOLS, RetailDomain, load
from evals.tau2.domains.retail.hashing import canonical_json
from evals.tau2.tasks import Task

# (task id, index of the gold action) -> (tool message, why it is expected).
_COMMON_EXPECTED: dict[tuple[str, int], tuple[str, str]] = {
    **{
        (task, 1): (
            "Error: Product not found",
            "gold probes 6086499569, the docstring's example id, which is no product",
        )
        for task in ("2", "3", "4")
    },
    **{
        (task, 0): ("Error: User not found", "the user gives a wrong email first")
        for task in ("35", "37", "38", "54", "55")
    },
    ("39", 0): ("Error: User not found", "the user gives a wrong name/zip first"),
    **{
        (task, index): ("Error: Order not found", "the user gives the order id without 'W'")
        for task in ("46", "47")
        for index in (1, 2)
    },
    ("64", 6): (
        "Error: Non-delivered order cannot be exchanged",
        "gold tries an exchange on the pending order, then modifies its items instead",
    ),
    ("67", 0): ("Error: User not found", "the user gives wrong zip 98178 first"),
    ("67", 1): ("Error: User not found", "the user's second zip 98186 is wrong too"),
    ("68", 0): ("Error: User not found", "the user gives wrong zip 98178 first"),
    ("105", 0): (
        "Error: Insufficient gift card balance to pay for the price difference",
        "the exchange costs 21.10 more and gift_card_7245904 holds 17.00 (data quirk)",
    ),
}
EXPECTED_ERRORS: dict[str, dict[tuple[str, int], tuple[str, str]]] = {
    "tasks.json": _COMMON_EXPECTED,
    "tasks_v0.2.0.json": {
        **_COMMON_EXPECTED,
        **{
            (task, 4): (
                "Error: Payment method should be the original payment method",
                "v0.2.0 gold refunds to PayPal, not the original method (fixed in v1.0.1)",
            )
            for task in ("12", "13")
        },
        **{
            ("21", index): (
                "Error: Product not found",
                "v0.2.0 gold looks up an item id as a product id (fixed in v1.0.1)",
            )
            for index in (5, 6, 8)
        },
    },
}


@pytest.fixture(scope="module", params=sorted(EXPECTED_ERRORS))
def tasks_file(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def domain(tau2_data_dir: Path, tasks_file: str) -> RetailDomain:
    return load(tau2_data_dir, tasks_file=tasks_file)


def replay(
    domain: RetailDomain, task: Task, *, check_hash: bool = False
) -> tuple[str, dict[tuple[str, int], str]]:
    """Run a task's gold actions on a fresh environment: final hash and the errors met."""
    env = domain.new_environment()
    env.apply_initial_state(task.initial_state)
    errors: dict[tuple[str, int], str] = {}
    for index, action in enumerate(task.gold_actions):
        result = env.call_tool(action.requestor, action.name, action.arguments)
        if result.error:
            errors[(task.id, index)] = result.content
    if check_hash:  # the cached hash equals hashing the whole dump (slow, so only sometimes)
        whole = canonical_json(env.db.model_dump()).encode("utf-8")
        assert env.db_hash() == hashlib.sha256(whole).hexdigest()
    return env.db_hash(), errors


def test_gold_replay(domain: RetailDomain, tasks_file: str) -> None:
    tasks = domain.tasks("base")
    assert len(tasks) == 114
    initial = domain.initial_db_hash()
    expected = EXPECTED_ERRORS[tasks_file]
    met: dict[tuple[str, int], str] = {}
    clean = changed = 0
    for position, task in enumerate(tasks):
        first_hash, errors = replay(domain, task, check_hash=position % 20 == 0)
        second_hash, again = replay(domain, task)
        assert first_hash == second_hash, f"task {task.id}: replay is not deterministic"
        assert errors == again
        met.update(errors)
        clean += not errors
        # The DB changes exactly when some write action succeeded.
        actions = task.gold_actions
        wrote = any(
            action.name in WRITE_TOOLS and (task.id, index) not in errors
            for index, action in enumerate(actions)
        )
        assert (first_hash != initial) == wrote, f"task {task.id}"
        changed += wrote
    print(f"\n{tasks_file}: gold replay of {len(tasks)} base tasks")
    print(f"  {clean} clean, {len(tasks) - clean} with expected errors, {changed} change the DB")
    for (task_id, index), content in sorted(met.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
        reason = expected.get((task_id, index), ("", "UNEXPECTED"))[1]
        print(f"  task {task_id} action {index}: {content}  <- {reason}")
    assert met == {key: content for key, (content, _) in expected.items()}
    assert domain.initial_db_hash() == initial  # no replay leaked into the shared store
