"""The trainer's /metrics endpoint, scraped while a real 2-rank torchrun CPU run trains."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch
from fsdp_api.contract import MOE_LAYER_METRICS, exposed_series
from fsdp_api.launch import torchrun_standalone
from fsdp_api.local_process import local_env
from fsdp_api.ports import free_port
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.metrics import MetricsProcessor, StepStats
from fsdp_trainer.metrics.flops import FlopsShape
from fsdp_trainer.metrics.prometheus import (
    multiproc_dir,
    process_start_time,
    remove_dead_agents,
    remove_stale_generations,
    scrape_order,
    serve,
)

from tests.support.trainer_run import Sample, TrainerRun, parse_metrics

FLOPS = FlopsShape(matmul_params=1000, num_layers=2, attention_width=64)

TRAINER_METRICS = exposed_series(gpu=False)

STEPS = 30
RANK_LABELS = {"job_name", "node_rank", "local_rank"}
# Per the shared contract; on the CPU the MFU gauge and the NVML series are
# absent, and eval/checkpoint series appear only once those have happened.
EXPECTED = {m for m in TRAINER_METRICS if not m.startswith(("fsdp_checkpoint_", "fsdp_train_eval_"))} - {
    "fsdp_train_mfu_ratio",
    "fsdp_train_mfu_float8_ratio",
    "fsdp_tracker_run_info",  # with spec.tracking only
    # training.objective dpo and simpo only (tests/trainer/preference)
    "fsdp_train_reward_chosen",
    "fsdp_train_reward_rejected",
    "fsdp_train_reward_margin",
    "fsdp_train_preference_accuracy_ratio",
    # mixture-of-experts models only (tests/trainer/model/test_experts.py)
    *(m.name for m in MOE_LAYER_METRICS),
}
CHECKPOINT = {
    "fsdp_checkpoint_save_duration_seconds_count",
    "fsdp_checkpoint_last_step",
    "fsdp_checkpoint_last_save_timestamp_seconds",
}


class Scraped(NamedTuple):
    snapshots: list[list[Sample]]  # every scrape taken while the run was up
    run: TrainerRun
    exit_code: int
    started: float  # unix time before the launch


def by_rank(samples: Iterable[Sample], name: str) -> dict[str, float]:
    return {s.labels["local_rank"]: s.value for s in samples if s.name == name}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Scraped:
    """One real run for the whole module, scraped every 50 ms from launch to exit."""
    run = TrainerRun(
        tmp_path_factory.mktemp("metrics-run"),
        max_steps=STEPS,
        overrides={"training": {"evalIntervalSteps": 15, "evalSteps": 2}},
    )
    started = time.time()
    snapshots: list[list[Sample]] = []
    with run:
        deadline = time.monotonic() + 600
        while run.running() and time.monotonic() < deadline:
            samples = run.scrape()
            if samples:
                snapshots.append(samples)
            time.sleep(0.05)
        code = run.wait(timeout=60)
    return Scraped(snapshots, run, code, started)


def training_snapshots(snapshots: list[list[Sample]]) -> list[list[Sample]]:
    """Scrapes after both ranks finished a first step."""
    return [s for s in snapshots if len(by_rank(s, "fsdp_train_step")) == 2]


@pytest.mark.slow
def test_run_succeeds_and_was_scraped_while_training(scraped: Scraped) -> None:
    snapshots = scraped.snapshots
    run = scraped.run
    code = scraped.exit_code
    assert code == 0, run.output()
    steps = {max(by_rank(s, "fsdp_train_step").values()) for s in training_snapshots(snapshots)}
    # Several distinct steps seen means the endpoint answered during training.
    assert len(steps) >= 3, f"steps seen: {sorted(steps)}\n{run.output()}"


@pytest.mark.slow
def test_contract_names_and_labels_on_one_endpoint(scraped: Scraped) -> None:
    snapshots = scraped.snapshots
    last = training_snapshots(snapshots)[-1]
    names = {s.name for s in last}
    assert names >= EXPECTED, f"missing: {sorted(EXPECTED - names)}"
    for s in last:
        if not s.name.startswith("fsdp_"):
            continue
        assert s.labels.keys() >= RANK_LABELS, s
        assert "job" not in s.labels  # Prometheus reserves it for the scrape job
        assert s.labels["job_name"] == "metrics-test"
        assert s.labels["node_rank"] == "0"
    # Both local ranks' series come out of the single endpoint local rank 0 serves.
    for name in EXPECTED:
        assert {s.labels["local_rank"] for s in last if s.name == name} == {"0", "1"}, name
    info = [s for s in last if s.name == "fsdp_trainer_info"]
    assert {s.value for s in info} == {1.0}
    assert {(s.labels["model"], s.labels["sharding_strategy"], s.labels["precision"]) for s in info} == {
        ("tiny", "full", "fp32")
    }
    assert {s.labels["world_size"] for s in info} == {"2"}
    assert {s.labels["logits"] for s in info} == {"full"}  # training.logits' default
    assert {(s.labels["tensor_parallel"], s.labels["context_parallel"]) for s in info} == {("1", "1")}
    assert set(by_rank(last, "fsdp_train_compiled").values()) == {0.0}  # training.compile unset: CPU ranks eager
    for name in ("fsdp_train_float8_linear_layers", "fsdp_train_float8_kept_linear_layers"):
        assert set(by_rank(last, name).values()) == {0.0}, name  # fp32: nothing in float8
    assert set(by_rank(last, "fsdp_train_max_steps").values()) == {STEPS}
    assert set(by_rank(last, "fsdp_train_restart_count").values()) == {0.0}


@pytest.mark.slow
def test_values_move_during_the_run(scraped: Scraped) -> None:
    snapshots = scraped.snapshots
    started = scraped.started
    snaps = training_snapshots(snapshots)
    first, last = snaps[0], snaps[-1]
    for rank in ("0", "1"):
        assert by_rank(last, "fsdp_train_step")[rank] > by_rank(first, "fsdp_train_step")[rank]
        assert by_rank(last, "fsdp_train_tokens_total")[rank] > by_rank(first, "fsdp_train_tokens_total")[rank]
    losses = [by_rank(s, "fsdp_train_loss")["0"] for s in snaps]
    assert all(math.isfinite(v) and v > 0 for v in losses)
    assert len(set(losses)) > 1, "the loss never changed"
    # Per-rank tokens: micro-batch 2 x 64 tokens per step, so step k has 128*k (or
    # 128*(k-1) if the scrape fell between the two updates of one step).
    per_rank_step_tokens = 2 * 64
    for s in snaps:
        for rank, step in by_rank(s, "fsdp_train_step").items():
            tokens = by_rank(s, "fsdp_train_tokens_total")[rank]
            assert tokens in (step * per_rank_step_tokens, (step - 1) * per_rank_step_tokens), (rank, step, tokens)
    # Global tokens/s is the job's: twice one rank's on two ranks.
    tps = by_rank(last, "fsdp_train_tokens_per_second")
    gtps = by_rank(last, "fsdp_train_global_tokens_per_second")
    assert tps["0"] > 0 and gtps["0"] == pytest.approx(2 * tps["0"])
    assert by_rank(last, "fsdp_train_tflops")["0"] > 0
    assert by_rank(last, "fsdp_train_memory_peak_bytes")["0"] > 50 * 2**20
    stamp = by_rank(last, "fsdp_train_last_step_timestamp_seconds")["0"]
    assert started < stamp <= time.time()


@pytest.mark.slow
def test_step_duration_histogram(scraped: Scraped) -> None:
    snapshots = scraped.snapshots
    last = training_snapshots(snapshots)[-1]
    for rank in ("0", "1"):
        buckets = sorted(
            (float(s.labels["le"]), s.value)
            for s in last
            if s.name == "fsdp_train_step_duration_seconds_bucket" and s.labels["local_rank"] == rank
        )
        assert len(buckets) >= 10
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), "buckets must be cumulative"
        assert buckets[-1][0] == math.inf
        count = by_rank(last, "fsdp_train_step_duration_seconds_count")[rank]
        assert buckets[-1][1] == count
        step = by_rank(last, "fsdp_train_step")[rank]
        assert count in (step, step - 1)
        assert 0 < by_rank(last, "fsdp_train_step_duration_seconds_sum")[rank] < 60 * count


@pytest.mark.slow
def test_checkpoint_and_eval_metrics_after_they_happen(scraped: Scraped) -> None:
    snapshots = scraped.snapshots
    started = scraped.started
    after_save = [s for s in training_snapshots(snapshots) if min(by_rank(s, "fsdp_train_step").values()) >= 12]
    assert after_save, "no scrape after the step-10 checkpoint"
    last = after_save[-1]
    assert {s.name for s in last} >= CHECKPOINT
    # Saves every 10 steps (and at the end): the newest one is a multiple of 10, not ahead of training.
    for rank, saved in by_rank(last, "fsdp_checkpoint_last_step").items():
        assert saved in (10.0, 20.0, 30.0) and saved <= by_rank(last, "fsdp_train_step")[rank]
    assert min(by_rank(last, "fsdp_checkpoint_save_duration_seconds_count").values()) >= 1
    saved_at = by_rank(last, "fsdp_checkpoint_last_save_timestamp_seconds")["0"]
    assert started < saved_at <= time.time()
    # Validation at step 15.
    after_eval = [s for s in snapshots if min(by_rank(s, "fsdp_train_step").values(), default=0) >= 17]
    assert after_eval, "no scrape after the step-15 validation"
    eval_loss = by_rank(after_eval[-1], "fsdp_train_eval_loss")["0"]
    assert math.isfinite(eval_loss) and eval_loss > 0
    assert by_rank(after_eval[-1], "fsdp_train_eval_perplexity")["0"] == pytest.approx(math.exp(eval_loss))


@pytest.mark.slow
def test_cpu_run_has_no_gpu_series_no_mfu_and_no_nvml_errors(scraped: Scraped) -> None:
    snapshots = scraped.snapshots
    run = scraped.run
    names = {s.name for snap in snapshots for s in snap}
    assert not {n for n in names if n.startswith("fsdp_gpu_")}
    assert not names & {"fsdp_train_mfu_ratio", "fsdp_train_mfu_float8_ratio"}
    assert set(by_rank(training_snapshots(snapshots)[-1], "fsdp_train_peak_tflops").values()) == {0.0}
    out = run.output()
    assert "NVML" not in out and "nvml" not in out
    assert "Traceback" not in out


# A worker that only exercises the metrics processor: generation 0 counts
# tokens, then rank 1 crashes; torchrun restarts the group and generation 1
# scrapes its own endpoint into a file.
RESTART_WORKER = textwrap.dedent(
    """
    import os, sys, time, urllib.request
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from fsdp_api.trainer_config import TrainerConfig
    from fsdp_trainer.metrics import MetricsProcessor, StepStats
    from fsdp_trainer.metrics.flops import FlopsShape
    FLOPS = FlopsShape(matmul_params=1000, num_layers=2, attention_width=64)

    port, out = int(sys.argv[1]), sys.argv[2]
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # torchrun keeps its store across restarts; without a per-generation prefix
    # gloo may read the dead generation's addresses (Connection refused).
    store = dist.PrefixStore(f"generation-{restart}", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False))
    dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    cfg = TrainerConfig.model_validate({"job": {"name": "restarts"}, "model": {"preset": "tiny"},
                                        "training": {"maxSteps": 100}, "metrics": {"port": port}})
    world = SimpleNamespace(rank=rank, world_size=2, local_rank=local, local_world_size=2, node_rank=0,
                            num_nodes=1, device=torch.device("cpu"))
    proc = MetricsProcessor(cfg, world, 1000, seq_len=16, flops=FLOPS)
    proc.start()
    steps = 7 if restart == 0 else 3
    for step in range(1, steps + 1):
        proc.on_step(StepStats(step=step, loss=1.0, learning_rate=0.1, grad_norm=1.0, tokens=200,
                               step_seconds=0.01, data_seconds=0.0))
    dist.barrier()
    if restart == 0:
        if rank == 1:
            sys.exit(3)
        time.sleep(60)  # torchrun tears the group down when rank 1 fails
    if rank == 0:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r, open(out, "w") as f:
            f.write(r.read().decode())
    dist.barrier()
    proc.close()
    """
)


@pytest.mark.slow
def test_restarted_workers_leave_no_stale_series(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(RESTART_WORKER)
    scrape = tmp_path / "scrape.txt"
    metrics_dir = tmp_path / "metrics-files"
    env = local_env(2, metrics_dir=metrics_dir, threads=1)
    cmd = torchrun_standalone(2, [str(worker), str(free_port()), str(scrape)], max_restarts=1)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    samples = parse_metrics(scrape.read_text())
    assert set(by_rank(samples, "fsdp_train_restart_count").values()) == {1.0}
    # Only generation 1's 3 steps of 100 tokens per rank: nothing of generation 0's 7.
    assert by_rank(samples, "fsdp_train_tokens_total") == {"0": 300.0, "1": 300.0}
    assert set(by_rank(samples, "fsdp_train_step").values()) == {3.0}
    generations = [p.name for p in metrics_dir.glob("fsdp-trainer-metrics/*/restart-*")]
    assert generations == ["restart-1"]


# One process, no torchrun: scrape the endpoint before any step or save, then
# after one of each. A separate interpreter, since multiprocess mode is global.
BASELINE_WORKER = textwrap.dedent(
    """
    import io, sys, urllib.request
    from types import SimpleNamespace
    import torch
    from fsdp_api.trainer_config import TrainerConfig
    from fsdp_trainer.metrics import MetricsProcessor, StepStats
    from fsdp_trainer.metrics.flops import FlopsShape
    FLOPS = FlopsShape(matmul_params=1000, num_layers=2, attention_width=64)

    port = int(sys.argv[1])
    cfg = TrainerConfig.model_validate({"job": {"name": "baseline"}, "model": {"preset": "tiny"},
                                        "training": {"maxSteps": 10}, "metrics": {"port": port}})
    world = SimpleNamespace(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                            num_nodes=1, device=torch.device("cpu"))
    # Its log lines elsewhere: stdout carries only the two scrapes.
    proc = MetricsProcessor(cfg, world, 1000, seq_len=16, flops=FLOPS, stream=io.StringIO())
    proc.start()

    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            return r.read().decode()

    before = scrape()
    proc.on_step(StepStats(step=1, loss=1.0, learning_rate=0.1, grad_norm=1.0, tokens=64,
                           step_seconds=0.2, data_seconds=0.05, wait_seconds=0.03, lateness_seconds=0.01))
    proc.on_checkpoint_saved(1, 1.5)
    proc.set_compiled(True)
    after = scrape()
    proc.close()
    sys.stdout.write(before + "\\n=====\\n" + after)
    """
)


@pytest.mark.slow  # a subprocess that imports torch: about 5 s of CPU, over the unit tier's guard
def test_counters_and_histograms_export_zero_before_their_first_increment(tmp_path: Path) -> None:
    """rate()/increase() need a sample before the first increment, or they never see it.

    Without a 0 baseline a pod's first checkpoint save (often its only one in
    an hour) is invisible to the dashboard's increase(...[1h]), and so is the
    first scrape interval's worth of steps.
    """
    worker = tmp_path / "worker.py"
    worker.write_text(BASELINE_WORKER)
    env = local_env(1, metrics_dir=tmp_path / "metrics-files")
    done = subprocess.run(
        [sys.executable, str(worker), str(free_port())], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    before_text, _, after_text = done.stdout.partition("\n=====\n")
    before, after = parse_metrics(before_text), parse_metrics(after_text)
    zero_then = {
        "fsdp_train_tokens_total": 64.0,
        "fsdp_train_data_wait_seconds_total": 0.05,
        "fsdp_train_rank_wait_seconds_total": 0.03,
        "fsdp_train_rank_lateness_seconds_total": 0.01,
        "fsdp_train_step_duration_seconds_count": 1.0,
        "fsdp_train_step_duration_seconds_sum": 0.2,
        "fsdp_checkpoint_save_duration_seconds_count": 1.0,
        "fsdp_checkpoint_save_duration_seconds_sum": 1.5,
    }
    for name, value in zero_then.items():
        assert by_rank(before, name) == {"0": 0.0}, name
        assert by_rank(after, name) == {"0": pytest.approx(value)}, name
    # Compiled or not is known after the first forward: 0 until then, 1 once inductor compiled.
    assert (by_rank(before, "fsdp_train_compiled"), by_rank(after, "fsdp_train_compiled")) == ({"0": 0.0}, {"0": 1.0})

    def buckets(samples: list[Sample], histogram: str) -> dict[float, float]:
        return {float(s.labels["le"]): s.value for s in samples if s.name == f"{histogram}_bucket"}

    step, save = "fsdp_train_step_duration_seconds", "fsdp_checkpoint_save_duration_seconds"
    for histogram in (step, save):
        assert len(buckets(before, histogram)) >= 10, histogram
        assert set(buckets(before, histogram).values()) == {0.0}, histogram
    # The 0.2 s step lands in the buckets from 0.25 s up, the 1.5 s save from 2.5 s up.
    after_step, after_save = buckets(after, step), buckets(after, save)
    assert (after_step[0.1], after_step[0.25], after_step[math.inf]) == (0.0, 1.0, 1.0)
    assert (after_save[1.0], after_save[2.5], after_save[math.inf]) == (0.0, 1.0, 1.0)


def test_a_scrape_reads_the_gauge_files_last() -> None:
    """So tokens and step counts in one scrape never run ahead of its step gauge (see test_values_move...)."""
    files = ["/m/gauge_livemostrecent_7.db", "/m/histogram_12.db", "/m/counter_12.db", "/m/gauge_livemostrecent_12.db"]
    files += ["/m/counter_7.db", "/m/histogram_7.db"]
    ordered = scrape_order(files)
    assert sorted(ordered) == sorted(files)
    assert [Path(f).name.split("_")[0] for f in ordered] == ["counter"] * 2 + ["histogram"] * 2 + ["gauge"] * 2


def test_a_scrape_passes_over_a_value_file_a_rank_has_only_just_created(tmp_path: Path) -> None:
    """A rank's file, listed before its header is written, failed the scrape with a struct.error traceback."""
    import urllib.request

    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.values import MultiProcessValue

    os_env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    old = {k: os.environ.get(k) for k in os_env}
    os.environ.update(os_env)
    import prometheus_client.metrics as metrics_module

    single_process = metrics_module.values.ValueClass
    try:
        # As a rank writes its values (this process as pid 4242), then back to this process's own kind.
        metrics_module.values.ValueClass = MultiProcessValue(lambda: 4242)
        Counter("fsdp_test_ready_total", "a counter of a rank that has written", registry=CollectorRegistry()).inc(3)
    finally:
        metrics_module.values.ValueClass = single_process
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    (tmp_path / "counter_4243.db").touch()  # the other rank's, created this instant
    server = serve(free_port(), tmp_path, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.stop()
    assert [s.value for s in parse_metrics(text) if s.name == "fsdp_test_ready_total"] == [3.0]


def test_metrics_directory_is_per_agent_instance_and_restart(tmp_path: Path) -> None:
    env = {"FSDP_METRICS_DIR": str(tmp_path), "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "2"}
    path = multiproc_dir(env)
    # The agent (our parent) is named by pid and start time: a restarted
    # container that reuses the pid still gets a fresh directory.
    agent = f"job.{os.getppid()}-{process_start_time(os.getppid())}"
    assert path == tmp_path / "fsdp-trainer-metrics" / agent / "restart-2"
    assert multiproc_dir({**env, "TORCHELASTIC_RESTART_COUNT": "3"}).parent == path.parent


def test_stale_generations_and_dead_agents_are_removed(tmp_path: Path) -> None:
    env = {"FSDP_METRICS_DIR": str(tmp_path), "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "1"}
    current = multiproc_dir(env)
    old_generation = current.parent / "restart-0"
    live_agent = current.parent.parent / f"other.{os.getpid()}-{process_start_time(os.getpid())}" / "restart-0"
    reused_pid = current.parent.parent / f"job.{os.getpid()}-1" / "restart-0"  # same pid, other start time
    for d in (current, old_generation, live_agent, reused_pid):
        d.mkdir(parents=True)
        (d / "counter_1.db").write_bytes(b"")
    assert remove_stale_generations(current) == [old_generation]
    assert remove_dead_agents(current) == [reused_pid.parent]
    assert current.exists() and live_agent.exists()
    assert not old_generation.exists() and not reused_pid.exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_with_log_lines_above_it() -> None:
    cfg = TrainerConfig.model_validate(
        {
            "job": {"name": "bar"},
            "model": {"preset": "tiny"},
            "training": {"maxSteps": 4, "logIntervalSteps": 2},
            "metrics": {"enabled": False},
        }
    )
    world = SimpleNamespace(
        rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1, device=torch.device("cpu")
    )
    term = _Terminal()
    proc = MetricsProcessor(cfg, world, 1000, seq_len=16, flops=FLOPS, stream=term)  # type: ignore[arg-type]
    for step in range(1, 5):
        proc.on_step(StepStats(step, 2.0, 1e-3, 1.0, tokens=64, step_seconds=0.25, data_seconds=0.0))
    proc.close()
    out = term.getvalue()
    assert "\r\x1b[2K[#######" in out  # step 1 of 4: a quarter of the 30-character bar
    assert "\r\x1b[2K[" + "#" * 30 + "] 4/4 100%" in out
    # Log lines replace the bar's line and end with a newline; the bar comes back on the next step.
    assert "\r\x1b[2Kstep 2/4 | loss 2.0000" in out
    lines = [line.rpartition("\x1b[2K")[2] for line in out.split("\n")]
    assert [line.split(" |")[0] for line in lines[:3]] == ["step 1/4", "step 2/4", "step 4/4"]
    assert lines[3].startswith("summary: steps 4-4")


@pytest.mark.slow  # a 2-rank trainer run (over the unit tier's limit, tests/slow_guard.py)
def test_endpoint_serves_the_final_values_while_lingering(tmp_path: Path) -> None:
    # TrainerRun sets FSDP_METRICS_LINGER_SECONDS=3: after the last step the
    # endpoint must still answer with the final step and the last checkpoint.
    steps = 6
    with TrainerRun(tmp_path, max_steps=steps, overrides={"checkpoint": {"intervalSteps": 3}}) as run:
        deadline = time.monotonic() + 300
        while "serving the final values" not in run.output() and time.monotonic() < deadline:
            assert run.running(), run.output()
            time.sleep(0.1)
        assert "serving the final values for 3 s more" in run.output(), run.output()
        samples = run.scrape()
        assert samples is not None, "the endpoint closed before the linger period"
        final = {(s.name, s.labels["local_rank"]): s.value for s in samples if "local_rank" in s.labels}
        assert final[("fsdp_train_step", "0")] == steps and final[("fsdp_train_step", "1")] == steps
        assert final[("fsdp_checkpoint_last_step", "0")] == steps
        assert run.wait(120) == 0


def test_the_summary_line_reads_back_with_its_patterns() -> None:
    """The benchmarks parse the end-of-run line with the patterns that sit beside its format."""
    from fsdp_trainer.metrics.logline import (
        MFU_PATTERN,
        PEAK_MEMORY_PATTERN,
        SUMMARY_PATTERN,
        RunSummary,
        parse_bytes,
        summary_line,
    )

    run = RunSummary(4, 15, 0.893, 0.896, 27510.0, 27510.0, 226.0, 0.229, 23 * 2**30 + 2**27)
    line = f"step 15/15 | loss 7.0\n{summary_line(run)}\n"
    m = SUMMARY_PATTERN.search(line)
    assert m is not None and (m["n"], m["seconds"], m["cpu"]) == ("12", "0.893", "0.896")
    # Why the count starts at step 4, said on the line itself.
    assert "0.896 s CPU of rank 0; this process's first 3 steps, its warm-up, not counted) |" in m[0]
    assert MFU_PATTERN.search(m[0])["mfu"] == "22.9"
    assert PEAK_MEMORY_PATTERN.search(m[0])["mem"] == "23.1 GiB"
    # and back to bytes, to the 0.1 GiB it was printed with
    assert abs(parse_bytes("23.1 GiB") - (23 * 2**30 + 2**27)) < 0.05 * 2**30
    assert (parse_bytes("922.6 MiB"), parse_bytes("512 B")) == (922.6 * 2**20, 512.0)
    no_mfu = summary_line(RunSummary(4, 15, 1.0, 1.0, 1.0, 1.0, 1.0, None, 2**20))
    assert MFU_PATTERN.search(no_mfu) is None and SUMMARY_PATTERN.search(no_mfu)
