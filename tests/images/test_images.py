"""The two images built from the Dockerfile here (tools/build-images.sh, `make images`), run in real containers.

Each container is started the way the node agent's image mode starts a pod's
(podman + runc, ``ContainerLaunch``): the rendered pod's user, read-only root,
dropped capabilities, mounts and environment. docs/images.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api import contract
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import REPO_ROOT
from fsdp_localcluster.images import LOCAL_OPERATOR_IMAGE, LOCAL_TRAINER_IMAGE, require_images
from fsdp_localcluster.node_agent.containers import ContainerLaunch, ServiceProxy, write_runtime
from fsdp_localcluster.operator_install import install_operator, operator_deployment
from fsdp_localcluster.wait import wait_for

from tests.images.rendered import render_tiny, worker_template

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

BUILD_TOOLS = ("gcc", "cc", "g++", "c++", "clang", "make", "ld", "as")
TRITON_TOOLCHAIN = {"gcc", "cc", "ld", "as"}
FIND_SPECS = "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('fsdp_trainer'))"
STEP = re.compile(r"^step (\d+)/\d+ \| loss", re.MULTILINE)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_images()
    return write_runtime(tmp_path_factory.mktemp("runtime"))


def image_config(image: str) -> dict[str, Any]:
    out = subprocess.run(["podman", "image", "inspect", image], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]


def rendered_trainer(max_steps: int, interval: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The tiny example's trainer pod spec, its container and its train.yaml, as `fsdp-operator render` gives them."""
    objects = render_tiny(max_steps, interval)
    pod = worker_template(objects)["spec"]
    return pod, pod["containers"][0], objects["ConfigMap"]["data"]["train.yaml"]


class TrainerPod:
    """The rendered trainer pod's one container, started from the trainer image with its volumes as folders."""

    def __init__(self, root: Path, runtime: Path, max_steps: int, interval: int) -> None:
        pod, container, config = rendered_trainer(max_steps, interval)
        self.root = root
        volumes = {}
        for v in pod["volumes"]:
            path = root / v["name"]
            path.mkdir()
            path.chmod(0o777)  # emptyDirs and the claim, writable by the pod's uid as on a node
            volumes[v["name"]] = path
        (volumes["config"] / "train.yaml").write_text(config)
        self.checkpoints, self.home = volumes["checkpoints"], volumes["home"]
        self.name = f"image-test-{os.getpid()}-{int(time.monotonic() * 1000)}"
        pod_name = f"{container['env'][0]['value']}-worker-0"
        self.launch = ContainerLaunch(
            name=self.name,
            image=LOCAL_TRAINER_IMAGE,
            command=container["command"],
            args=container["args"],
            env={e["name"]: e["value"] for e in container["env"] if "value" in e} | {"GLOO_SOCKET_IFNAME": "lo"},
            mounts=[(m["mountPath"], volumes[m["name"]], bool(m.get("readOnly"))) for m in container["volumeMounts"]],
            hostname=pod_name,
            pod_ip="127.0.0.1",
            working_dir=container.get("workingDir"),
            security={**pod["securityContext"], **container["securityContext"]},
            limits={"cpu": "2", "memory": "6Gi"},
            # Its own loopback: the rendezvous store's fixed port (29400) is then this pod's alone. On the
            # host's, another training on the machine could hold it, and torch elastic would join that
            # job's store as a client (seen as a RendezvousClosedError when that job ended).
            network="none",
        )
        self.log = root / "container.log"
        self.argv = self.launch.argv(runtime)

    def start(self) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as out:
            return subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def saved_steps(self) -> list[int]:
        return sorted(int(p.parent.name.removeprefix("step-")) for p in self.checkpoints.glob("step-*/COMPLETE"))


@pytest.fixture
def trainer_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="image-test-") as d:
        yield Path(d)


def test_operator_image_runs_its_cli_as_its_non_root_user(runtime: Path) -> None:
    assert image_config(LOCAL_OPERATOR_IMAGE)["Config"]["User"] == "65532:65532"
    launch = ContainerLaunch(
        name=f"image-test-op-{os.getpid()}",
        image=LOCAL_OPERATOR_IMAGE,
        command=None,
        args=["--help"],
        env={},
        mounts=[],
        hostname="fsdp-operator",
        pod_ip="127.0.0.1",
        working_dir=None,
        security={"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        limits={},
    )
    out = subprocess.run(launch.argv(runtime), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("run", "render", "validate", "crd"):
        assert command in out.stdout
    # The image carries no trainer: neither its package nor torch.
    podman = ["podman", "--runtime", str(runtime), "run", "--rm", "--network=host", "--entrypoint=python"]
    probe = subprocess.run(
        [*podman, LOCAL_OPERATOR_IMAGE, "-c", FIND_SPECS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.stdout.split() == ["None", "None"], probe.stdout + probe.stderr


def test_trainer_image_trains_as_the_rendered_pod_and_checkpoints(runtime: Path, trainer_root: Path) -> None:
    pod = TrainerPod(trainer_root, runtime, max_steps=20, interval=10)
    sec = pod.launch.security
    # What the container runs under: the renderer's settings, enforced by runc.
    assert sec["runAsUser"] == 1000 and sec["readOnlyRootFilesystem"] and sec["capabilities"]["drop"] == ["ALL"]
    proc = pod.start()
    assert proc.wait(timeout=600) == 0, pod.output()[-4000:]
    assert pod.saved_steps() == [10, 20]
    assert [int(s) for s in STEP.findall(pod.output())][-1] == 20
    owners = {p.stat().st_uid for p in pod.checkpoints.rglob("*")}
    assert owners == {1000}, owners
    # The check and the rank read the corpus the package ships: nothing rendered it into the pod's HOME.
    assert not list(pod.home.rglob("corpus-*.json")), sorted(pod.home.rglob("*"))


def test_sigterm_to_the_container_saves_a_checkpoint_and_exits_143(runtime: Path, trainer_root: Path) -> None:
    pod = TrainerPod(trainer_root, runtime, max_steps=5000, interval=5000)
    proc = pod.start()
    deadline = time.monotonic() + 300
    while not STEP.search(pod.output()):
        assert proc.poll() is None and time.monotonic() < deadline, pod.output()[-4000:]
        time.sleep(0.5)
    # podman passes the signal to the container's PID 1 (the trainer's check), as the kubelet's runtime does.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, pod.output()[-4000:]
    last = max(int(s) for s in STEP.findall(pod.output()))
    saved = pod.saved_steps()
    assert len(saved) == 1 and last <= saved[0] < 5000, (saved, last)


def get(cluster: TestCluster, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def image_report(image: str) -> dict[str, Any]:
    cfg = image_config(image)
    return {"image": image, "size_mb": round(cfg["Size"] / 1e6), "layers": len(cfg["RootFS"]["Layers"])}


@pytest.mark.parametrize("image", [LOCAL_TRAINER_IMAGE, LOCAL_OPERATOR_IMAGE])
def test_images_carry_no_build_tools_package_caches_or_secrets(runtime: Path, image: str) -> None:
    print(json.dumps(image_report(image)))
    mount = subprocess.run(["podman", "image", "mount", image], capture_output=True, text=True, check=True).stdout
    root = Path(mount.strip())
    try:
        found: list[str] = []
        tools = {t for t in BUILD_TOOLS if any((root / d / t).exists() for d in ("usr/bin", "usr/local/bin", "bin"))}
        # The trainer's C toolchain is what Triton needs (the Dockerfile says why); nothing more.
        expected = TRITON_TOOLCHAIN if image == LOCAL_TRAINER_IMAGE else set()
        found += [f"build tool {t}" for t in sorted(tools ^ expected)]
        caches = ["root/.cache", "home/trainer/.cache", "src"]
        found += [f"cache {c}" for c in caches if (root / c).exists()]
        found += [f"package {p.name}" for p in (root / "var/cache/apt/archives").rglob("*.deb")]
        found += [f"apt list {p.name}" for p in (root / "var/lib/apt/lists").glob("*_Packages*")]
        # Build-time settings and credentials: the CA/pip.conf mounted while building, keys, tokens.
        for path in ("etc/pip.conf", "run/build-ca.crt", "root/.netrc", "root/.ssh", "root/.docker/config.json"):
            if (root / path).exists() and (root / path).stat().st_size > 0:
                found.append(f"secret {path}")
        # The wheelhouse mounted while building (tools/build-images.sh): at most its empty mount point.
        found += [f"wheelhouse {p.relative_to(root)}" for p in (root / "run/wheels").rglob("*") if p.is_file()]
        for p in (root / "opt/venv").rglob("*"):
            if p.suffix in (".pem", ".key") and p.is_file() and b"PRIVATE KEY" in p.read_bytes()[:65536]:
                found.append(f"private key {p.relative_to(root)}")
        assert not found, found
    finally:
        subprocess.run(["podman", "image", "unmount", image], capture_output=True)


def test_tritons_launcher_builds_in_the_trainer_image_as_the_pod_runs_it(runtime: Path) -> None:
    """torch.compile on a GPU node: Triton compiles its driver.c (Python.h, its CUDA headers) at first use.

    The same build, minus linking the node's libcuda.so.1 (no GPU here), as uid
    1000 on a read-only root with /tmp writable, as the rendered pod runs.
    """
    build = (
        "import os, triton; from triton.runtime.build import compile_so_from_file; "
        "d = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia'); "
        "print(compile_so_from_file(os.path.join(d, 'driver.c'), 'cuda_utils', "
        "include_dirs=[os.path.join(d, 'include')]))"
    )
    podman = ["podman", "--runtime", str(runtime), "run", "--rm", "--network=none", "--read-only", "--tmpfs=/tmp"]
    flags = ["--user=1000:1000", "--cap-drop=ALL", "--env=TRITON_CACHE_DIR=/tmp/triton", "--entrypoint=python"]
    argv = [*podman, *flags, LOCAL_TRAINER_IMAGE, "-c", build]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert re.fullmatch(r"/tmp/triton/\w+/cuda_utils\.cpython-3\d+-x86_64-linux-gnu\.so\n", done.stdout), done.stdout


def test_the_build_arguments_make_the_same_dockerfile(runtime: Path) -> None:
    """The local build overrides only the bases and the EFA switch: every stage's steps are the Dockerfile's."""
    history = image_config(LOCAL_TRAINER_IMAGE)
    env = dict(e.split("=", 1) for e in history["Config"]["Env"])
    assert env["HOME"] == contract.HOME_DIR and env["HF_HOME"] == contract.HF_HOME
    assert history["Config"]["User"] == "1000:1000"
    assert history["Config"]["Entrypoint"] == ["python"]
    assert "/opt/amazon/efa/lib" in env["LD_LIBRARY_PATH"]  # the real build's loader path, present if empty here


def test_the_operator_image_reconciles_a_training_as_the_bundles_service_account(
    runtime: Path, cluster: TestCluster, tmp_path: Path
) -> None:
    """In-cluster login as a pod does it: the token, CA and namespace mounted where Kubernetes mounts them."""
    namespace = "fsdp-image-test"
    install = install_operator(cluster, namespace, deploy=False, clusterwide=True)
    assert install.kubeconfig is not None
    token = json.loads(Path(install.kubeconfig).read_text())["users"][0]["user"]["token"]
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_bytes((cluster.pki / "ca.crt").read_bytes())
    (sa / "namespace").write_text(namespace)
    for f in sa.iterdir():
        f.chmod(0o644)
    container = install.container
    pod_spec = operator_deployment(install.manifests)["spec"]["template"]["spec"]
    assert container["image"].startswith("ghcr.io/fsdp-k8s/operator:")
    process = install.process(tmp_path / "unused.log", scrape_interval=0.5)  # its free ports and arguments
    server = urllib.parse.urlsplit(cluster.server)
    # The kubernetes Service: what kopf's in-cluster login dials (https://kubernetes.default.svc:443).
    proxy = ServiceProxy(f"127.{200 + os.getpid() % 50}.255.1", (server.hostname or "127.0.0.1", server.port or 443))
    launch = ContainerLaunch(
        name=f"image-test-operator-{os.getpid()}",
        image=LOCAL_OPERATOR_IMAGE,
        command=None,  # the image's ENTRYPOINT, as the Deployment does
        args=process.command()[1:],
        env={
            **process.environment(),
            "KUBERNETES_SERVICE_HOST": proxy.ip,
            "KUBERNETES_SERVICE_PORT": str(proxy.PORT),
        },
        mounts=[("/var/run/secrets/kubernetes.io/serviceaccount", sa, True)],
        hostname="fsdp-operator-image-test",
        pod_ip="127.0.0.1",
        working_dir=None,
        security={**pod_spec.get("securityContext", {}), **container.get("securityContext", {})},
        limits={k: str(v) for k, v in (container.get("resources") or {}).get("limits", {}).items()},
        api_server_ip=proxy.ip,
    )
    assert launch.security.get("readOnlyRootFilesystem") and launch.security.get("runAsNonRoot")
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(launch.argv(runtime), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        process.proc = proc  # the liveness check of the process it stands for
        try:
            process.wait_live(120)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text()[-3000:]}") from e
        training = yaml.safe_load((REPO_ROOT / "examples/fsdptraining-tiny.yaml").read_text())
        training["metadata"]["namespace"] = namespace
        cluster.apply(training)
        name = training["metadata"]["name"]
        job = wait_for(lambda: get(cluster, "pytorchjob", name, namespace), 60, "the operator's PyTorchJob")
        assert job["metadata"]["ownerReferences"][0]["kind"] == "FSDPTraining"
        reconciled = wait_for(
            lambda: next(
                (
                    c
                    for c in ((get(cluster, "fsdptraining", name, namespace) or {}).get("status") or {}).get(
                        "conditions", []
                    )
                    if c["type"] == "Reconciled" and c["status"] == "True"
                ),
                None,
            ),
            60,
            "the Reconciled condition",
        )
        assert reconciled["reason"] == "Applied"
    finally:
        # Deleted while the operator runs, so that its finalizer is released and nothing is left behind.
        cluster.kubectl("delete", "fsdptraining", "--all", "-n", namespace, "--timeout=60s", check=False)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        proxy.close()
    assert code == 0, log.read_text()[-3000:]
