"""``benchmarks.support.host``: the host's steal share of the CPUs over a benchmark's window, read
from a ``/proc/stat`` (this machine's, and written ones with known figures); how idle CPUs wait,
and the guest's halt polling set for a run and put back (written files in place of ``/sys``)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from benchmarks.support.host import HaltPolling, StealWindow, cpu_times, idle_policy


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


def test_how_idle_cpus_wait_is_said(tmp_path: Path) -> None:
    driver, poll = tmp_path / "current_driver", tmp_path / "guest_halt_poll_ns"
    assert idle_policy(driver, poll) == "idle CPUs: no cpuidle driver listed"
    driver.write_text("acpi_idle\n")
    assert idle_policy(driver, poll) == "idle CPUs: cpuidle driver acpi_idle"
    driver.write_text("haltpoll\n")
    poll.write_text("0\n")
    assert idle_policy(driver, poll).endswith(
        "guest halt polling 0 ns (each idle wait halts: an exit to the hypervisor)"
    )
    poll.write_text("200000\n")
    assert ", guest halt polling 200,000 ns (" in idle_policy(driver, poll)
    poll.write_text("garbled\n")
    assert idle_policy(driver, poll) == "idle CPUs: cpuidle driver haltpoll"


def test_halt_polling_is_set_for_the_block_and_put_back(tmp_path: Path) -> None:
    poll = tmp_path / "guest_halt_poll_ns"
    poll.write_text("0\n")
    with HaltPolling(200_000, poll) as polling:
        assert poll.read_text() == "200000\n"
        assert polling.previous == 0
        assert polling.describe() == (
            "guest halt polling set to 200,000 ns for this run (it was 0 ns; put back at the end)"
        )
    assert poll.read_text() == "0\n"
    with pytest.raises(KeyError), HaltPolling(50_000, poll):  # a failing run puts it back too
        assert poll.read_text() == "50000\n"
        raise KeyError("the run failed")
    assert poll.read_text() == "0\n"


def test_halt_polling_refuses_where_it_cannot_set_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RuntimeError, match="no guest halt polling"), HaltPolling(1, tmp_path / "x"):
        pass
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError):
        HaltPolling(-1, tmp_path / "x")
    poll = tmp_path / "guest_halt_poll_ns"
    poll.write_text("7\n")

    def refused(self: Path, data: str) -> int:
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as patched:  # not root: the kernel's file refuses the write
        patched.setattr(Path, "write_text", refused)
        with (
            pytest.raises(RuntimeError, match=r"cannot set .*Permission denied"),
            HaltPolling(9, poll),
        ):
            pass
    assert poll.read_text() == "7\n"


def test_a_run_stopped_by_sigterm_puts_the_polling_back(tmp_path: Path) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")
    poll = tmp_path / "guest_halt_poll_ns"
    poll.write_text("0\n")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped, HaltPolling(200_000, poll):
        assert poll.read_text() == "200000\n"
        os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` stops a run
        time.sleep(5)  # never reached: the handler raises at once
    assert stopped.value.code == 128 + signal.SIGTERM
    assert poll.read_text() == "0\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_benchmarks_refuse_a_window_they_cannot_set(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import overhead, vs_peers

    for main in (overhead.main, vs_peers.main):
        with pytest.raises(SystemExit) as refused:
            main(["--guest-halt-poll-ns", "-5"])
        assert refused.value.code == 2
        assert "--guest-halt-poll-ns must be >= 0" in capsys.readouterr().err
