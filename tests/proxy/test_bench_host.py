"""``benchmarks.host``: the host's steal share of the CPUs over a benchmark's window, read from a
``/proc/stat`` (this machine's, and written ones with known figures)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.host import StealWindow, cpu_times


def _stat(path: Path, steal: int, others: int) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, then a CPU of its own
    user = others - 40
    path.write_text(
        f"cpu  {user} 0 20 10 5 3 2 {steal} 7 0\ncpu0 1 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n"
    )


def test_this_machines_counters_are_read() -> None:
    found = cpu_times()
    if not Path("/proc/stat").exists():
        assert found is None
        return
    assert found is not None
    steal, total = found
    assert 0 <= steal <= total and total > 0


def test_the_steal_share_over_a_window(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, steal=100, others=1000)
    assert cpu_times(stat) == (100, 1100)  # guest time is inside user time: not added twice
    window = StealWindow(stat)
    _stat(stat, steal=150, others=1450)  # 500 ticks more, 50 of them stolen
    window.stop()
    _stat(stat, steal=1000, others=2000)  # after the window: not counted
    assert window.percent() == 10.0
    assert window.describe().startswith("host steal 10.0% of the CPUs over ")


def test_no_counters_no_figure(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    assert cpu_times(missing) is None
    window = StealWindow(missing)
    assert window.percent() is None
    assert window.describe() == "host steal unknown (no /proc/stat)"
    garbled = tmp_path / "garbled"
    garbled.write_text("intr 1 2 3\n")
    assert cpu_times(garbled) is None
