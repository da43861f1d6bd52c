"""Run an FSDPTraining on this machine: torchrun on the CPU, no cluster, no GPU.

This is the embedded default (``make run``). The trainer gets exactly the
``train.yaml`` the operator would put in the job's ConfigMap, with three local
adjustments: the checkpoint directory points into ``runs/<name>/`` so a second
run resumes from it, the metrics endpoint listens on loopback (on a free port
if the spec's is taken), and ``--steps`` may override ``training.maxSteps``.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
from pathlib import Path

from fsdp_api import FSDPTraining
from fsdp_api.documents import InputError, load_one
from fsdp_api.launch import free_port, local_env, port_is_free, torchrun_standalone, trainer_program
from fsdp_api.trainer_config import TrainerConfig


def local_config(training: FSDPTraining, output_dir: Path, steps: int | None) -> TrainerConfig:
    """The operator's TrainerConfig with the local adjustments (see the module docstring)."""
    cfg = TrainerConfig.from_spec(training.spec, training.name, training.metadata.namespace or "default")
    data = cfg.to_dict()
    data["checkpoint"]["dir"] = str((output_dir / "checkpoints").resolve())
    if steps is not None:
        data["training"]["maxSteps"] = steps
        warmup = data["training"].get("warmupSteps")
        if warmup is not None and warmup >= steps:
            # Keeps the spec's rule (warmup < maxSteps) for a short override.
            data["training"]["warmupSteps"] = steps // 10
    if data["metrics"].get("enabled", True) and not port_is_free(data["metrics"]["port"]):
        data["metrics"]["port"] = free_port()
    return TrainerConfig.model_validate(data)


def run_local(spec_file: str | Path, nproc: int = 2, output_dir: Path | None = None, steps: int | None = None) -> int:
    """Train ``spec_file``'s FSDPTraining with ``nproc`` CPU ranks; returns torchrun's exit code.

    ``output_dir`` (default ``runs/<name>``) holds ``train.yaml`` and
    ``checkpoints/``; running again with the same directory resumes.
    """
    if nproc < 1:
        raise InputError("nproc must be at least 1")
    if steps is not None and steps < 1:
        raise InputError("steps must be at least 1")
    training = load_one(str(spec_file))
    out = Path(output_dir) if output_dir is not None else Path("runs") / training.name
    out.mkdir(parents=True, exist_ok=True)
    cfg = local_config(training, out, steps)
    config_path = out / "train.yaml"
    config_path.write_text(cfg.to_yaml())

    checkpoints = Path(cfg.checkpoint.dir)
    resuming = cfg.checkpoint.resume == "auto" and checkpoints.is_dir() and any(checkpoints.iterdir())
    print(f"run-local: {training.name}: {nproc} CPU ranks (gloo), {cfg.training.max_steps} steps", flush=True)
    print(f"run-local: config {config_path}", flush=True)
    print(f"run-local: checkpoints {checkpoints}" + (" (resuming from them)" if resuming else ""), flush=True)
    if cfg.metrics.enabled:
        print(f"run-local: metrics at http://127.0.0.1:{cfg.metrics.port}/metrics", flush=True)

    with tempfile.TemporaryDirectory(prefix="fsdp-local-metrics-") as metrics_dir:
        env = local_env(nproc, metrics_dir=metrics_dir)
        proc = subprocess.Popen(torchrun_standalone(nproc, trainer_program(config_path)), env=env)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # torchrun got the same SIGINT from the terminal; give it time to stop its workers.
            proc.send_signal(signal.SIGINT)
            try:
                return proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
