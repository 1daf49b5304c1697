"""The τ²-bench engine (v1.0.1): domains, tasks, participants, the orchestrator, scoring, runs.

Imports nothing else of ``evals``: the grid, the analysis and the demo build on it.
"""
