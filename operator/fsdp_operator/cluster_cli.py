"""``fsdp-operator status | logs | watch | export``: a training on the cluster, from a shell, through the Python client.

The client (``fsdp_k8s``) sits above the operator's renderer; only the CLI,
the top of this package, reaches up to it, and only inside these commands.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdp_k8s import Client, Training

EXIT_OK, EXIT_FAILED, EXIT_TIMEOUT = 0, 1, 2


def _client(args: argparse.Namespace) -> Client:
    from fsdp_k8s import Client

    return Client(args.namespace, kubeconfig=args.kubeconfig, context=args.context)


def status_text(t: Training) -> str:
    """The status as a person reads it: the summary line, then where things are, then the conditions."""
    s = t.status
    lines = [t.summary()]
    if s.progress_percentage is not None:
        lines.append(f"  progress:   {s.progress_percentage}%" + (f", {s.remaining} left" if s.remaining else ""))
    if s.job_name:
        lines.append(f"  job:        {t.backend.kind} {s.job_name} ({s.nodes or '?'} nodes, {s.gpus or 0} GPUs)")
    ckpt = s.checkpoint
    where = ckpt.dir or "-"
    if ckpt.ephemeral:
        where += " (ephemeral: lost with the pods)"
    if ckpt.last_step is not None:
        where += f", last step {ckpt.last_step}"
    if ckpt.remote:
        where += f"; remote {ckpt.remote}" + (
            f" (step {ckpt.last_uploaded_step})" if ckpt.last_uploaded_step is not None else ""
        )
    lines.append(f"  checkpoint: {where}")
    if s.router is not None:
        r = s.router
        lines.append(
            f"  router:     layer {r.layer}: most-loaded expert {r.max_load_ratio:g}x the mean, "
            f"{r.unused_experts_ratio:.0%} of experts without a token" + (" (collapsed)" if r.collapsed else "")
        )
    for tracker, page in sorted((s.tracker_runs or {}).items()):
        lines.append(f"  {tracker + ':':<11} {page}")
    if s.conditions:
        rows = [("CONDITION", "STATUS", "REASON", "MESSAGE")]
        rows += [(c.type, c.status, c.reason, c.message) for c in s.conditions]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines.append("")
        lines += [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def one_line_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The client's errors (no kubeconfig, not found, forbidden...) as one ``error:`` line and exit 1."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        from fsdp_k8s import ClientError

        try:
            return command(args)
        except ClientError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_FAILED

    return run


@one_line_errors
def cmd_status(args: argparse.Namespace) -> int:
    t = _client(args).get(args.name)
    if args.output == "json":
        print(json.dumps(t.body.get("status") or {}, indent=2))
    else:
        sys.stdout.write(status_text(t))
    return EXIT_OK


@one_line_errors
def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        for line in client.logs(args.name, args.rank, follow=True, tail_lines=args.tail):
            print(line, flush=True)
    else:
        sys.stdout.write(client.logs(args.name, args.rank, tail_lines=args.tail))
    return EXIT_OK


@one_line_errors
def cmd_watch(args: argparse.Namespace) -> int:
    from fsdp_k8s import WaitTimeout

    def show(t: Training) -> None:
        print(t.summary(), flush=True)

    try:
        done = _client(args).wait(args.name, timeout=args.timeout, progress=show)
    except WaitTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_TIMEOUT
    return EXIT_OK if done.phase == "Succeeded" else EXIT_FAILED


@one_line_errors
def cmd_export(args: argparse.Namespace) -> int:
    from fsdp_k8s import WaitTimeout

    client = _client(args)
    job = client.export(
        args.name, args.to, step=args.step, dtype=args.dtype, fmt=args.format, memory=args.memory, wait=False
    )
    assert isinstance(job, str)  # wait=False: the Job's name
    print(f"export Job {client.namespace}/{job} created; kubectl logs -n {client.namespace} job/{job}", file=sys.stderr)
    if args.no_wait:
        print(job)
        return EXIT_OK
    try:
        done = client.wait_export(job, timeout=args.timeout)
    except WaitTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_TIMEOUT
    if not done.succeeded:
        print(f"error: export Job {done.namespace}/{done.job} failed: {done.message}", file=sys.stderr)
        return EXIT_FAILED
    print(done.output)
    return EXIT_OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _cluster_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("name", help="the FSDPTraining's name")
    s.add_argument("--namespace", "-n", help="its namespace (default: the kubeconfig context's)")
    s.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    s.add_argument("--context", help="kubeconfig context (default: the current one)")


def add_cluster_commands(sub: Any, positive: Any) -> None:
    """The subcommands that read a training on the cluster; ``positive`` parses a positive integer."""
    s = sub.add_parser("status", help="a training's phase, step, time left, checkpoints, trackers and conditions")
    _cluster_args(s)
    s.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format (default: text)")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("logs", help="the trainer's log of one node rank of a training (default: rank 0)")
    _cluster_args(s)
    s.add_argument("--rank", type=int, default=0, metavar="R", help="node rank (the pod's index; default 0)")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing lines as they come")
    s.add_argument("--tail", type=positive, metavar="N", help="only the last N lines")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser(
        "export",
        help="write a training's newest (or --step's) checkpoint as a Hugging Face model to S3, in a Job on the "
        "cluster; print the prefix",
    )
    _cluster_args(s)
    s.add_argument("--to", required=True, metavar="S3_URI", help="s3://bucket/prefix to write (a new prefix)")
    s.add_argument("--step", type=positive, metavar="N", help="the checkpoint of step N (default: the newest)")
    s.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="weights' dtype")
    s.add_argument("--format", choices=("merged", "peft"), default="merged", help="as fsdp-train export --format")
    s.add_argument("--memory", metavar="QUANTITY", help="the Job's memory (default: the model's size, when known)")
    s.add_argument("--no-wait", action="store_true", help="print the Job's name and return at once")
    s.add_argument("--timeout", type=_seconds, default=3600.0, metavar="SECONDS", help="give up waiting after this")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser(
        "watch", help="print a line per change until the training ends; exit 0 Succeeded, 1 Failed, 2 timeout"
    )
    _cluster_args(s)
    s.add_argument("--timeout", type=_seconds, default=24 * 3600.0, metavar="SECONDS", help="give up after this long")
    s.set_defaults(func=cmd_watch)
