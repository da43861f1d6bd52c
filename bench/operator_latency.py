"""Operator latency: FSDPTraining created → PyTorchJob created, against a real API server.

Starts a throwaway etcd + kube-apiserver (fsdp_localcluster.apiserver), installs
kustomize/default but its Deployment, runs the operator as a child process with
the Deployment's command line and its ServiceAccount's token
(fsdp_localcluster.operator_install, as in tests/operator/controller/test_operator_e2e.py), then:

- ``single``: N trainings one after the other, each waiting for its job;
- ``burst``: M trainings created at once (concurrent POSTs).

Latency is measured on this side, in one clock: from just before the
FSDPTraining POST is sent to the arrival of the PyTorchJob's ADDED event on a
watch this script holds open (creationTimestamps have one-second
resolution). It therefore includes the API server's own work on both
objects. Also reported: the time until the training's status says Created
(the operator's status write), and the operator's peak RSS (VmHWM).

    .venv/bin/python bench/operator_latency.py            # prints, and updates docs/benchmarks.md
    .venv/bin/python bench/operator_latency.py --no-write # prints only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import platform
import re
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fsdp_api import FSDPTraining
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import REPO_ROOT as REPO
from fsdp_localcluster.operator_install import OperatorProcess, install_operator
from fsdp_operator.render import render

OPERATOR_NS = "fsdp-system"
DOC = REPO / "docs" / "benchmarks.md"
SECTION = "## Operator latency"
TARGETS = {"p50_ms": 100.0, "p99_ms_burst": 1000.0, "rss_mb": 150.0}


class Api:
    """Minimal admin client on http.client: one connection per thread."""

    def __init__(self, cluster: TestCluster) -> None:
        self.host, self.port = "127.0.0.1", cluster.port
        self.ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        self.ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
        self.local = threading.local()

    def conn(self) -> http.client.HTTPSConnection:
        c = getattr(self.local, "conn", None)
        if c is None:
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
            self.local.conn = c
        return c

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        c = self.conn()
        c.request(method, path, body=data, headers=headers)
        rsp = c.getresponse()
        text = rsp.read()
        if rsp.status >= 300:
            raise RuntimeError(f"{method} {path}: {rsp.status} {text[:300]!r}")
        return dict(json.loads(text))


class Watch(threading.Thread):
    """Records when each object's first event of interest arrives (perf_counter seconds)."""

    def __init__(self, api: Api, path: str, accept: Any) -> None:
        super().__init__(daemon=True)
        self.api, self.path, self.accept = api, path, accept
        self.seen: dict[tuple[str, str], float] = {}
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def run(self) -> None:
        rv = ""
        while True:
            try:
                if not rv:
                    listed = self.api.request("GET", self.path)
                    rv = listed["metadata"]["resourceVersion"]
                    for item in listed["items"]:  # only after an error: these count as seen now
                        self._see({"type": "ADDED", "object": item})
                rv = self._stream(rv)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.errors.append(repr(e))
                time.sleep(0.1)

    def _stream(self, rv: str) -> str:
        """Follow the watch from ``rv``; return where it ended ("" to re-list)."""
        c = http.client.HTTPSConnection(self.api.host, self.api.port, context=self.api.ctx, timeout=3600)
        c.request("GET", f"{self.path}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true")
        rsp = c.getresponse()
        self.ready.set()
        while line := rsp.readline():
            event = json.loads(line)
            if event["type"] == "ERROR":  # e.g. 410 Gone: start over from a list
                self.errors.append(str(event["object"].get("message")))
                return ""
            rv = event["object"]["metadata"].get("resourceVersion", rv)
            self._see(event)
        return rv

    def _see(self, event: dict[str, Any]) -> None:
        now = time.perf_counter()
        meta = event["object"]["metadata"]
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event["type"] != "BOOKMARK" and self.accept(event) and key not in self.seen:
            with self.lock:
                self.seen[key] = now

    def wait_seen(self, keys: list[tuple[str, str]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(k in self.seen for k in keys):
                    return
            time.sleep(0.005)
        missing = [k for k in keys if k not in self.seen]
        raise TimeoutError(
            f"{len(missing)} objects never arrived on {self.path}: {missing[:5]}; watch errors: {self.errors[-3:]}"
        )


def training(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "ghcr.io/fsdp-k8s/trainer:0.1.0",
            "model": {"preset": "llama3.2-1b"},
            "training": {"maxSteps": 1000, "seqLen": 2048},
            "resources": {"nodes": 2, "gpusPerNode": 8, "instanceTypes": ["p5.48xlarge"]},
        },
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: a reported p99 is a measured value)."""
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))  # ceil(q/100 * n)
    return ordered[rank - 1]


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms)}


def create(api: Api, body: dict[str, Any]) -> float:
    sent = time.perf_counter()
    ns = body["metadata"]["namespace"]
    api.request("POST", f"/apis/training.fsdp.dev/v1alpha1/namespaces/{ns}/fsdptrainings", body)
    return sent


def cluster_pids(cluster: TestCluster) -> dict[str, int]:
    """kube-apiserver and etcd pids (TestCluster keeps them as private Popen objects)."""
    out = {}
    for name, attr in (("kube-apiserver", "_apiserver"), ("etcd", "_etcd")):
        proc = getattr(cluster, attr, None)
        if proc is not None:
            out[name] = proc.pid
    return out


def run_single(api: Api, jobs: Watch, created: Watch, n: int) -> tuple[list[float], list[float]]:
    ns = "bench-single"
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    to_job, to_status = [], []
    for i in range(n):
        key = (ns, f"single-{i}")
        sent = create(api, training(key[1], ns))
        jobs.wait_seen([key], 30)
        created.wait_seen([key], 30)
        to_job.append(jobs.seen[key] - sent)
        to_status.append(created.seen[key] - sent)
    return to_job, to_status


def run_burst(api: Api, jobs: Watch, created: Watch, m: int, threads: int) -> tuple[list[float], list[float], float]:
    ns = "bench-burst"
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    bodies = [training(f"burst-{i}", ns) for i in range(m)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        sent = list(pool.map(lambda b: create(api, b), bodies))
    keys = [(ns, b["metadata"]["name"]) for b in bodies]
    jobs.wait_seen(keys, 300)
    created.wait_seen(keys, 300)
    wall = max(created.seen[k] for k in keys) - t0
    return (
        [jobs.seen[k] - s for k, s in zip(keys, sent, strict=True)],
        [created.seen[k] - s for k, s in zip(keys, sent, strict=True)],
        wall,
    )


def run_floor(api: Api, m: int, threads: int) -> float:
    """The API server's share alone: the same burst's writes up to the jobs, issued by this script.

    With the operator stopped, POST ``m`` trainings and server-side apply each
    one's ConfigMap and PyTorchJob (the writes that precede a job), 16 at a
    time. No operator can create the last job sooner than this on this machine.
    """
    ns = "bench-floor"
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    bodies = [training(f"floor-{i}", ns) for i in range(m)]

    def one(body: dict[str, Any]) -> None:
        created = api.request("POST", f"/apis/training.fsdp.dev/v1alpha1/namespaces/{ns}/fsdptrainings", body)
        for obj in render(FSDPTraining.model_validate(created), set_owner=True)[:2]:  # ConfigMap, PyTorchJob
            name = obj["metadata"]["name"]
            plural = {"ConfigMap": "configmaps", "PyTorchJob": "pytorchjobs"}[obj["kind"]]
            base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
            c = api.conn()
            c.request(
                "PATCH",
                f"{base}/namespaces/{ns}/{plural}/{name}?fieldManager=bench&force=true",
                body=json.dumps(obj),
                headers={"Content-Type": "application/apply-patch+yaml"},
            )
            rsp = c.getresponse()
            rsp.read()
            if rsp.status >= 300:
                raise RuntimeError(f"apply {obj['kind']} {name}: {rsp.status}")

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, bodies))
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> str:
    cpus = os.cpu_count()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration):
        pass
    return f"{cpus} CPU cores ({model or platform.processor()}){mem}, Python {platform.python_version()}"


def markdown(results: dict[str, Any]) -> str:
    s, b = results["single"], results["burst"]
    rows = [
        ("1 training at a time", s["job"], s["status"]),
        (f"{b['job']['n']} created at once", b["job"], b["status"]),
    ]
    lines = [
        SECTION,
        "",
        f"`bench/operator_latency.py`, {results['date']}, on {results['machine']}. A real etcd +",
        "kube-apiserver on loopback (shared with the operator and this script on the same cores), the",
        "operator as a child process with the Deployment's command line and kustomize/rbac's",
        "ServiceAccount (kustomize/default, fsdp_localcluster.operator_install). Latency is measured from",
        "just before the FSDPTraining POST to the PyTorchJob's ADDED event on a watch (and to the",
        "training's first status write, phase Created), so it includes the API server's work.",
        f"The machine was shared with other work: 1-minute load average {results['load_avg_1m'][0]} before the",
        f"runs, {results['load_avg_1m'][1]} after.",
        "",
        "| scenario | create → PyTorchJob p50 | p99 | max | create → status p50 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for label, job, status in rows:
        lines.append(
            f"| {label} | {job['p50_ms']:.0f} ms | {job['p99_ms']:.0f} ms | {job['max_ms']:.0f} ms "
            f"| {status['p50_ms']:.0f} ms | {status['p99_ms']:.0f} ms |"
        )
    lines += [
        "",
        f"- {b['job']['n']} at once: all jobs and statuses written {b['wall_s']:.2f} s after the first POST "
        f"({b['job']['n'] / b['wall_s']:.0f} trainings/s).",
        f"- API server alone (operator stopped, this script issuing the same {b['job']['n']} POSTs and the "
        f"ConfigMap + PyTorchJob applies that precede each job, {results['threads']} at a time): "
        f"{results['api_floor_s']:.2f} s until the last job. No operator can beat that here; it bounds p99 "
        "from below.",
        "- CPU seconds spent during the burst (all on the same cores): "
        + ", ".join(f"{k} {v:.1f}" for k, v in b["cpu_s"].items())
        + ".",
        f"- Operator peak RSS (VmHWM) after both runs, with {results['trainings']} trainings known: "
        f"{results['rss_mb']:.0f} MB (idle before the runs: {results['rss_idle_mb']:.0f} MB; "
        f"after: {results['rss_after_mb']:.0f} MB).",
        f"- Targets: p50 < {TARGETS['p50_ms']:.0f} ms, p99 < {TARGETS['p99_ms_burst']:.0f} ms at "
        f"{b['job']['n']}, RSS < {TARGETS['rss_mb']:.0f} MB: "
        + ", ".join(f"{k} {'met' if ok else 'MISSED'}" for k, ok in results["verdict"].items())
        + ".",
        "",
        "Where the time goes. Per training there are 8 writes: the user's POST, 3 server-side applies",
        "(ConfigMap, PyTorchJob, PodMonitor), 1 status patch, kopf's annotation patch and 2 Events",
        "(posted in the background). A PyTorchJob write costs the API server about 10 ms of CPU here",
        "because its CRD embeds the whole PodSpec schema. So the burst is bound by the API server's",
        "CPU (the line above), not by the operator. The operator spends about 12 ms of CPU per",
        "training: kopf's event processing and deep copies, rendering (a third of it is the",
        "pure-Python YAML emitter for train.yaml), TLS and JSON.",
        "",
        "What was changed after profiling:",
        "",
        "- The status is written once per create instead of twice: a job event that arrives during an",
        "  apply no longer writes its own status.",
        "- kopf's per-handler Events are turned off (posting level WARNING).",
        "- The PodMonitor prune read is skipped on create.",
        "",
        "What was tried and dropped:",
        "",
        "- Bounding concurrent reconciles to 8 made p50 and p99 1.5-2x worse.",
        "- kopf's `queueing.worker_limit=32` made them about 5x worse, because each kopf worker",
        "  idles 5 s before it frees its slot.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    """Replace (or append) this section of docs/benchmarks.md; other sections are other benchmarks'."""
    current = DOC.read_text() if DOC.exists() else "# Benchmarks\n\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text + "\n", current, count=1)
    else:
        updated = current.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(updated)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--single", type=int, default=20, help="trainings created one at a time (default 20)")
    p.add_argument("--burst", type=int, default=200, help="trainings created at once (default 200)")
    p.add_argument("--threads", type=int, default=16, help="concurrent POSTs in the burst (default 16)")
    p.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    args = p.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="fsdp-bench-operator-"))
    cluster = TestCluster(workdir / "cluster")
    cluster.start()
    op: OperatorProcess | None = None
    try:
        install = install_operator(cluster, OPERATOR_NS, deploy=False, clusterwide=True)
        op = install.process(workdir / "operator.log", priority=100, pod_name="bench-operator")
        op.start()
        api = Api(cluster)
        jobs = Watch(api, "/apis/kubeflow.org/v1/pytorchjobs", lambda e: e["type"] == "ADDED")
        created = Watch(
            api,
            "/apis/training.fsdp.dev/v1alpha1/fsdptrainings",
            lambda e: (e["object"].get("status") or {}).get("phase") == "Created",
        )
        for w in (jobs, created):
            w.start()
            w.ready.wait(30)

        idle_rss_mb = op.rss_bytes() / 1e6
        load_before = os.getloadavg()[0]
        single_job, single_status = run_single(api, jobs, created, args.single)
        procs = {"operator": op.pid, **cluster_pids(cluster), "bench": os.getpid()}
        cpu_before = {k: cpu_seconds(v) for k, v in procs.items()}
        burst_job, burst_status, wall = run_burst(api, jobs, created, args.burst, args.threads)
        # Let the background writes (kopf's annotations, Events) finish before reading CPU totals.
        time.sleep(3)
        burst_cpu = {k: round(cpu_seconds(v) - cpu_before[k], 2) for k, v in procs.items()}
        rss_mb = op.peak_rss_bytes() / 1e6
        rss_now_mb = op.rss_bytes() / 1e6
        op.stop()
        floor = run_floor(api, args.burst, args.threads)
        results: dict[str, Any] = {
            "date": datetime.date.today().isoformat(),
            "machine": machine(),
            "single": {"job": summary(single_job), "status": summary(single_status)},
            "burst": {
                "job": summary(burst_job),
                "status": summary(burst_status),
                "wall_s": wall,
                "cpu_s": burst_cpu,
            },
            "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "api_floor_s": floor,
            "rss_mb": rss_mb,
            "rss_idle_mb": idle_rss_mb,
            "rss_after_mb": rss_now_mb,
            "trainings": args.single + args.burst,
            "threads": args.threads,
        }
        results["burst"]["job"]["n"] = args.burst
        results["verdict"] = {
            "p50 (one at a time)": results["single"]["job"]["p50_ms"] < TARGETS["p50_ms"],
            f"p50 (at {args.burst})": results["burst"]["job"]["p50_ms"] < TARGETS["p50_ms"],
            f"p99 (at {args.burst})": results["burst"]["job"]["p99_ms"] < TARGETS["p99_ms_burst"],
            "RSS": rss_mb < TARGETS["rss_mb"],
        }
        print(json.dumps(results, indent=2))
        text = markdown(results)
        print(text)
        if not args.no_write:
            write_section(text)
            print(f"wrote the '{SECTION[3:]}' section of {DOC.relative_to(REPO)}")
        return 0
    finally:
        if op is not None:
            op.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
