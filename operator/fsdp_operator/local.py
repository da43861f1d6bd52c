"""Run an FSDPTraining on this machine: torchrun on the CPU, no cluster, no GPU.

This is the embedded default (``make run``). The trainer gets exactly the
``train.yaml`` the operator would put in the job's ConfigMap, with three local
adjustments: the checkpoint directory points into ``runs/<name>/`` so a second
run resumes from it, the metrics endpoint listens on loopback (on a free port
if the spec's is taken), and ``--steps`` may override ``training.maxSteps``.
``spec.env`` reaches the ranks as it reaches the pods: literal values as
written; values the cluster would fill (a Secret's, a ConfigMap's, the pod's
own fields) from this shell's environment when it has them (``local_spec_env``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from fsdp_api import FSDPTraining
from fsdp_api.checkpoint_layout import complete_checkpoints, step_dir_name
from fsdp_api.contract import FORWARDED_SIGNALS, signal_exit_code
from fsdp_api.documents import InputError, load_one
from fsdp_api.launch import checked_launch, torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env, sigterm_when_parent_dies
from fsdp_api.parallel_plan import ParallelPlan
from fsdp_api.ports import free_port, port_is_free
from fsdp_api.rules import format_errors
from fsdp_api.trainer_config import TrainerConfig
from pydantic import ValidationError

LOCK_FILE = ".run-local.lock"
# How long the ranks get to save a checkpoint and exit after a signal.
STOP_GRACE_SECONDS = 120.0
# prctl(2): the signal a process gets when the thread that forked it dies.


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
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as e:
        # Only the local adjustments (--steps) can break a spec that loaded.
        raise InputError("; ".join(format_errors(e, model=TrainerConfig))) from None


def local_spec_env(training: FSDPTraining, shell: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``spec.env`` for a run on this machine: the variables, and one note per kind of source.

    A literal value is the spec's, as in the pod (following docs/s3-checkpoints.md
    locally, AWS_ENDPOINT_URL_S3 must send the trainer to the spec's endpoint, not
    to AWS). A value the cluster fills (valueFrom) has no cluster here: the
    shell's value when it has one, else unset, and said either way.
    """
    env: dict[str, str] = {}
    literal, from_shell, missing = [], [], []
    for var in training.spec.env:
        if var.value is not None:
            env[var.name] = var.value
            literal.append(var.name)
        elif var.name in shell:
            env[var.name] = shell[var.name]
            from_shell.append(var.name)
        else:
            missing.append(var.name)
    notes = []
    if literal:
        notes.append(f"{', '.join(literal)} as the spec sets {'it' if len(literal) == 1 else 'them'}")
    if from_shell:
        notes.append(f"{', '.join(from_shell)} (valueFrom in the cluster) from this shell")
    if missing:
        them = "it" if len(missing) == 1 else "them"
        where = "(valueFrom in the cluster) not in this shell"
        notes.append(f"{', '.join(missing)} {where}: unset; export {them} to pass {them}")
    return env, notes


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
    if training.spec.runs_own_script:
        raise InputError(
            f"{training.name}: spec.command runs your own script, and run-local runs the built-in trainer; "
            "run the script with torchrun --standalone instead (docs/your-own-script.md#run-it-on-your-machine)"
        )
    out = Path(output_dir) if output_dir is not None else Path("runs") / training.name
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--output-dir {out}: cannot create it: {e.strerror or e}") from None
    with run_lock(out) as lock:
        cfg = local_config(training, out, steps)
        check_ranks(cfg, nproc)
        config_path = out / "train.yaml"
        try:
            config_path.write_text(cfg.to_yaml())
        except OSError as e:
            raise InputError(f"--output-dir {out}: cannot write {config_path.name}: {e.strerror or e}") from None

        checkpoints = Path(cfg.checkpoint.dir)
        resuming = cfg.checkpoint.resume == "auto" and checkpoints.is_dir() and any(checkpoints.iterdir())
        cluster = training.spec.world_size()
        print(
            f"run-local: {training.name}: {nproc} CPU ranks (gloo; --nproc, where the cluster runs {cluster}), "
            f"{cfg.training.max_steps} steps",
            flush=True,
        )
        print(f"run-local: config {config_path}", flush=True)
        print(f"run-local: checkpoints {checkpoints}" + (" (resuming from them)" if resuming else ""), flush=True)
        newest = newest_step(checkpoints) if resuming else None
        if newest is not None and newest >= cfg.training.max_steps:
            # The trainer would resume at maxSteps and stop without a step: say so instead of starting it.
            print(
                f"run-local: {training.name}: nothing to train: the newest checkpoint in {checkpoints} is step "
                f"{newest}, and maxSteps is {cfg.training.max_steps}; --steps N (above {newest}) trains on from it, "
                "another --output-dir starts over",
                flush=True,
            )
            return 0
        if cfg.metrics.enabled:
            # Rank 0 binds the port once the model is built, tens of seconds from now: said so,
            # and its own line ("metrics: serving ...") is the one that says it is up.
            url = f"http://127.0.0.1:{cfg.metrics.port}/metrics"
            print(f"run-local: metrics at {url} once rank 0 says 'metrics: serving'", flush=True)
        spec_env, notes = local_spec_env(training, os.environ)
        for note in notes:
            print(f"run-local: spec.env: {note}", flush=True)

        with tempfile.TemporaryDirectory(prefix="fsdp-local-metrics-") as metrics_dir:
            env = local_env(nproc, metrics_dir=metrics_dir, base={**os.environ, **spec_env})
            # The check runs first, as in the pods: a mistake is one line and exit 2, not a traceback per rank.
            launch = torchrun_standalone(nproc, trainer_program(config_path))
            cmd = checked_launch(config_path, launch, python=launch[0])
            code = run_process_group(cmd, env, keep_fds=(lock,))
        done = newest_step(checkpoints)
        if code == 0 and done is not None:
            print(
                f"run-local: {training.name}: done at step {done}: checkpoint {checkpoints / step_dir_name(done)}; "
                f"as a Hugging Face model: fsdp-train export --checkpoint {checkpoints} --output {out / 'hf-model'}",
                flush=True,
            )
        return code


def newest_step(root: Path) -> int | None:
    """The step of the newest complete checkpoint under ``root``, if any."""
    found = complete_checkpoints(root)
    return found[-1][0] if found else None


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[int]:
    """Hold ``out`` for this run: two runs in one directory would write the same checkpoints.

    An advisory lock (flock) on a file in the directory, released by the
    kernel however this process ends, so a crashed run never leaves it held.
    Yields the locked descriptor: the launch inherits it (``run_process_group``),
    so the directory stays locked while anything of the run is alive.
    """
    path = out / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise InputError(f"--output-dir {out}: cannot write {LOCK_FILE}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise InputError(
                f"{out} is in use by another run-local (pid {holder}); wait for it or choose another --output-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)


def run_process_group(
    cmd: list[str], env: dict[str, str], grace_seconds: float = STOP_GRACE_SECONDS, keep_fds: tuple[int, ...] = ()
) -> int:
    """Run ``cmd`` in a process group of its own; a signal to us goes to the whole group.

    torchrun and its ranks share the group, so SIGTERM (or Ctrl-C) reaches every
    rank, which saves a checkpoint and exits; after ``grace_seconds`` whatever
    is left is killed. Nothing outlives this call. Returns torchrun's exit code,
    or 128 + the signal's number when a signal stopped the run. Which signals
    are passed on, and those codes, are the contract's, as in the pods.
    """
    stop_with_us = sigterm_when_parent_dies(os.getpid())
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, pass_fds=keep_fds, preexec_fn=stop_with_us)
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        deadline: float | None = None
        while proc.poll() is None:
            if received and deadline is None:
                deadline = time.monotonic() + grace_seconds
            if deadline is not None and time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        # A rank that outlived torchrun must not keep training unseen.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return signal_exit_code(received[0]) if received else proc.returncode


def check_ranks(cfg: TrainerConfig, nproc: int) -> None:
    """The mesh of ``nproc`` local ranks, refused here with the --nproc that builds it (the check would not say)."""
    plan = ParallelPlan.of(cfg.fsdp, cfg.parallelism, nproc, nproc)
    problems = plan.errors()
    if not problems:
        return
    hint = ""
    if nproc % plan.non_dp_size:
        fitting = plan.non_dp_size * -(-nproc // plan.non_dp_size)
        hint = f"; run-local: --nproc {fitting} (a multiple of pipeline x tp x cp = {plan.pp} x {plan.tp} x {plan.cp})"
    raise InputError(f"{problems[0]}{hint}")
