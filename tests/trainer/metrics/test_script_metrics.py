"""fsdp_trainer.metrics.script: what a script of your own (spec.command) reports, read as the operator reads it.

Two ranks under a real torchrun, each reporting through ScriptMetrics; local
rank 0's endpoint is scraped while it lingers and parsed with the operator's
own parser, so a name or a label that drifted from the contract fails here.
"""

from __future__ import annotations

import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from fsdp_api.contract import ENV_JOB_NAME, ENV_METRICS_LINGER_SECONDS, ENV_METRICS_PORT, exposed_series
from fsdp_api.launch import torchrun_standalone
from fsdp_api.local_process import local_env
from fsdp_api.ports import free_port
from fsdp_operator.controller.progress import parse_trainer_metrics

from tests.support.trainer_run import parse_metrics

SCRIPT = """
import os, sys, time
from fsdp_trainer.metrics.script import ScriptMetrics

rank = int(os.environ["RANK"])
metrics = ScriptMetrics(max_steps=5)
for step in range(1, 6):
    # Rank 0 reports 1/step, rank 1 10/step: the status must show rank 0's.
    metrics.step(step, loss=(1.0 if rank == 0 else 10.0) / step, tokens=100, seconds=0.5)
metrics.checkpoint_saved(5, seconds=0.25, size_bytes=1234)
print(f"rank {rank} done", flush=True)
metrics.close()
"""


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


@pytest.mark.slow  # a 2-rank torchrun (over the unit tier's limit, tests/slow_guard.py)
def test_a_scripts_metrics_read_as_the_trainers_do(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    port = free_port()
    env = local_env(2, metrics_dir=tmp_path / "metrics")
    env |= {ENV_METRICS_PORT: str(port), ENV_JOB_NAME: "mine", ENV_METRICS_LINGER_SECONDS: "30"}
    proc = subprocess.Popen(
        torchrun_standalone(2, [str(script)]), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        text = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            text = scrape(port)
            if text and 'fsdp_checkpoint_last_step{job_name="mine",local_rank="1"' in text:
                break
            time.sleep(0.2)
        assert text, proc.communicate(timeout=30)[0] if proc.poll() is not None else "no endpoint"
    finally:
        proc.terminate()
        proc.wait(60)

    progress = parse_trainer_metrics(text)
    assert progress.step == 5
    assert progress.loss == 0.2  # rank 0's, not rank 1's 2.0
    assert progress.tokens_per_second == 400.0  # 100 tokens in 0.5 s, times the 2 ranks
    assert progress.checkpoint_last_step == 5
    assert progress.seconds_per_step == 0.5
    samples = parse_metrics(text)
    names = {s.name for s in samples}
    assert names <= exposed_series(), names - exposed_series()
    ranks = {(s.labels["node_rank"], s.labels["local_rank"]) for s in samples if s.name == "fsdp_train_step"}
    assert ranks == {("0", "0"), ("0", "1")}
    size = [s.value for s in samples if s.name == "fsdp_checkpoint_size_bytes"]
    assert size == [1234.0, 1234.0]


def test_without_a_metrics_port_nothing_is_served_and_every_call_works() -> None:
    from fsdp_trainer.metrics.script import ScriptMetrics

    metrics = ScriptMetrics(max_steps=3, env={"RANK": "0", "LOCAL_RANK": "0"})
    metrics.step(1, loss=1.0, tokens=10, seconds=0.1)
    metrics.checkpoint_saved(1)
    metrics.checkpoint_loaded(1)
    metrics.close()
    assert metrics.server is None and metrics.metrics is None
