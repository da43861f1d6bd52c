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


# Inside the operator: the backends and the renderer sit below the controller and the CLI.
OPERATOR_FORBIDDEN = {"backends": {"controller", "cli"}, "render": {"controller", "cli"}}


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
def test_the_operators_lower_subpackages_do_not_import_the_controller(subpackage: str) -> None:
    root = PACKAGES["fsdp_operator"] / subpackage
    bad = {
        str(path.relative_to(REPO)): found
        for path in sorted(root.rglob("*.py"))
        if (found := operator_subpackages(path) & OPERATOR_FORBIDDEN[subpackage])
    }
    assert bad == {}


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
    module = PACKAGES["fsdp_operator"] / "backends" / "pytorchjob.py"
    # ".base" is its own package, "..render" the one beside it.
    assert operator_subpackages(module) == {"backends", "render"}


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
