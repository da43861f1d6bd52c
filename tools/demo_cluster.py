#!/usr/bin/env python3
"""The whole flow on your laptop: a cluster on loopback, the operator, one FSDPTraining to Succeeded.

    make demo-cluster                      # examples/fsdptraining-tiny.yaml
    .venv/bin/python tools/demo_cluster.py -f examples/fsdptraining-tiny.yaml --steps 60 --keep

What runs (all local processes, nothing leaves the machine): etcd and
kube-apiserver, kube-scheduler, kube-controller-manager and the Kubeflow
training operator (built from Go modules, cached), three Karpenter-shaped
nodes whose pods the node agent runs as processes (fsdp_localcluster.node_agent),
the fsdp-operator installed with ``kubectl apply -k kustomize/default``, and
the trainer itself on the CPU. Progress comes from the FSDPTraining's status,
which the operator fills from the trainer's metrics. A real Prometheus scrapes
the trainer pods that the operator's PodMonitor selects, as the e2e tests do
(``--no-prometheus`` skips it); the demo prints its URL and, at the end, the
last loss it stored. Everything is torn down at the end (``--keep`` waits for
Ctrl-C first, with a kubeconfig and the Prometheus to poke at).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.contract import LOSS
from fsdp_localcluster.binaries import REPO_ROOT as REPO
from fsdp_localcluster.prometheus import prometheus_binary
from fsdp_localcluster.wait import WaitTimeout, wait_for
from fsdp_localcluster.whole_cluster import PodMonitorPrometheus, WholeCluster, machine_lock

# As often as the e2e tests scrape: a short demo's pod lives for seconds.
SCRAPE_INTERVAL = "1s"
# The Grafana dashboard the bundle ships (kustomize/components/monitoring).
DASHBOARD = REPO / "kustomize" / "components" / "monitoring" / "dashboards" / "fsdp-training.json"


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_training(path: Path, steps: int | None, namespace: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "FSDPTraining"]
    if len(docs) != 1:
        raise SystemExit(f"{path}: expected exactly one FSDPTraining, found {len(docs)}")
    training = docs[0]
    training["metadata"].setdefault("namespace", namespace)
    if steps is not None:
        training["spec"]["training"]["maxSteps"] = steps
        warmup = training["spec"]["training"].get("warmupSteps")
        if warmup is not None and warmup >= steps:
            training["spec"]["training"]["warmupSteps"] = steps // 10
    return training


def progress_line(st: dict[str, Any], max_steps: int) -> str:
    parts = [f"phase={st.get('phase', '-')}"]
    if st.get("step") is not None:
        parts.append(f"step={st['step']}/{max_steps}")
    if st.get("loss") is not None and math.isfinite(st["loss"]):
        parts.append(f"loss={st['loss']:.4f}")
    if st.get("tokensPerSecond") is not None:
        parts.append(f"tokens/s={st['tokensPerSecond']:.0f}")
    if st.get("message"):
        parts.append(f"({st['message']})")
    return " ".join(parts)


def prometheus_missing() -> str | None:
    """Why no Prometheus can start (its binary is absent), or None when it can."""
    try:
        prometheus_binary()
    except FileNotFoundError as e:
        return str(e)
    return None


def loss_query(name: str, namespace: str) -> str:
    """The training's loss series, by the labels the PodMonitor's scrape gives its pods (as tests/e2e query it)."""
    return f'{LOSS.name}{{namespace="{namespace}",pod=~"{name}-worker-.*"}}'


def last_sample(rows: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """The newest finite ``(timestamp, value)`` of a range query's ``data.result`` (any series), or None."""
    samples = [(float(ts), float(v)) for row in rows for ts, v in row.get("values", []) if math.isfinite(float(v))]
    return max(samples) if samples else None


def start_prometheus(whole: WholeCluster, name: str, namespace: str) -> PodMonitorPrometheus | None:
    """A real Prometheus for the PodMonitor the operator rendered for the training (None if it has none)."""
    try:
        pod_monitor = wait_for(lambda: whole.get("podmonitor", name, namespace), 60, "the operator's PodMonitor")
    except WaitTimeout:
        say(f"no PodMonitor {namespace}/{name} (spec.metrics.enabled: false?): no Prometheus")
        return None
    prom = whole.prometheus_for(pod_monitor, scrape_interval=SCRAPE_INTERVAL).start()
    say(f"Prometheus: {prom.url}  (scraping PodMonitor {namespace}/{name}; try {loss_query(name, namespace)})")
    return prom


def report_loss(prom: PodMonitorPrometheus, name: str, namespace: str, since: float) -> None:
    """The last loss the Prometheus stored: proof that the scrape worked."""
    end = time.time()
    step = max(1, math.ceil((end - since) / 10_000))  # under Prometheus's 11,000 points per series
    query = loss_query(name, namespace)
    last = last_sample(prom.query_range(query, since, end, step))
    if last is None:
        health = [(t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in prom.targets()]
        say(f"Prometheus {prom.url} has no {query} (targets: {health or 'none now'})")
    else:
        at, loss = last
        when = time.strftime("%H:%M:%S", time.localtime(at))
        say(f"Prometheus {prom.url}: last {LOSS.name} = {loss:.4f} (read back from its API; scraped at {when})")


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-f", "--file", type=Path, default=REPO / "examples" / "fsdptraining-tiny.yaml")
    p.add_argument("--steps", type=int, default=None, help="override spec.training.maxSteps (a shorter demo)")
    p.add_argument("--namespace", default="fsdp-training")  # the namespace kustomize/default serves
    p.add_argument("--timeout", type=float, default=1200, help="seconds to wait for the training to finish")
    p.add_argument("--quiet", action="store_true", help="do not stream the trainer's output")
    p.add_argument("--keep", action="store_true", help="leave the cluster (and Prometheus) up until Ctrl-C")
    p.add_argument("--no-prometheus", action="store_true", help="do not start a Prometheus for the trainer pods")
    args = p.parse_args(argv)

    training = load_training(args.file, args.steps, args.namespace)
    name, ns = training["metadata"]["name"], training["metadata"]["namespace"]
    max_steps = training["spec"]["training"]["maxSteps"]

    def echo(line: str) -> None:
        # The trainer pods' output (rank 0 logs a line every logIntervalSteps).
        if not args.quiet and line.startswith(f"[{name}-worker-"):
            print(f"    {line}", flush=True)

    with_prometheus = not args.no_prometheus
    if with_prometheus and (missing := prometheus_missing()):
        say(f"no Prometheus: {missing}; going on without it")
        with_prometheus = False

    signal.signal(signal.SIGTERM, interrupt)  # e.g. from `timeout`: tear down as on Ctrl-C
    t_start = time.monotonic()
    with machine_lock(timeout=60):
        whole = WholeCluster(echo_logs=echo)
        prom: PodMonitorPrometheus | None = None
        say("starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager, the training operator, 3 nodes")
        try:
            whole.start()
            phases = ", ".join(f"{k} {v:.1f}s" for k, v in whole.timings.items())
            say(f"cluster up in {sum(whole.timings.values()):.1f}s ({phases})")
            say(
                whole.kubectl(
                    "get", "nodes", "-L", "karpenter.sh/nodepool,node.kubernetes.io/instance-type"
                ).stdout.rstrip()
            )
            say("installing the operator: kubectl apply -k kustomize/default")
            took = whole.install_operator(env={"FSDP_OPERATOR_SCRAPE_INTERVAL": "5"})
            say(f"operator Ready in {took:.1f}s")
            whole.cluster.create_namespace(ns)
            shown = args.file.relative_to(REPO) if args.file.is_relative_to(REPO) else args.file
            say(f"applying {shown} ({max_steps} steps)")
            t_apply, t_apply_wall = time.monotonic(), time.time()
            whole.cluster.apply(training)
            if with_prometheus:
                # As tests/e2e do: from the PodMonitor the operator renders for the training.
                prom = start_prometheus(whole, name, ns)
            last, first_step_at = "", None
            deadline = time.monotonic() + args.timeout
            st: dict[str, Any] = {}
            while time.monotonic() < deadline:
                st = ((whole.get("fsdptraining", name, ns) or {}).get("status")) or {}
                line = progress_line(st, max_steps)
                if line != last:
                    say(line)
                    last = line
                if first_step_at is None and st.get("step"):
                    first_step_at = time.monotonic() - t_apply
                if st.get("phase") in ("Succeeded", "Failed"):
                    break
                time.sleep(2)
            else:
                say(f"timed out after {args.timeout:.0f}s")
            say(whole.kubectl("get", "fsdptraining,pytorchjob,pods", f"--namespace={ns}", "-o", "wide").stdout.rstrip())
            total = time.monotonic() - t_apply
            say(
                f"{name}: {st.get('phase')} in {total:.0f}s after apply"
                + (f" (first step reported after {first_step_at:.0f}s)" if first_step_at else "")
                + f"; last figures: {progress_line(st, max_steps)}"
            )
            if prom is not None:
                report_loss(prom, name, ns, since=t_apply_wall)
            if args.keep:
                # A fixed place for examples/client.ipynb (the cluster's own file goes with its temp folder).
                kept = REPO / "runs" / "demo-cluster.kubeconfig"
                kept.parent.mkdir(exist_ok=True)
                kept.write_bytes(whole.cluster.kubeconfig.read_bytes())
                kept.chmod(0o600)
                say(f"cluster kept: KUBECONFIG={kept} kubectl get pods -A   (Ctrl-C to tear down)")
                say("examples/client.ipynb submits to it with fsdp_k8s.Client(kubeconfig=...)")
                if prom is not None:
                    say(
                        f"Prometheus kept: {prom.url}; Grafana: add it as a data source, import "
                        f"{DASHBOARD.relative_to(REPO)}"
                    )
                while True:
                    time.sleep(3600)
            return 0 if st.get("phase") == "Succeeded" else 1
        except KeyboardInterrupt:
            say("interrupted")
            return 130
        finally:
            say("tearing down")
            try:
                if prom is not None:
                    prom.stop()  # first: its discovery lists pods from the cluster
            finally:
                whole.stop()
            say(f"done in {time.monotonic() - t_start:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
