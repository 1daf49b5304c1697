"""τ²-bench's reward, one scorer per component (DB, ENV_ASSERTION, ACTION, COMMUNICATE,
NL_ASSERTION) behind the ``Scorer`` protocol; ``evals.tau2.reward`` composes them."""

from evals.tau2.scoring.action import ActionScorer, action_matches
from evals.tau2.scoring.base import Judge, Score, ScoredEpisode, Scorer, replay_gold
from evals.tau2.scoring.communicate import CommunicateScorer
from evals.tau2.scoring.environment import DBScorer, EnvAssertionScorer
from evals.tau2.scoring.nl import NLAssertionScorer, OpenAIJudge, parse_judge_output

__all__ = [
    "SCORERS",
    "ActionScorer",
    "CommunicateScorer",
    "DBScorer",
    "EnvAssertionScorer",
    "Judge",
    "NLAssertionScorer",
    "OpenAIJudge",
    "Score",
    "ScoredEpisode",
    "Scorer",
    "action_matches",
    "parse_judge_output",
    "replay_gold",
]

# In τ²-bench's order of evaluation; NL assertions run only when the basis names them.
SCORERS: tuple[Scorer, ...] = (
    DBScorer(),
    EnvAssertionScorer(),
    ActionScorer(),
    CommunicateScorer(),
    NLAssertionScorer(),
)
