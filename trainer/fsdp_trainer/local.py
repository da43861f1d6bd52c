"""Run an FSDPTraining on this machine: torchrun on the CPU, no cluster, no GPU.

This is the embedded default (``make run``). The trainer gets exactly the
``train.yaml`` the operator would put in the job's ConfigMap, with three local
adjustments: the checkpoint directory points into ``runs/<name>/`` so a second
run resumes from it, the metrics endpoint listens on loopback (on a free port
if the spec's is taken), and ``--steps`` may override ``training.maxSteps``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from fsdp_operator.api import FSDPTraining, format_errors
from fsdp_operator.api.trainer_config import TrainerConfig

# Read by the metrics processor of the workers.
METRICS_ADDR_ENV = "FSDP_METRICS_ADDR"
METRICS_DIR_ENV = "FSDP_METRICS_DIR"


class LocalRunError(ValueError):
    """The spec file cannot be run locally; the message says why."""


def load_training(spec_file: Path) -> FSDPTraining:
    """The first FSDPTraining document of a YAML file, validated like ``kubectl apply``."""
    from pydantic import ValidationError

    try:
        docs = [d for d in yaml.safe_load_all(spec_file.read_text()) if d]
    except (OSError, yaml.YAMLError) as e:
        raise LocalRunError(f"{spec_file}: {e}") from e
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == "FSDPTraining"]
    if not found:
        raise LocalRunError(f"{spec_file}: no FSDPTraining document")
    try:
        training = FSDPTraining.model_validate(found[0])
    except ValidationError as e:
        lines = "\n".join(f"  {line}" for line in format_errors(e))
        raise LocalRunError(f"{spec_file}: invalid FSDPTraining:\n{lines}") from e
    if not training.metadata.name:
        raise LocalRunError(f"{spec_file}: metadata.name is required")
    return training


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    if data["metrics"].get("enabled", True):
        port = data["metrics"].get("port", 9402)
        if not _port_free(port):
            data["metrics"]["port"] = _free_port()
    return TrainerConfig.model_validate(data)


def torchrun_command(config_path: Path, nproc: int) -> list[str]:
    # The interpreter's own torch.distributed.run: no reliance on PATH.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "fsdp_trainer",
        "--config",
        str(config_path),
    ]


def run_local(spec_file: Path, nproc: int = 2, output_dir: Path | None = None, steps: int | None = None) -> int:
    """Train ``spec_file``'s FSDPTraining with ``nproc`` CPU ranks; returns torchrun's exit code.

    ``output_dir`` (default ``runs/<name>``) holds ``train.yaml`` and
    ``checkpoints/``; running again with the same directory resumes.
    """
    if nproc < 1:
        raise LocalRunError("nproc must be at least 1")
    if steps is not None and steps < 1:
        raise LocalRunError("steps must be at least 1")
    training = load_training(Path(spec_file))
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

    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the local run is the CPU path, even on a GPU workstation
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env[METRICS_ADDR_ENV] = "127.0.0.1"
    with tempfile.TemporaryDirectory(prefix="fsdp-local-metrics-") as metrics_dir:
        env[METRICS_DIR_ENV] = metrics_dir
        proc = subprocess.Popen(torchrun_command(config_path, nproc), env=env)
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
