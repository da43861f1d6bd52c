"""The supervisor's seams: the forwarded signals and exit codes are the contract's, shared with run-local."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from fsdp_api import contract
from fsdp_operator import local
from fsdp_trainer import supervisor


def test_the_stopped_exit_code_is_sigterms_by_the_shells_convention() -> None:
    assert contract.signal_exit_code(signal.SIGTERM) == contract.STOPPED_EXIT_CODE == 143
    assert contract.signal_exit_code(signal.SIGKILL) == 137
    assert set(contract.FORWARDED_SIGNALS) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def test_the_pods_supervisor_and_run_local_forward_the_contracts_signals() -> None:
    assert supervisor.FORWARDED_SIGNALS is contract.FORWARDED_SIGNALS
    assert local.FORWARDED_SIGNALS is contract.FORWARDED_SIGNALS
    assert supervisor.STOPPED_EXIT_CODE is contract.STOPPED_EXIT_CODE


def test_a_torchrun_killed_by_a_signal_exits_as_the_shell_reports_it() -> None:
    assert supervisor.exit_status(-signal.SIGKILL, signalled=True, stopped=0, local_ranks=2) == 137
    assert supervisor.exit_status(-signal.SIGTERM, signalled=False, stopped=0, local_ranks=2) == 143


@pytest.fixture
def restored_handlers():
    saved = {s: signal.getsignal(s) for s in contract.FORWARDED_SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_before_the_launch_every_forwarded_signal_stops_the_check(restored_handlers: None) -> None:
    supervisor.stop_on_signals_before_the_launch()
    assert {s: signal.getsignal(s) for s in contract.FORWARDED_SIGNALS} == dict.fromkeys(
        contract.FORWARDED_SIGNALS, supervisor.stop_before_the_launch
    )


def test_a_rank_records_its_clean_stop_only_under_a_supervisor(tmp_path) -> None:
    supervisor.record_stop(7, {supervisor.ENV_STOP_DIR: str(tmp_path), "RANK": "3"})
    assert (tmp_path / "rank-3").read_text() == "7\n"
    supervisor.record_stop(7, {"RANK": "4"})  # no supervisor: nothing written, no error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-3"]


def test_only_this_interpreters_torchrun_is_forked(tmp_path: Path) -> None:
    from fsdp_trainer.forked_torchrun import own_torchrun

    assert own_torchrun([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "x.py"]) == ["--nnodes=1", "x.py"]
    assert own_torchrun([str(Path(sys.executable).parent / "torchrun"), "--nnodes=2"]) == ["--nnodes=2"]
    # Another interpreter's torchrun, or another program: started as a program.
    other = tmp_path / "bin" / "torchrun"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    assert own_torchrun([str(other), "--nnodes=2"]) is None
    assert own_torchrun(["/usr/bin/python3", "-m", "torch.distributed.run", "x.py"]) is None
    assert own_torchrun(["bash", "-c", "torchrun"]) is None
