"""``python -m evals.screen``: see ``evals.screen.cli``."""

from evals.screen.cli import main

raise SystemExit(main())
