"""``fsdp-train check``: the whole configuration, checked once, before torchrun starts a rank.

The ranks check it again (they need what ``prepare`` builds), but a mistake
found there is reported by every rank and then wrapped by torchrun's elastic
agent in a ChildFailedError traceback. Run first, in the container's own
process, the check prints only the ``field: message`` lines and exits 2, and
the pod's termination message (FallbackToLogsOnError) carries exactly those
lines to the operator. With a command after ``--``, a passing check is
replaced by that command (exec: same process, signals and exit code); when
that command is torchrun, its --nnodes and --nproc-per-node are the ones
checked, and the check stays as torchrun's parent instead
(``supervisor.py``): torchrun exits 1 on SIGTERM whatever its ranks did, and
the container must exit 143 when they saved and stopped.

    fsdp-train check --config train.yaml -- torchrun --nnodes=2 --nproc-per-node=8 ...
    fsdp-train check --config train.yaml --nnodes 2:4 --nproc-per-node 8
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fsdp_api.contract import CHECK_COMMAND as COMMAND
from fsdp_api.contract import ENV_TRAINER_FAULT
from fsdp_api.launch import HOST_RENDEZVOUS_FLAG

from .errors import ConfigError
from .faults import armed_fault
from .rendezvous_host import hosted_here
from .supervisor import stop_on_signals_before_the_launch, supervise

if TYPE_CHECKING:
    from fsdp_api.trainer_config import TrainerConfig

    from .parallel.distributed import WorldInfo


def node_counts(nnodes: str) -> list[int]:
    """torchrun's --nnodes value (``N`` or ``MIN:MAX``) as the node counts the job may run with."""
    try:
        low, _, high = nnodes.partition(":")
        first, last = int(low), int(high or low)
    except ValueError:
        raise ConfigError([f"--nnodes: {nnodes!r} is not N or MIN:MAX"]) from None
    if first < 1 or last < first:
        raise ConfigError([f"--nnodes: {nnodes!r} is not N or MIN:MAX with 1 <= MIN <= MAX"])
    return list(range(first, last + 1))


def processes_per_node(value: str) -> int:
    """torchrun's --nproc-per-node: a count, or ``gpu``/``cpu``/``auto`` resolved on this node as torchrun does."""
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value in ("gpu", "cpu", "auto"):
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if value == "gpu" and gpus == 0:
            raise ConfigError(["--nproc-per-node: gpu, but this node has no GPU"])
        return gpus if gpus and value != "cpu" else os.cpu_count() or 1
    raise ConfigError([f"--nproc-per-node: {value!r} is not a positive count, gpu, cpu or auto"])


def too_few_documents(cfg: TrainerConfig, data_ranks: int) -> list[str]:
    """Local files with fewer training documents than data-parallel ranks: one line here, not a rank's traceback.

    Each data-parallel rank reads its own documents (``data.sources``), after
    the held-out slice for validation: a rank left with none cannot train. Counted
    only as far as that needs (``files.count_documents``); hub datasets are not
    opened here.
    """
    if not cfg.data.path or data_ranks < 2:
        return []
    from .data import files
    from .data.sources import holdout_mask

    try:
        found = files.resolve(cfg.data.path)
    except files.DataFilesError:
        return []  # said by the data check already
    enough = 2 * data_ranks + 64  # beyond it, the held-out ~2% cannot leave fewer than data_ranks
    docs = files.count_documents(found, enough)
    if docs is None or docs >= enough:
        return []
    held = int(holdout_mask(docs).sum()) if cfg.data.validation_split is None else 0
    if docs - held >= data_ranks:
        return []
    unit = "paragraphs" if found.builder == "text" else "rows"
    return [
        f"data.path: {cfg.data.path}: {docs - held} training documents ({docs} {unit}, {held} held out for "
        f"validation) for {data_ranks} data-parallel ranks: each rank needs at least one; add documents or "
        "train on fewer ranks"
    ]


def check(config: str, nnodes: str, nproc_per_node: int) -> str:
    """Check ``config`` for every world size the launch allows; the one-line summary, or ConfigError."""
    from .build import prepare
    from .checkpoint.compatibility import resume_problems
    from .checkpoint.ownership import directory_conflicts
    from .config import load_config
    from .model.architecture import count_parameters
    from .model.lora import count_trainable
    from .parallel.distributed import world_from_env
    from .parallel.plan import ParallelPlan
    from .tracking import tracker_problems

    counts = node_counts(nnodes)
    armed_fault()  # a malformed value: one line here, not a traceback in every rank at every step
    cfg = load_config(config)

    def world(nodes: int) -> WorldInfo:
        ranks = nodes * nproc_per_node
        env = {
            "RANK": "0",
            "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(nproc_per_node),
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": str(nodes),
        }
        return world_from_env(env)

    # The model, data and checkpoint checks do not depend on the world size:
    # the whole check runs once, the mesh check for each size an elastic job may reach.
    prepared = prepare(cfg, world(counts[0]))
    # Once here, before torchrun, rather than in every rank on every restart (the
    # ranks check both again: resume_candidates, check_candidates).
    errors = directory_conflicts(Path(cfg.checkpoint.dir), cfg.checkpoint.resume, cfg.job)
    if not errors and cfg.checkpoint.resume == "auto":
        errors = resume_problems(Path(cfg.checkpoint.dir), prepared.model, cfg.peft)
    # Asked once per pod, before torchrun: wrong credentials or a missing bucket are one line here.
    warnings: list[str] = []
    if cfg.checkpoint.remote is not None:
        from .checkpoint.remote_store import prefix_taken, probe

        remote_errors, remote_warnings = probe(cfg.checkpoint.remote)
        taken = None if remote_errors else prefix_taken(cfg.checkpoint.remote, cfg.job)
        errors += [f"checkpoint.remote: {e}" for e in remote_errors + ([taken] if taken else [])]
        warnings += [f"checkpoint.remote: {w}" for w in remote_warnings]
    # Asked once per pod, before torchrun: a wrong tracker address is one line here.
    tracker_errors, tracker_warnings = tracker_problems(cfg, os.environ)
    errors += tracker_errors
    for warning in warnings + tracker_warnings:
        print(f"fsdp-train: warning: {warning}", file=sys.stderr, flush=True)
    for nodes in counts[1:]:
        w = world(nodes)
        errors += [
            f"{e} (with {nodes} nodes)"
            for e in ParallelPlan.of(cfg.fsdp, cfg.parallelism, w.world_size, nproc_per_node).errors()
        ]
    widest = ParallelPlan.of(cfg.fsdp, cfg.parallelism, counts[-1] * nproc_per_node, nproc_per_node)
    errors += too_few_documents(prepared.cfg, widest.dp_size)
    if errors:
        raise ConfigError(errors)
    sizes = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    params = f"{count_parameters(prepared.model):,} parameters"
    if prepared.adapted:
        params += f" ({count_trainable(prepared.model):,} trainable: LoRA on {len(prepared.adapted)} modules)"
    return (
        f"configuration ok: {type(prepared.model).__name__}, {params}, "
        f"seqLen {prepared.seq_len}, {sizes} node(s) x {nproc_per_node} process(es)"
    )


def torchrun_arguments(command: list[str]) -> list[str] | None:
    """The arguments of a torchrun command line (``torchrun ...`` or ``python -m torch.distributed.run ...``)."""
    if command and Path(command[0]).name == "torchrun":
        return command[1:]
    if command[1:3] == ["-m", "torch.distributed.run"]:
        return command[3:]
    return None


def launch_shape(command: list[str]) -> tuple[str | None, str | None]:
    """--nnodes and --nproc-per-node of a torchrun launch, read by torchrun's own parser; (None, None) otherwise.

    The pods' command names the node count once, in torchrun's flags (the
    kustomize overlay patches only that), and the check follows it.
    """
    args = torchrun_arguments(command)
    if args is None:
        return None, None
    from torch.distributed.run import get_args_parser

    parsed, _ = get_args_parser().parse_known_args(args)
    return str(parsed.nnodes), str(parsed.nproc_per_node)


def check_main(argv: list[str]) -> int:
    stop_on_signals_before_the_launch()  # first: see stop_before_the_launch
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog=f"fsdp-train {COMMAND}",
        description="Check train.yaml as torchrun would run it; then run the command after --, if any.",
    )
    parser.add_argument("--config", required=True, help="train.yaml (the job's ConfigMap)")
    parser.add_argument("--nnodes", help="N or MIN:MAX (default: the torchrun command's, else 1)")
    parser.add_argument("--nproc-per-node", help="N, gpu, cpu or auto (default: the torchrun command's, else 1)")
    parser.add_argument(
        HOST_RENDEZVOUS_FLAG,
        dest="host_rendezvous_if",
        metavar="VAR=VALUE",
        help="where VAR has VALUE, this pod hosts torchrun's rendezvous at its own address (rendezvous_host.py)",
    )
    args = parser.parse_args(argv)
    nnodes, nproc = launch_shape(command)
    nnodes, nproc = args.nnodes or nnodes or "1", args.nproc_per_node or nproc or "1"
    summary = check(args.config, nnodes, processes_per_node(nproc))
    print(f"fsdp-train: {summary}", file=sys.stderr, flush=True)
    if fault := armed_fault():  # a test hook: say so once, where a person reading the log looks first
        print(f"fsdp-train: {ENV_TRAINER_FAULT} is set: {fault.describe()}", file=sys.stderr, flush=True)
    if not command:
        return 0
    if args.host_rendezvous_if and (torchrun := torchrun_arguments(command)) is not None:
        launcher = command[: len(command) - len(torchrun)]
        torchrun, said = hosted_here(torchrun, args.host_rendezvous_if, os.environ)
        command = [*launcher, *torchrun]
        if said:
            print(f"fsdp-train: {said}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    try:
        if torchrun_arguments(command) is not None:
            return supervise(command, processes_per_node(nproc))
        os.execvp(command[0], command)
    except OSError as e:
        print(f"fsdp-train: cannot run {command[0]}: {e.strerror or e}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process
