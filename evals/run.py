"""``python -m evals.run``: one domain's tasks x trials into ``results.json``.

The runner is the engine's (``evals.tau2.run``); this is the command users type.
"""

from evals.tau2.run import main

if __name__ == "__main__":
    raise SystemExit(main())
