"""examples/eks: the EKS manifests the docs ship, checked against the real API server, the renderer and each other.

- Every manifest server-dry-runs against the test API server with the real
  third-party CRDs (PyTorchJob from the training operator v1.9.4, Karpenter's
  v1.14.1 EC2NodeClass/NodePool with their CEL rules), the way
  test_bundle_cluster.py checks the bundle.
- The NCCL smoke test's embedded script compiles and runs: two ranks over gloo
  on the CPU (torchrun, as in the pod), passing and failing as documented.
- The smoke test's pods are placed like a rendered FSDPTraining's: the same
  node selector, tolerations, affinities, GPU/EFA requests, security context
  and NCCL/libfabric environment.
- The p5 efa-only example needs Karpenter >= 1.11: v1.9.3's CRDs refuse it.
- The docs about EKS name the AMI release the EC2NodeClass pins, cite only
  files that exist, and never claim that fsGroup makes the checkpoint volume
  writable.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import karpenter_crds, tool_path

from tests.bundle.manifests import KUSTOMIZE, REPO_ROOT, kustomize, load_all, render_training, run

EKS = REPO_ROOT / "examples" / "eks"
SMOKE = EKS / "nccl-allreduce-smoke.yaml"
P5_EFA_ONLY = EKS / "karpenter-p5-efa-only"
RENDERED_EXAMPLE = REPO_ROOT / "examples" / "fsdptraining-llama3.2-1b.yaml"
DOCS = REPO_ROOT / "docs"
EKS_DOCS = (
    "quickstart-eks.md",
    "troubleshooting.md",
    "eks-capacity.md",
    "eks-checkpoint-storage.md",
    "eks-placement.md",
)
NAMESPACE = "fsdp-training"

# What the docs tell users to put into the ${...} placeholders (envsubst).
PLACEHOLDERS = {
    "CLUSTER_NAME": "dry-run",
    "GPU_SUBNET_ID": "subnet-0123456789abcdef0",
    "FSX_SUBNET_ID": "subnet-0123456789abcdef0",
    "FSX_SECURITY_GROUP_ID": "sg-0123456789abcdef0",
    "EFS_FILE_SYSTEM_ID": "fs-0123456789abcdef0",
    "CLAIM_NAME": "llama32-1b-checkpoints",
}

Obj = dict[str, Any]


def fill(text: str) -> str:
    """``envsubst`` with the documented variables; every ${NAME} must be one of them."""
    for name, value in PLACEHOLDERS.items():
        text = text.replace("${" + name + "}", value)
    assert "${" not in text, re.findall(r"\$\{[^}]*\}", text)
    return text


def smoke_objects() -> dict[str, Obj]:
    return {o["kind"]: o for o in load_all(SMOKE.read_text())}


def smoke_script() -> str:
    return smoke_objects()["ConfigMap"]["data"]["allreduce.py"]


def worker(pytorchjob: Obj) -> tuple[Obj, Obj, Obj]:
    """(replica spec, pod template metadata, pod spec) of the job's Worker replica."""
    replica = pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]
    return replica, replica["template"]["metadata"], replica["template"]["spec"]


def rendered_job() -> Obj:
    (job,) = [o for o in render_training(RENDERED_EXAMPLE) if o["kind"] == "PyTorchJob"]
    return job


def env_of(container: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


# --- the API server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def eks_cluster(cluster: TestCluster) -> TestCluster:
    cluster.create_namespace(NAMESPACE)
    return cluster


def dry_run(cluster: TestCluster, manifests: str, namespace: str | None = None) -> tuple[int, str]:
    args = ["apply", "--server-side", "--dry-run=server", "--field-manager=eks-examples-test", "-f", "-"]
    if namespace:
        args = ["-n", namespace, *args]
    res = cluster.kubectl(*args, input=manifests, check=False)
    return res.returncode, res.stdout + res.stderr


def p5_efa_only_text() -> str:
    return fill(run([tool_path("kubectl"), "kustomize", P5_EFA_ONLY]))


EXAMPLES = {
    "nccl-allreduce-smoke.yaml": lambda: SMOKE.read_text(),
    "fsx-lustre-storageclass.yaml": lambda: fill((EKS / "fsx-lustre-storageclass.yaml").read_text()),
    "efs-storageclass.yaml": lambda: fill((EKS / "efs-storageclass.yaml").read_text()),
    "checkpoint-volume-owner.yaml": lambda: fill((EKS / "checkpoint-volume-owner.yaml").read_text()),
    "karpenter-p5-efa-only": p5_efa_only_text,
}


def test_every_eks_example_is_checked() -> None:
    shipped = {p.name for p in EKS.iterdir() if p.suffix == ".yaml" or p.is_dir()}
    assert shipped == set(EXAMPLES), shipped ^ set(EXAMPLES)


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_eks_example_is_accepted_by_the_api_server(eks_cluster: TestCluster, name: str) -> None:
    text = EXAMPLES[name]()
    rc, out = dry_run(eks_cluster, text, namespace=NAMESPACE)
    assert rc == 0, f"the API server rejected examples/eks/{name}:\n{out}"
    # One "serverside-applied (server dry run)" line per object: none was skipped.
    assert out.count("(server dry run)") == len(load_all(text)), out


@pytest.mark.cluster
def test_the_api_server_really_validates_the_smoke_job(eks_cluster: TestCluster) -> None:
    """The PyTorchJob CRD's schema is enforced: a replica count that is not an integer is refused."""
    text = SMOKE.read_text().replace("      replicas: 2\n", "      replicas: two\n")
    assert text != SMOKE.read_text()
    rc, out = dry_run(eks_cluster, text)
    assert rc != 0 and "replicas" in out, out


@pytest.mark.cluster
def test_a_placement_group_can_be_added_to_the_p5_example(eks_cluster: TestCluster, tmp_path: Path) -> None:
    """The patch docs/eks-placement.md shows, on top of the example, passes the v1.14.1 CEL rules."""
    doc = (DOCS / "eks-placement.md").read_text()
    (patch,) = re.findall(r"^      - \{op: add, path: /spec/placementGroupSelector, value: .*\}$", doc, re.M)
    base = os.path.relpath(P5_EFA_ONLY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\n"
        "patches:\n  - target: {kind: EC2NodeClass, name: gpu}\n    patch: |-\n" + patch + "\n"
    )
    text = fill(run([tool_path("kubectl"), "kustomize", tmp_path]))
    nodeclass = {o["kind"]: o for o in load_all(text)}["EC2NodeClass"]
    assert nodeclass["spec"]["placementGroupSelector"] == {"name": "gpu-my-cluster"}
    rc, out = dry_run(eks_cluster, text)
    assert rc == 0, out


@pytest.fixture(scope="module")
def karpenter_min_cluster() -> Iterator[TestCluster]:
    """An API server with only the CRDs of the oldest Karpenter the bundle supports (tools/versions.env)."""
    c = TestCluster(crds=[karpenter_crds("KARPENTER_MIN_VERSION")])
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.cluster
def test_the_p5_example_needs_karpenter_1_11(karpenter_min_cluster: TestCluster) -> None:
    """docs/eks-placement.md: spec.networkInterfaces (efa-only) is not in the v1.9 CRD, so 1.9 refuses it."""
    rc, out = dry_run(karpenter_min_cluster, p5_efa_only_text())
    assert rc != 0, out
    assert "networkInterfaces" in out, out
    # The bundle's own overlay (no networkInterfaces) is fine there: the refusal is about the example's field.
    overlay = fill(run([tool_path("kubectl"), "kustomize", KUSTOMIZE / "overlays" / "karpenter"]))
    rc, out = dry_run(karpenter_min_cluster, overlay)
    assert rc == 0, out


# --- the p5 efa-only example ---------------------------------------------------------


def test_the_p5_example_gives_32_efa_only_interfaces_and_one_ip() -> None:
    objs = {o["kind"]: o for o in load_all(p5_efa_only_text())}
    nodeclass, nodepool = objs["EC2NodeClass"], objs["NodePool"]
    interfaces = nodeclass["spec"]["networkInterfaces"]
    # The primary interface (card 0, device 0) is ENA; every other one is efa-only, one per network card.
    assert interfaces[0] == {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    efa_only = [i for i in interfaces if i["interfaceType"] == "efa-only"]
    assert len(efa_only) == len(interfaces) - 1 == 32
    assert len({(i["networkCardIndex"], i["deviceIndex"]) for i in interfaces}) == len(interfaces)
    assert {i["networkCardIndex"] for i in efa_only} == set(range(32))
    # Karpenter counts vpc.amazonaws.com/efa as the efa-only entries: what the smoke test (and a p5 job) asks for.
    _, _, pod = worker(smoke_objects()["PyTorchJob"])
    assert pod["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] == len(efa_only)
    assert nodeclass["spec"]["subnetSelectorTerms"] == [{"id": PLACEHOLDERS["GPU_SUBNET_ID"]}]
    requirements = nodepool["spec"]["template"]["spec"]["requirements"]
    (family,) = [r for r in requirements if r["key"] == "karpenter.k8s.aws/instance-family"]
    assert family["values"] == ["p5"]
    # Everything else is the bundle's overlay, unchanged.
    base = {o["kind"]: o for o in kustomize("overlays/karpenter")}
    for key in ("amiSelectorTerms", "userData", "blockDeviceMappings", "metadataOptions", "role"):
        assert nodeclass["spec"][key] == yaml.safe_load(fill(yaml.safe_dump(base["EC2NodeClass"]["spec"][key])))


# --- the smoke test's script ---------------------------------------------------------


def test_the_smoke_script_compiles() -> None:
    compile(smoke_script(), "allreduce.py", "exec")
    ast.parse(smoke_script())


def run_smoke_script(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "allreduce.py"
    script.write_text(smoke_script())
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",  # gloo on the CPU, whatever this machine has
        "OMP_NUM_THREADS": "1",
        "SMOKE_SIZES_MB": "1,2",
        "SMOKE_ITERS": "2",
        "SMOKE_WARMUP": "1",
        **settings,
    }
    torchrun = Path(sys.executable).with_name("torchrun")
    return subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_smoke_script_passes_and_fails_as_documented(tmp_path: Path) -> None:
    ok = run_smoke_script(tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = [line for line in ok.stdout.splitlines() if line.startswith("nccl-smoke:")]
    assert any("backend=gloo" in line and "world=2" in line and "nodes=1" in line for line in lines), lines
    assert any(re.search(r"memlock_kib=(\d+|unlimited)$", line) for line in lines), lines
    rows = [line.split()[1:] for line in lines if re.match(r"nccl-smoke:\s+\d+\s", line)]
    assert [int(r[0]) for r in rows] == [1, 2], lines
    for size, time_us, algbw, busbw in rows:
        # world 2: busbw = algbw * 2 * (2 - 1) / 2 = algbw (nccl-tests doc/PERFORMANCE.md).
        assert float(time_us) > 0 and abs(float(busbw) - float(algbw)) <= 0.011, (size, algbw, busbw)
    assert lines[-1] == "nccl-smoke: PASS", lines

    # The documented failures: too few hosts, too little locked memory (which stops before any collective).
    hosts = run_smoke_script(tmp_path, SMOKE_MIN_NODES="2")
    assert hosts.returncode != 0
    assert "nccl-smoke: FAIL: the ranks run on 1 host(s), fewer than SMOKE_MIN_NODES" in hosts.stdout, hosts.stdout
    memlock = run_smoke_script(tmp_path, SMOKE_MIN_MEMLOCK_KIB=str(1 << 62))
    assert memlock.returncode != 0
    assert "below SMOKE_MIN_MEMLOCK_KIB" in memlock.stderr and "size_MiB" not in memlock.stdout, memlock.stdout


def smoke_functions() -> dict:
    namespace: dict = {"__name__": "allreduce"}
    exec(compile(smoke_script(), "allreduce.py", "exec"), namespace)
    return namespace


# NCCL's own INFO lines (format of NVIDIA/nccl#527's EFA log, aws-ofi-nccl's plugin).
EFA_LOG = """\
ip-10-0-1-2:4161:4522 [3] NCCL INFO NET/OFI Selected Provider is efa
ip-10-0-1-2:4161:4522 [3] NCCL INFO Using network AWS Libfabric
ip-10-0-1-2:4161:4522 [3] NCCL INFO NET/OFI Using aws-ofi-nccl 1.13.2
"""
SOCKET_LOG = """\
ip-10-0-1-2:4161:4522 [3] NCCL INFO NET/Plugin: Could not find: libnccl-net.so
ip-10-0-1-2:4161:4522 [3] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.2<0>
ip-10-0-1-2:4161:4522 [3] NCCL INFO Using network Socket
"""


def test_the_smoke_script_fails_when_nccl_falls_back_to_tcp_sockets() -> None:
    """A 2-node all-reduce over sockets passes every sum; only NCCL's own log tells it is not EFA."""
    f = smoke_functions()
    assert f["nccl_networks"](EFA_LOG) == ["AWS Libfabric"]
    assert f["nccl_networks"](SOCKET_LOG) == ["Socket"]
    assert f["network_problem"](["AWS Libfabric"], "") == ""
    assert f["network_problem"](["AWS Libfabric"], "Libfabric") == ""
    assert "fell back to TCP sockets" in f["network_problem"](["Socket"], "")
    assert "did not report its network" in f["network_problem"]([], "")
    assert f["network_problem"](["IB"], "Libfabric") == "NCCL uses IB, not SMOKE_REQUIRE_NETWORK='Libfabric'"


# --- the smoke test is placed like a rendered job --------------------------------------


def test_the_smoke_job_is_placed_like_a_rendered_fsdptraining() -> None:
    smoke = smoke_objects()["PyTorchJob"]
    rendered = rendered_job()
    replica, meta, pod = worker(smoke)
    r_replica, r_meta, r_pod = worker(rendered)
    (container,) = pod["containers"]
    (r_container,) = r_pod["containers"]

    assert smoke["metadata"]["namespace"] == rendered["metadata"]["namespace"] == NAMESPACE
    assert container["image"] == r_container["image"]  # the trainer image: same NCCL, aws-ofi-nccl, libfabric
    assert container["name"] == r_container["name"] == "pytorch"  # the training operator requires this name
    # Node selection: the GPU NodePool, its capacity type, its taint, the instance type, EFA in one zone.
    assert pod["nodeSelector"] == r_pod["nodeSelector"]
    assert pod["tolerations"] == r_pod["tolerations"]
    assert pod["affinity"]["nodeAffinity"] == r_pod["affinity"]["nodeAffinity"]
    for kind in ("podAntiAffinity", "podAffinity"):
        (term,) = pod["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        (r_term,) = r_pod["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == r_term["topologyKey"]
        # The selector picks this job's own pods, as the rendered one picks its own.
        assert term["labelSelector"]["matchLabels"].items() <= meta["labels"].items()
    assert meta["annotations"]["karpenter.sh/do-not-disrupt"] == r_meta["annotations"]["karpenter.sh/do-not-disrupt"]
    # GPU and EFA requests (extended resources: request == limit), one pod per node.
    for resource in ("nvidia.com/gpu", "vpc.amazonaws.com/efa"):
        for part in ("requests", "limits"):
            assert container["resources"][part][resource] == r_container["resources"][part][resource], resource
    assert replica["replicas"] == r_replica["replicas"] == 2
    # Security: the same non-root user, capabilities (IPC_LOCK for EFA) and read-only root.
    assert pod["securityContext"] == r_pod["securityContext"]
    assert container["securityContext"] == r_container["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    # NCCL/libfabric environment: what the renderer sets, and never FI_EFA_USE_DEVICE_RDMA.
    env, r_env = env_of(container), env_of(r_container)
    for name in (
        "NCCL_SOCKET_IFNAME",
        "FI_PROVIDER",
        "FI_EFA_FORK_SAFE",
        "FI_EFA_USE_HUGE_PAGE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "HOME",
    ):
        assert env.get(name) == r_env.get(name) is not None, name
    assert "FI_EFA_USE_DEVICE_RDMA" not in env and "FI_EFA_USE_DEVICE_RDMA" not in r_env
    assert env["NCCL_DEBUG"] == "INFO" and "NET" in env["NCCL_DEBUG_SUBSYS"]  # the log names the transport
    # torchrun: the same c10d rendezvous on worker 0, one process per GPU on every node.
    args, r_args = container["args"], r_container["args"]
    assert container["command"] == ["torchrun"]
    for name in ("rdzv-backend", "rdzv-conf"):
        assert flag(args, name) == flag(r_args, name)
    name = smoke["metadata"]["name"]
    assert flag(args, "rdzv-endpoint") == f"{name}-worker-0:29400"
    assert flag(r_args, "rdzv-endpoint") == f"{rendered['metadata']['name']}-worker-0:29400"
    assert flag(args, "rdzv-id") == name
    assert int(flag(args, "nnodes")) == replica["replicas"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert int(flag(args, "nproc-per-node")) == int(smoke["spec"]["nprocPerNode"]) == gpus
    assert [p for p in container["ports"] if p["name"] == "pytorchjob-port"] == [
        p for p in r_container["ports"] if p["name"] == "pytorchjob-port"
    ]
    # The script is the mounted ConfigMap; everything the container writes is an emptyDir.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    script_mount = mounts["/etc/nccl-smoke"]
    assert script_mount["readOnly"] is True
    assert volumes[script_mount["name"]]["configMap"]["name"] == smoke_objects()["ConfigMap"]["metadata"]["name"]
    assert args[-1] == "/etc/nccl-smoke/allreduce.py"
    for path in ("/dev/shm", "/tmp", "/home/trainer"):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert _gib(shm["sizeLimit"]) < _gib(container["resources"]["limits"]["memory"])


def _gib(quantity: str) -> float:
    return float(quantity.removesuffix("Gi"))


# --- uid 1000 everywhere -----------------------------------------------------------


def test_the_checkpoint_volume_is_made_writable_for_the_trainers_uid() -> None:
    """Dockerfile USER == the rendered pods' user == the EFS access point's owner == the FSx chown."""
    trainer_stage = (REPO_ROOT / "Dockerfile").read_text().split(" AS trainer\n", 1)[1].split("\nFROM ", 1)[0]
    ((uid, gid),) = [tuple(map(int, u)) for u in re.findall(r"^USER (\d+):(\d+)$", trainer_stage, re.M)]
    _, _, pod = worker(rendered_job())
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    efs = load_all(fill((EKS / "efs-storageclass.yaml").read_text()))[0]
    assert efs["provisioner"] == "efs.csi.aws.com"
    assert (efs["parameters"]["uid"], efs["parameters"]["gid"]) == (str(uid), str(gid))
    assert efs["parameters"]["provisioningMode"] == "efs-ap"
    fsx = load_all(fill((EKS / "fsx-lustre-storageclass.yaml").read_text()))[0]
    assert fsx["provisioner"] == "fsx.csi.aws.com"
    for sc in (efs, fsx):
        assert sc["reclaimPolicy"] == "Retain"  # deleting the claim keeps the checkpoints
    # kustomize/overlays/fsdp's claim uses this class, and the quick start's claim too.
    (pvc,) = [o for o in kustomize("overlays/fsdp") if o["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["storageClassName"] == fsx["metadata"]["name"]
    assert f"storageClassName: {fsx['metadata']['name']}" in (DOCS / "quickstart-eks.md").read_text()
    job = load_all(fill((EKS / "checkpoint-volume-owner.yaml").read_text()))[0]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert f"chown {uid}:{gid} /volume" in " ".join(container["command"])
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert container["image"] == worker(rendered_job())[2]["containers"][0]["image"]


# --- the docs --------------------------------------------------------------------------


def test_the_docs_name_the_pinned_ami_release() -> None:
    (nodeclass,) = [o for o in kustomize("overlays/karpenter") if o["kind"] == "EC2NodeClass"]
    (term,) = nodeclass["spec"]["amiSelectorTerms"]
    family, release = term["alias"].split("@")
    assert family == "al2023" and re.fullmatch(r"v\d{8}", release), term  # a published release, not "latest"
    quickstart = (DOCS / "quickstart-eks.md").read_text()
    assert f"`{term['alias']}`" in quickstart
    assert f"https://github.com/awslabs/amazon-eks-ami/releases/tag/{release}" in quickstart
    ssm = "/amazon-linux-2023/x86_64/nvidia/amazon-eks-node-al2023-x86_64-nvidia-$K8S_VERSION-$AMI_RELEASE/image_id"
    assert ssm in quickstart  # Karpenter's own lookup (pkg/providers/amifamily/al2023.go), as a command


def test_the_quickstart_ships_every_eks_example_and_a_verify_checklist() -> None:
    quickstart = (DOCS / "quickstart-eks.md").read_text()
    for name in ("nccl-allreduce-smoke.yaml", "fsx-lustre-storageclass.yaml", "checkpoint-volume-owner.yaml"):
        assert f"examples/eks/{name}" in quickstart, name
    verify = quickstart.split("## Verify before your first job", 1)[1].split("\n## ", 1)[0]
    for needle in (
        "nvidia\\.com/gpu",  # GPUs advertised
        "vpc\\.amazonaws\\.com/efa",  # EFA advertised
        "ulimit -l",
        "memlock_kib",
        "describe-security-group-rules",
        "examples/eks/nccl-allreduce-smoke.yaml",
        "network=Socket",  # the smoke test fails on a TCP fallback (test_the_smoke_script_fails_when_nccl...)
        "nccl-smoke: PASS",
    ):
        assert needle in verify, needle
    # Every placeholder is set once, in "Your values", and nowhere else.
    values = quickstart.split("## Your values", 1)[1].split("\n## ", 1)[0]
    exported = re.findall(r"^export ([A-Z0-9_]+)=", values, re.M)
    assert len(exported) == len(set(exported))
    rest = quickstart.replace(values, "")
    for name in exported:
        assert not re.search(rf"^(export )?{name}=", rest, re.M), f"{name} is set again outside 'Your values'"
    assert {"CLUSTER_NAME", "AWS_REGION", "GPU_SUBNET_ID", "FSX_SUBNET_ID", "CLAIM_NAME", "HF_TOKEN"} <= set(exported)
    # Derived from a command where it is created, not chosen by the user.
    assert "FSX_SECURITY_GROUP_ID=$(aws ec2 create-security-group" in rest


def test_the_eks_docs_cite_files_that_exist() -> None:
    cited = re.compile(r"`((?:kustomize|charts|docs|examples|tools|tests|trainer|operator)/[\w./-]+)`")
    for doc in EKS_DOCS:
        for path in cited.findall((DOCS / doc).read_text()):
            assert (REPO_ROOT / path.rstrip("/")).exists(), f"docs/{doc} cites {path}, which does not exist"
        for link in re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]+)?\)", (DOCS / doc).read_text()):
            assert (DOCS / link).exists(), f"docs/{doc} links {link}, which does not exist"


def test_the_eks_docs_do_not_claim_fsgroup_makes_the_volume_writable() -> None:
    claim = re.compile(r"fsGroup[^.]{0,80}\bmakes?\b[^.]{0,40}\bwritable", re.I)
    for doc in EKS_DOCS:
        text = " ".join((DOCS / doc).read_text().split())
        for m in claim.finditer(text):
            # Only the negation ("does not ...", "not ...") may mention it.
            assert re.search(r"\bnot\b", m.group(0)), f"docs/{doc}: {m.group(0)!r}"
