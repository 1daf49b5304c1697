"""``python -m evals.demo``: the demo (``evals.demo.episode``)."""

from evals.demo.episode import main

if __name__ == "__main__":
    raise SystemExit(main())
