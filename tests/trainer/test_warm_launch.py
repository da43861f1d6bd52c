"""The trainer tests' warm launch (warm_launch.py) trains exactly as the pods' cold launch does."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_api.contract import ENV_TRAINER_FAULT

from tests.trainer.harness import ParityRuns, launch, offline_env
from tests.trainer.warm_launch import warm_launcher


@pytest.mark.slow
def test_a_warm_launch_gives_the_cold_launchs_losses_bit_for_bit(
    tmp_path: Path, parity_runs: ParityRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm = parity_runs.get("full")
    assert "--run-path" not in warm.output  # the harness's own launch, not a stand-in
    monkeypatch.setenv("FSDP_TESTS_COLD_LAUNCH", "1")
    config = parity_runs.config("full")
    config["checkpoint"]["dir"] = str(tmp_path / "checkpoints")  # not the shared run's: it would resume there
    cold = launch(tmp_path, config).check()

    assert warm.losses() == cold.losses()
    assert sorted(warm.losses()) == list(range(1, 21))
    assert [e["step"] for e in warm.events("checkpoint_saved")] == [e["step"] for e in cold.events("checkpoint_saved")]
    # Both ranks of both launches ran: a fork that lost a rank would still log rank 0's losses.
    assert warm.losses(rank=1) == cold.losses(rank=1)


@pytest.mark.slow  # a fresh Python importing torch (over the unit tier's limit, tests/slow_guard.py)
def test_only_an_environment_the_trainer_reads_at_run_time_may_differ_from_the_servers() -> None:
    env = offline_env()
    launcher = warm_launcher(env, env)
    assert launcher is not None
    assert warm_launcher({**env, ENV_TRAINER_FAULT: "after_step:3"}, env) is launcher
    # Read at import (a sitecustomize on PYTHONPATH, inductor's compiler): the launch must be cold.
    assert warm_launcher({**env, "PYTHONPATH": "/elsewhere"}, env) is None
    assert warm_launcher({**env, "CXX": "/nonexistent/c++"}, env) is None
    # The test process's environment changed (a library set a variable): a new server, not cold launches.
    drifted = {**env, "TORCHINDUCTOR_CACHE_DIR": "/tmp/elsewhere"}
    again = warm_launcher(drifted, drifted)
    assert again is not None and again is not launcher and launcher._server.poll() is not None
    assert warm_launcher(env, env) is not again  # and back


def test_cold_launches_are_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_TESTS_COLD_LAUNCH", "1")
    assert warm_launcher(offline_env(), offline_env()) is None


@pytest.mark.slow
def test_a_launch_over_its_time_is_killed_with_every_process_state_and_python_stack_in_the_message(
    tmp_path: Path, parity_runs: ParityRuns
) -> None:
    """A hang nobody can reproduce (a 4-rank run in a cold CI) must leave its evidence in the failure."""
    config = parity_runs.config("full")
    config["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    config["training"]["maxSteps"] = 3
    # Rank 1 hangs after its first step; a warm launch gets there in a few seconds even on a loaded machine.
    with pytest.raises(AssertionError) as over:
        launch(tmp_path, config, env={ENV_TRAINER_FAULT: "after_step:1:1:hang"}, timeout=40)
    message = str(over.value)
    assert message.startswith("trainer still running after 40s:")
    processes = message.split("the launch's processes at the timeout:\n", 1)[1].splitlines()
    assert len(processes) >= 3, processes  # torchrun's agent and its two ranks
    assert all(" state " in line and " wchan " in line for line in processes), processes
    # rank 1 in the fault's sleep, in its own stack, dumped by faulthandler before the kill
    assert "most recent call first" in message and 'faults.py", line' in message and "in _act" in message
