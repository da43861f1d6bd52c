"""free_port: a port for a process to bind later, which no outgoing connection can take meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fsdp_api import ports
from fsdp_api.ports import PORT_FLOOR, TORCH_DEFAULT_PORTS, ephemeral_port_range, free_port, port_is_free


def test_the_port_is_below_the_kernels_ephemeral_range_and_not_bound() -> None:
    low, high = ephemeral_port_range()
    for _ in range(50):
        port = free_port()
        assert PORT_FLOOR <= port < low or port > high, (port, low, high)
        assert port not in TORCH_DEFAULT_PORTS
        assert port_is_free(port)


def test_a_bound_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "ephemeral_port_range", lambda: (busy + 1, 60999))
        monkeypatch.setattr(ports, "PORT_FLOOR", busy - 1000)
        first_busy = lambda ports, k: [busy, *[p for p in ports if p != busy][: k - 1]]  # noqa: E731
        monkeypatch.setattr(ports.random, "sample", first_busy)
        port = free_port()
    assert port != busy and busy - 1000 <= port < busy + 1


def test_an_unreadable_range_is_linuxs_default_and_no_room_falls_back_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_port_range() == (32768, 60999)
    monkeypatch.setattr(ports, "ephemeral_port_range", lambda: (1024, 65535))  # the whole range is ephemeral
    assert 1024 <= free_port() <= 65535
