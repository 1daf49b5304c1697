"""Progress bars piped to a log: one short line per redraw, never one carriage-return line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from repairproxy.local.fetch import _PartsBar
from repairproxy.local.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_piped_bar_writes_lines() -> None:
    out = io.StringIO()
    bar = progress_bar(file=out, pipe_interval=0, total=5, desc="grid", unit="episode")
    for _ in range(5):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines and all(line.strip() for line in lines)
    assert all(len(line) <= 100 for line in lines)
    assert "5/5" in lines[-1]


def test_a_piped_bar_is_throttled() -> None:
    out = io.StringIO()
    bar = progress_bar(file=out, pipe_interval=3600, total=1000, desc="bytes")
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert len(out.getvalue().splitlines()) <= 3  # the first draw, the last, nothing between


def test_a_terminal_bar_redraws_in_place() -> None:
    out = _Terminal()
    bar = progress_bar(file=out, total=2, desc="grid", mininterval=0)
    bar.update(2)
    bar.close()
    assert "\r" in out.getvalue()


def test_the_model_download_bar_piped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = tmp_path / "part.tar"
    part.write_bytes(b"x" * 1000)
    bar = _PartsBar(3, "model parts", enabled=True)
    for _ in range(3):
        bar.advance(part)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "3/3" in err.splitlines()[-1]
