"""A rank's one error line reaches the log whole, even when every rank writes it at once."""

from __future__ import annotations

import io

import pytest
from fsdp_api.contract import CONFIG_ERROR_EXIT_CODE
from fsdp_trainer.__main__ import main


class _Writes(io.StringIO):
    """stderr as the pods have it (PYTHONUNBUFFERED): each write() is its own write to the pipe."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


def test_the_error_line_and_its_newline_are_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks wrote the disk-full line at once and print()'s separate newline let them run
    # together on one line (seen in a clean-clone run of tests/trainer/checkpoint/test_disk_full.py).
    stderr = _Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    assert main(["--config", "/nonexistent/train.yaml"]) == CONFIG_ERROR_EXIT_CODE
    errors = [c for c in stderr.calls if "fsdp-train:" in c]
    assert errors == [
        "fsdp-train: invalid trainer configuration:\n"
        "  --config: cannot read /nonexistent/train.yaml: No such file or directory\n"
    ], stderr.calls
