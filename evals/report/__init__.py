"""The analysis written down: ``summary.json``, ``report.md``, ``report.html`` and the figures."""
