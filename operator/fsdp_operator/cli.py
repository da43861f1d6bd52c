"""``fsdp-operator``: the CRD, the renderer and the API checks from a shell, plus the operator itself.

User errors (a missing file, bad YAML, an invalid FSDPTraining) print one
clear message per problem and exit 1, never a traceback. ``run`` imports the
operator lazily, so ``validate`` and ``render`` work without kopf's event
loop; ``run-local`` starts the trainer as a separate process (torchrun), so
nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from fsdp_api import KIND, FSDPTraining
from fsdp_api.documents import InputError, load_trainings

if TYPE_CHECKING:
    from fsdp_api.memory_plan import MemoryPlan

from . import __version__

EXIT_OK = 0
EXIT_INVALID = 1


# --- output ------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (train.yaml reads as YAML), and no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(objects: Sequence[Any]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=10_000)


# --- subcommands ---------------------------------------------------------------


def cmd_crd(args: argparse.Namespace) -> int:
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return EXIT_OK


def cmd_docs(args: argparse.Namespace) -> int:
    from .docs import api_reference

    sys.stdout.write(api_reference())
    return EXIT_OK


def _display_name(t: FSDPTraining) -> str:
    return t.metadata.name or f"{t.metadata.generate_name}*"


def memory_problems(path: str, trainings: Sequence[FSDPTraining]) -> list[str]:
    """One line per training whose memory plan says it does not fit its GPUs."""
    from fsdp_api.memory_plan import plan_memory

    lines = []
    for t in trainings:
        plan = plan_memory(t.spec)
        if plan.fits is False:
            lines.append(f"{path}: {KIND} {_display_name(t)!r}: {plan.summary()}")
    return lines


def cmd_validate(args: argparse.Namespace) -> int:
    from fsdp_api.model_files import check_local_model

    trainings = load_trainings(args.file, sys.stdout)
    if trainings is None:
        return EXIT_INVALID
    problems = [f"{args.file}: {p}" for t in trainings for p in check_local_model(t.spec)]
    if problems:
        print("\n".join(problems))
        return EXIT_INVALID
    if args.memory != "off":
        memory = memory_problems(args.file, trainings)
        if memory and args.memory == "refuse":
            print("\n".join(memory))
            return EXIT_INVALID
        for line in memory:
            print(f"warning: {line}", file=sys.stderr)
    for t in trainings:
        print(f"{args.file}: {KIND} {_display_name(t)!r} is valid", file=sys.stderr)
    return EXIT_OK


def plan_table(plan: MemoryPlan) -> str:
    """The plan as an aligned text table: component, GiB per GPU, note; then total, GPU, fits."""
    from fsdp_api.memory_plan import gib

    if plan.estimate is None:
        return f"  {plan.summary()}\n"
    rows = [(c.name, gib(c.bytes), c.note) for c in plan.estimate.components]
    rows.append(("total", gib(plan.estimate.total_bytes), f"peak: {plan.estimate.peak_phase}"))
    if plan.estimate.host:
        rows.append(("host (cpuOffload)", gib(plan.estimate.host), "CPU memory per process"))
    gpu = plan.gpu
    rows.append(
        ("GPU memory", gib(gpu.gpu_memory_bytes) if gpu else "-", f"{gpu.name} ({gpu.gpu_model})" if gpu else "")
    )
    fits = {True: "yes", False: "no", None: "-"}[plan.fits]
    rows.append(("fits", fits, plan.gpu_note))
    if plan.suggestion:
        rows.append(("suggestion", "", plan.suggestion))
    width = max(len(r[0]) for r in rows)
    lines = [f"  {'component':<{width}}  {'GiB/GPU':>8}  note"]
    lines += [f"  {name:<{width}}  {value:>8}  {note}".rstrip() for name, value, note in rows]
    return "\n".join(lines) + "\n"


def cmd_plan(args: argparse.Namespace) -> int:
    from fsdp_api.memory_plan import plan_memory

    trainings = load_trainings(args.file, sys.stderr)
    if trainings is None:
        return EXIT_INVALID
    plans = [(t, plan_memory(t.spec)) for t in trainings]
    if args.output == "json":
        items = [{"name": _display_name(t), **plan.to_dict()} for t, plan in plans]
        print(json.dumps(items, indent=2))
        return EXIT_OK
    for t, plan in plans:
        ranks = f"{plan.world_size} rank" + ("s" if plan.world_size != 1 else "")
        print(f"{KIND} {_display_name(t)!r} ({ranks}): {plan.summary()}")
        sys.stdout.write(plan_table(plan))
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    from .render import render

    trainings = load_trainings(args.file, sys.stderr)
    if trainings is None:
        return EXIT_INVALID
    objects: list[dict[str, Any]] = []
    for t in trainings:
        if not t.metadata.name:
            raise InputError(f"{args.file}: every {KIND} needs metadata.name to be rendered")
        if args.namespace:
            t.metadata.namespace = args.namespace
        objects += render(t)
    if args.output == "json":
        # A v1 List, which `kubectl apply -f` accepts like multi-document YAML.
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    else:
        sys.stdout.write(dump_yaml(objects))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from .controller.main import run_operator

    run_operator(
        namespaces=args.namespace or None,
        all_namespaces=args.all_namespaces,
        liveness_endpoint=args.liveness,
        metrics_port=args.metrics_port,
        peering_name=args.peering,
        standalone=args.standalone,
        priority=args.priority,
        scrape_interval=args.scrape_interval,
        verbose=args.verbose,
    )
    return EXIT_OK


def cmd_run_local(args: argparse.Namespace) -> int:
    # Checked here first so a bad file gets the same messages as `validate`.
    trainings = load_trainings(args.file, sys.stderr)
    if trainings is None:
        return EXIT_INVALID
    if len(trainings) != 1:
        raise InputError(f"{args.file}: run-local runs one {KIND}, the file has {len(trainings)}")
    from .local import run_local

    return run_local(Path(args.file), nproc=args.nproc, output_dir=args.output_dir, steps=args.steps)


# --- argument parsing --------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fsdp-operator",
        description="FSDPTraining (training.fsdp.dev/v1alpha1): CRD, renderer, validation and the kopf operator.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("crd", help="print the FSDPTraining CustomResourceDefinition (YAML)")
    s.set_defaults(func=cmd_crd)

    s = sub.add_parser("docs", help="print the API reference (Markdown)")
    s.set_defaults(func=cmd_docs)

    s = sub.add_parser("validate", help="check FSDPTraining documents; print 'path: message' per problem")
    s.add_argument("-f", "--file", required=True, help="YAML file with one or more FSDPTrainings ('-': stdin)")
    s.add_argument(
        "--memory",
        choices=("warn", "refuse", "off"),
        default="warn",
        help="a training whose memory plan does not fit its GPUs: warn on stderr (default), refuse (exit 1), off",
    )
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("plan", help="print the per-GPU memory plan of each FSDPTraining and whether it fits")
    s.add_argument("-f", "--file", required=True, help="YAML file with one or more FSDPTrainings ('-': stdin)")
    s.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format (default: text)")
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("render", help="print the objects the operator would create (no cluster needed)")
    s.add_argument("-f", "--file", required=True, help="YAML file with one or more FSDPTrainings ('-': stdin)")
    s.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format (default: yaml)")
    s.add_argument("--namespace", "-n", help="namespace of the rendered objects (default: the file's, or default)")
    s.set_defaults(func=cmd_render)

    s = sub.add_parser("run", help="run the operator against the current kubeconfig or in-cluster config")
    scope = s.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="serve this namespace (repeatable; globs work)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace")
    s.add_argument("--liveness", metavar="URL", help="kopf's liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    s.add_argument("--metrics-port", type=_port, metavar="N", help="serve the operator's Prometheus metrics on port N")
    s.add_argument("--peering", metavar="NAME", help="kopf peering object name (default: fsdp-operator)")
    s.add_argument("--standalone", action="store_true", help="no peering: do not pause for other instances")
    s.add_argument("--priority", type=int, help="peering priority (default: $FSDP_OPERATOR_PRIORITY or 0)")
    s.add_argument(
        "--scrape-interval", type=float, metavar="SECONDS", help="seconds between trainer metric reads; 0 disables"
    )
    s.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser(
        "run-local", help="train an FSDPTraining on this machine's CPU with torchrun (the ConfigMap's train.yaml)"
    )
    s.add_argument("-f", "--file", required=True, help="YAML file with one FSDPTraining")
    s.add_argument("--nproc", type=_positive, default=2, metavar="N", help="processes (ranks) to start (default: 2)")
    s.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="train.yaml and checkpoints; reused to resume (default: runs/NAME)",
    )
    s.add_argument("--steps", type=_positive, metavar="N", help="override training.maxSteps")
    s.set_defaults(func=cmd_run_local)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
