"""Re-score one of our results.json files with τ²-bench v1.0.1's own evaluator (strict replay).

Run it with τ²-bench installed apart (see ``make_golden.py``)::

    TAU2_DATA_DIR=/work/shared/tau2-data /tmp/tau2-venv/bin/python \\
        tests/evals/golden/tau2_rescore.py runs/x/results.json retail

τ²-bench replays every tool call of each trajectory and raises when a recorded tool output differs
from what its own tools return (``strict_replay``), then scores the episode. The script prints how
many episodes τ²-bench scores as we did, how many it scores differently, and how many it refuses to
replay. There is no judge here (no network): NL assertions count as met, as our judge-less reward
leaves them out.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> int:
    from tau2.data_model.simulation import Results, RewardInfo
    from tau2.data_model.tasks import RewardType
    from tau2.evaluator import evaluator_nl_assertions
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.registry import registry

    def no_judge(cls: Any, task: Any, full_trajectory: Any) -> Any:
        breakdown = {RewardType.NL_ASSERTION: 1.0}
        return RewardInfo(reward=1.0, nl_assertions=[], reward_breakdown=breakdown)

    evaluator_nl_assertions.NLAssertionsEvaluator.calculate_reward = classmethod(no_judge)  # type: ignore[assignment]

    path, domain = argv[1], argv[2]
    with open(path, encoding="utf-8") as handle:
        results = Results.model_validate_json(handle.read())
    tasks = {task.id: task for task in registry.get_tasks_loader(domain)(None)}
    agree, problems = 0, []
    for sim in results.simulations:
        ours = sim.reward_info.reward if sim.reward_info else 0.0
        try:
            info = evaluate_simulation(
                sim,
                tasks[sim.task_id],
                EvaluationType.ALL,
                solo_mode=False,
                domain=domain,
                strict_replay=True,
            )
        except Exception as exc:  # a refused replay is the finding, not a crash
            problems.append(f"{sim.task_id}: replay refused: {type(exc).__name__}")
            continue
        if abs(info.reward - ours) < 1e-6:
            agree += 1
        else:
            problems.append(f"{sim.task_id}: ours {ours}, tau2 {info.reward}")
    print(f"{domain}: {len(results.simulations)} episodes, tau2 agrees on {agree}")
    for line in problems:
        print(f"  {line}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
