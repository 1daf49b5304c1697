"""The risk screen: a model's per-channel propensity, and its amplification across precision arms.

Each arm answers the same decision points drawn from τ²-bench's gold replay; each raw answer is
judged with the proxy's validation (repair off) and kept in an append-only log, from which
``screen.json``, a report and a plot are derived. ``python -m evals.screen --help`` for the command.
"""

from evals.screen.ask import ArmSpec, AskOptions, ScreenError, parse_arm
from evals.screen.cli import main, rebuild, run_screen
from evals.screen.judge import CHANNELS, ERROR_CHANNELS, Judge, Verdict, divergence_margin
from evals.screen.points import DecisionPoint, replay_domain, select_points
from evals.screen.summary import FLAG_RATIO, paired_rate_ratio, summarize

__all__ = [
    "CHANNELS",
    "ERROR_CHANNELS",
    "FLAG_RATIO",
    "ArmSpec",
    "AskOptions",
    "DecisionPoint",
    "Judge",
    "ScreenError",
    "Verdict",
    "divergence_margin",
    "main",
    "paired_rate_ratio",
    "parse_arm",
    "rebuild",
    "replay_domain",
    "run_screen",
    "select_points",
    "summarize",
]
