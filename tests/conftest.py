"""Shared pytest fixtures. Keep this file small: the cluster machinery lives in fsdp_localcluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import ENV_UNIT_TIER

from tests.trainer.tracking.mlflow_server import MlflowServer

# The example files' fixtures and parametrization, for every test folder (tests/api, tests/operator, ...);
# pytester runs the planted suites of tests/test_tiers.py.
pytest_plugins = ["tests.support.examples", "pytester"]

# MLflow's client, in the tests and in the trainers they launch, reports usage to
# mlflow-telemetry.io unless told not to: the tests reach nothing but loopback.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too (pyproject.toml lists them) so --strict-markers holds
    # even when pytest runs with another ini file.
    known = {line.split(":")[0] for line in config.getini("markers")}
    for line in (
        "cluster: needs the real kube-apiserver + etcd test cluster",
        "slow: takes more than a few seconds",
        "integration: needs more than the virtualenv (Go binaries, Debian's servers, images, a cluster)",
    ):
        if line.split(":")[0] not in known:
            config.addinivalue_line("markers", line)


# The tiers (docs/e2e.md, "Tiers"). A test is `integration` when it needs more than the
# virtualenv: everything in these folders (the bundle renders with kubectl and helm, checks
# with promtool; the rest start clusters, images and Prometheus), and any test elsewhere that
# asks for one of these fixtures or carries one of these markers. `make test-unit` runs the
# rest, minus `slow`; there, building a Go binary is refused (fsdp_localcluster.binaries), so a
# test that needs one and is not marked fails with a line saying so instead of building for minutes.
INTEGRATION_PATHS = ("tests/e2e/", "tests/images/", "tests/bundle/", "tests/cluster/", "tests/monitoring/")
INTEGRATION_FIXTURES = frozenset({"cluster", "whole", "operator", "s3", "mlflow_server"})
INTEGRATION_MARKERS = ("cluster", "e2e")


def needs_more_than_the_venv(item: pytest.Item) -> bool:
    return (
        item.nodeid.startswith(INTEGRATION_PATHS)
        or bool(INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        or any(item.get_closest_marker(name) for name in INTEGRATION_MARKERS)
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The unit tier does not even import the integration folders (a module there may ask for a binary on import)."""
    if not os.environ.get(ENV_UNIT_TIER):
        return None
    try:
        relative = collection_path.relative_to(config.rootpath).as_posix() + "/"
    except ValueError:
        return None
    return True if relative.startswith(INTEGRATION_PATHS) else None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if needs_more_than_the_venv(item):
            item.add_marker(pytest.mark.integration)


# Tests that must run one after the other, on one worker, when the suite runs on several
# (`make test`: pytest -n 2): each group holds a machine-wide resource for long stretches
# (the whole cluster and its machine lock; the real kubelet's bridge and containerd, and
# the images), and the rest of the suite fills the other worker meanwhile.
SERIAL_GROUPS = {"tests/e2e/": "whole-cluster", "tests/images/": "images"}


def serial_group(nodeid: str) -> str | None:
    return next((group for prefix, group in SERIAL_GROUPS.items() if nodeid.startswith(prefix)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each serial group is one unit of work, every other test a unit of its own; largest units first.

    Not xdist's ``--dist loadgroup``: with pytest 9 its ``xdist_group`` marks do not
    reach the scheduler (the tests of a group were spread over the workers).
    """
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return serial_group(nodeid) or nodeid

    return SerialGroupScheduling(config, log)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[TestCluster]:
    """A real etcd + kube-apiserver (RBAC on, shared CRDs installed), one per session.

    Fails (never skips) when the binaries cannot be built: the tests are only
    meaningful against the real components.
    """
    c = TestCluster()
    try:
        c.start()
        error = None
    except Exception as e:  # reported below, outside the except, so the message is not doubled
        error = e
    if error is not None:
        c.stop(keep_workdir=True)
        pytest.fail(f"test cluster failed to start (work dir kept: {c.workdir}):\n{error}", pytrace=False)
    print(f"test cluster up at {c.server}; start-up seconds: {c.startup_seconds}", file=sys.stderr)
    yield c
    if request.session.testsfailed:
        print(f"\n{c.logs()}", file=sys.stderr)  # the apiserver's view of what went wrong
    c.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One real MLflow tracking server per test worker, started at first use; tests tell runs apart by experiment."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()
