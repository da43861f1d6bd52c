"""Imports point down: API at the bottom; renderer, controller and CLI on it; the trainer beside them.

Read from the source (every ``import`` statement, lazy ones inside functions
included), so a forbidden import fails here even on a code path no other test
runs; and checked again by importing each layer in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PACKAGES = {
    "fsdp_api": REPO / "api" / "fsdp_api",
    "fsdp_operator": REPO / "operator" / "fsdp_operator",
    "fsdp_trainer": REPO / "trainer" / "fsdp_trainer",
    "fsdp_localcluster": REPO / "localcluster" / "fsdp_localcluster",
    "fsdp_k8s": REPO / "client" / "fsdp_k8s",
}

# What each package must never import, directly or lazily.
FORBIDDEN = {
    "fsdp_api": {
        "torch",
        "kopf",
        "aiohttp",
        "transformers",
        "fsdp_operator",
        "fsdp_trainer",
        "fsdp_localcluster",
        "fsdp_k8s",
    },
    # Its CLI reaches up to the client (tests below: only the CLI's cluster commands do).
    "fsdp_operator": {"torch", "transformers", "fsdp_trainer", "fsdp_localcluster"},
    "fsdp_trainer": {"kopf", "aiohttp", "fsdp_operator", "fsdp_localcluster", "fsdp_k8s"},
    # The local cluster runs the operator and the trainer as processes.
    "fsdp_localcluster": {"torch", "kopf", "fsdp_trainer", "fsdp_k8s"},
    # The client is for notebooks: the standard library, the API and the renderer; no torch, no kopf.
    "fsdp_k8s": {"torch", "kopf", "aiohttp", "transformers", "fsdp_trainer", "fsdp_localcluster"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def violations(package: str) -> list[str]:
    out = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        bad = imported_roots(path) & FORBIDDEN[package]
        if bad:
            out.append(f"{path.relative_to(REPO)} imports {', '.join(sorted(bad))}")
    return out


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_points_up_or_across(package: str) -> None:
    assert PACKAGES[package].is_dir()
    assert violations(package) == []


def test_the_checker_sees_a_lazy_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fsdp_operator.render import render\n    import torch.nn as nn\n")
    assert imported_roots(module) == {"fsdp_operator", "torch"}


# Inside the operator, floor by floor: the naming and the launchers on the API alone; the
# backends (job kinds) on those; the renderer on the backends; the controller and the CLI on top.
_ABOVE_RENDER = {"controller", "cli", "cluster_cli", "local"}
OPERATOR_FORBIDDEN = {
    "naming": {"launchers", "backends", "render", *_ABOVE_RENDER},
    "launchers": {"naming", "backends", "render", *_ABOVE_RENDER},
    "backends": {"render", *_ABOVE_RENDER},
    "render": _ABOVE_RENDER,
}


def operator_subpackages(path: Path) -> set[str]:
    """The fsdp_operator subpackages a module imports, relative imports resolved."""
    package = path.relative_to(PACKAGES["fsdp_operator"].parent).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            parts = [*base, *(node.module or "").split(".")] if node.module else base
            names = [[*parts, alias.name] for alias in node.names] if not node.module else [parts]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        out |= {n[1] for n in names if len(n) > 1 and n[0] == "fsdp_operator"}
    return out


@pytest.mark.parametrize("subpackage", sorted(OPERATOR_FORBIDDEN))
def test_the_operators_lower_floors_import_nothing_above_them(subpackage: str) -> None:
    root = PACKAGES["fsdp_operator"] / subpackage
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    assert files and files[0].exists()
    bad = {
        str(path.relative_to(REPO)): found
        for path in files
        if (found := operator_subpackages(path) & OPERATOR_FORBIDDEN[subpackage])
    }
    assert bad == {}


def module_imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (dotted) and the modules of it that it imports, relative ones resolved."""
    root = PACKAGES[package]
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        # Imports for the type checker only are no cycle at run time.
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                module = [node.module] if node.module else []
                base = [*here[: len(here) - node.level + 1], *module] if node.level else module
                dotted = ".".join(base)
                for alias in node.names:
                    found.add(f"{dotted}.{alias.name}" if f"{dotted}.{alias.name}" in modules else dotted)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = (found & modules.keys()) - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_inside_a_package(package: str) -> None:
    assert import_cycles(module_imports(package)) == []


def room_graph(graph: dict[str, set[str]], folder: str) -> dict[str, set[str]]:
    """The imports between the rooms of ``folder`` (a dotted package): its own modules, and each subfolder as one."""

    def room(module: str) -> str | None:
        if module == folder:
            return folder
        if not module.startswith(folder + "."):
            return None
        return f"{folder}.{module[len(folder) + 1 :].split('.')[0]}"

    rooms: dict[str, set[str]] = {}
    for module, imported in graph.items():
        here = room(module)
        if here is not None:
            rooms.setdefault(here, set()).update(r for r in map(room, imported) if r is not None and r != here)
    for targets in list(rooms.values()):
        for target in targets:
            rooms.setdefault(target, set())
    return rooms


# A folder's rooms (its modules, and its subfolders taken whole) import one another one way:
# a subfolder is a floor of its own, not half above and half below a module beside it.
@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_between_the_rooms_of_a_folder(package: str) -> None:
    graph = module_imports(package)
    folders = sorted({m for m in graph if (PACKAGES[package].parent / m.replace(".", "/") / "__init__.py").is_file()})
    assert {f: cycles for f in folders if (cycles := import_cycles(room_graph(graph, f)))} == {}


def test_the_room_graph_takes_a_subfolder_whole() -> None:
    graph = {"p": set(), "p.a": {"p.sub.x"}, "p.sub": set(), "p.sub.x": set(), "p.sub.y": {"p.a"}}
    assert import_cycles(room_graph(graph, "p")) == [["p.a", "p.sub"]]
    assert import_cycles(room_graph(graph, "p.sub")) == []


def test_the_cycle_finder_sees_a_three_module_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


# The controller's rooms: status/ computes (no API client, no kopf), nodes/ and stall/ beside it,
# bodies/ parses what the watches deliver into typed views;
# the flat floor keeps the handlers, state, sync and the loops.
CONTROLLER = PACKAGES["fsdp_operator"] / "controller"
MAX_FLAT_CONTROLLER_MODULES = 20


def test_the_controller_keeps_its_rooms_and_a_small_flat_floor() -> None:
    rooms = sorted(p.name for p in CONTROLLER.iterdir() if (p / "__init__.py").is_file())
    assert rooms == ["bodies", "nodes", "stall", "status"]
    flat = sorted(p.name for p in CONTROLLER.glob("*.py"))
    assert len(flat) <= MAX_FLAT_CONTROLLER_MODULES, flat


def test_the_status_room_calls_no_api_server() -> None:
    calls = {}
    for path in sorted((CONTROLLER / "status").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found = imported_roots(path) & {"kopf", "aiohttp"}
        found |= {
            f"{node.module}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level and (node.module or "").split(".")[-1] == "kube"
        }
        if found:
            calls[path.name] = found
    assert calls == {}


# The client stands on the operator's offline half only; only the CLI's cluster commands stand on the client.
CLIENT_MAY_USE = {"render", "local"}


def operator_modules_used(path: Path) -> set[str]:
    """The fsdp_operator modules or subpackages a module outside it imports (``fsdp_operator.X``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            dotted = [node.module.split(".")] if "." in node.module else [[node.module, a.name] for a in node.names]
        elif isinstance(node, ast.Import):
            dotted = [alias.name.split(".") for alias in node.names]
        else:
            continue
        out |= {d[1] for d in dotted if d[0] == "fsdp_operator" and len(d) > 1}
    return out


def test_the_client_uses_only_the_operators_offline_half() -> None:
    used = {
        str(path.relative_to(REPO)): found
        for path in sorted(PACKAGES["fsdp_k8s"].rglob("*.py"))
        if (found := operator_modules_used(path))
    }
    assert {m for found in used.values() for m in found} <= CLIENT_MAY_USE, used
    assert used, "the checker saw no import of the operator's renderer"


def test_only_the_cli_imports_the_client() -> None:
    importers = sorted(
        str(path.relative_to(PACKAGES["fsdp_operator"]))
        for path in PACKAGES["fsdp_operator"].rglob("*.py")
        if "fsdp_k8s" in imported_roots(path)
    )
    assert importers == ["cluster_cli.py"]


def test_the_subpackage_checker_resolves_relative_imports() -> None:
    module = PACKAGES["fsdp_operator"] / "render" / "command.py"
    # "from .. import backends, launchers": the packages beside it; no import of its own package.
    assert operator_subpackages(module) == {"backends", "launchers"}


# The trainer speaks to object stores through one interface (fsdp_trainer/storage): only the
# S3 store's module names boto3, so a second service is one module beside it.
def test_only_the_s3_store_imports_boto3() -> None:
    speakers = sorted(
        str(path.relative_to(PACKAGES["fsdp_trainer"]))
        for path in PACKAGES["fsdp_trainer"].rglob("*.py")
        if imported_roots(path) & {"boto3", "botocore"}
    )
    assert speakers == ["storage/s3.py"]


def module_calls(path: Path) -> set[str]:
    """The names called in a module as ``name(...)`` or ``obj.name(...)`` (their last part)."""
    called = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            called.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return called


# The step's seam (issue 47): a strategy builds the one call of the model on a micro-batch
# (loss/model_call.py) and the losses make it; no loss or strategy calls a model itself.
def test_the_training_model_is_called_only_through_the_model_call() -> None:
    roots = [PACKAGES["fsdp_trainer"] / "loss", PACKAGES["fsdp_trainer"] / "step"]
    callers = sorted(
        str(path.relative_to(PACKAGES["fsdp_trainer"]))
        for root in roots
        for path in root.rglob("*.py")
        if "model" in module_calls(path)
    )
    # head.py's one other call is the loss probe at start (eval mode, no step): it decides the loss.
    assert callers == ["loss/head.py", "loss/model_call.py"]


def test_the_call_finder_sees_a_method_and_a_plain_call(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f(self, batch):\n    return self.model(**batch), model(batch)\n")
    assert {"model", "f"} - module_calls(module) == {"f"}


# Every module of a layer, imported in a fresh interpreter; then what got loaded.
_PROBE = """
import importlib, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


@pytest.mark.parametrize(
    ("package", "absent"),
    [
        ("fsdp_api", {"torch", "kopf", "aiohttp", "fsdp_operator", "fsdp_trainer"}),
        ("fsdp_operator", {"torch", "fsdp_trainer"}),
        ("fsdp_k8s", {"torch", "kopf", "aiohttp", "transformers", "fsdp_trainer", "fsdp_localcluster"}),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(package: str, absent: set[str]) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, package], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert package in loaded
    assert loaded & absent == set()


@pytest.mark.slow  # a fresh Python importing torch (over the unit tier's limit, tests/slow_guard.py)
def test_trainer_imports_without_the_operator_or_kopf() -> None:
    # The trainer's modules need torch, which is installed here; what must not
    # come along is anything of the operator side.
    done = subprocess.run([sys.executable, "-c", _PROBE, "fsdp_trainer"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "torch" in loaded
    assert loaded & {"kopf", "aiohttp", "fsdp_operator", "fsdp_localcluster"} == set()


# What the spec package (fsdp_api.spec) may take from the rest of the API: the
# modules below it. The trainer config, the memory plan and the documents read
# the spec, never the other way round.
SPEC_MAY_IMPORT = {
    "base",
    "contract",
    "faults",
    "instance_types",
    "object_keys",
    "pod_resources",
    "precision",
    "presets",
    "rules",
}


def test_the_spec_package_imports_only_the_api_modules_below_it() -> None:
    found = {}
    for path in sorted((PACKAGES["fsdp_api"] / "spec").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                found.setdefault(node.module.split(".")[0], []).append(path.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fsdp_api"):
                found.setdefault(node.module or "", []).append(path.name)
    assert found, "the checker saw no import of the API's modules"
    assert {m: f for m, f in found.items() if m not in SPEC_MAY_IMPORT} == {}


# Tests share helpers through helper modules beside them, never by importing a
# test_*.py module: a test file can then change or go without breaking another,
# and a shared helper is found under a name that says what it holds.
TEST_ROOTS = (REPO / "tests", REPO / "localcluster" / "tests")


def imported_test_modules(path: Path) -> set[str]:
    """The test_* modules a file imports from, dotted as written (relative ones keep their dots)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            lead, dotted = "", [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            # `from package import test_x` names a module as well.
            lead, dotted = "." * node.level, [[*base, alias.name] for alias in node.names]
        else:
            continue
        for parts in dotted:
            hit = next((i for i, part in enumerate(parts) if part.startswith("test_")), None)
            if hit is not None:
                out.add(lead + ".".join(parts[: hit + 1]))
    return out


def test_no_test_module_imports_from_another_test_module() -> None:
    files = [path for root in TEST_ROOTS for path in sorted(root.rglob("*.py"))]
    assert len(files) > len(TEST_ROOTS), "the checker found no test files"
    bad = {str(path.relative_to(REPO)): found for path in files if (found := imported_test_modules(path))}
    assert bad == {}


def test_the_test_import_checker_sees_every_form(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from tests.operator.test_status import facts\n"
        "from . import test_render\n"
        "def f():\n    import tests.trainer.test_config as c\n"
        "from tests.operator.status_fixtures import job\n"
    )
    assert imported_test_modules(module) == {"tests.operator.test_status", ".test_render", "tests.trainer.test_config"}
