"""The soak run in CI: two minutes of mixed traffic (valid, hallucinated, streamed, faults,
abandoned clients) against the proxy as its own process; its RSS must stay bounded after the
warm-up minute (``benchmarks/soak.py``; the note quotes a 30-minute run)."""

from __future__ import annotations

import pytest

from benchmarks import soak


def test_verdict_rule() -> None:
    assert soak.verdict([(0, 40.0), (60, 50.0), (120, 54.9)], 60)[0]  # +4.9 MiB < 5 MiB
    assert not soak.verdict([(0, 40.0), (60, 50.0), (120, 55.1)], 60)[0]
    assert soak.verdict([(0, 40.0), (60, 100.0), (120, 109.9)], 60)[0]  # under 10%
    assert not soak.verdict([(0, 40.0), (60, 100.0), (120, 110.5)], 60)[0]


@pytest.mark.slow
def test_two_minute_soak_keeps_memory_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    status = soak.main(["--minutes", "2", "--rate", "30"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "hallucinated:200" in out and "fault:502" in out and "abandoned" in out
