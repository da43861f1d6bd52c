"""Fixtures of the whole-cluster end-to-end tests (``pytest -m e2e``; skip them with ``-m 'not e2e'``).

One WholeCluster per session, separate from the plain ``cluster`` fixture:
its controllers act on everything (the training operator's webhook, garbage
collection...), which the other suites do not expect.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_localcluster.whole_cluster import WholeCluster, machine_lock
from fsdp_operator.controller.node_exclusion import WORKLOAD_EVIDENCE_ENV

from tests.e2e.namespaces import REPORTS
from tests.e2e.timings import TIMINGS, record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report  # for own_namespace's teardown
    return report


@pytest.fixture(scope="session")
def whole(request: pytest.FixtureRequest) -> Iterator[WholeCluster]:
    """etcd, kube-apiserver, kube-scheduler, kube-controller-manager, training operator and three nodes."""
    with machine_lock():
        wc = WholeCluster()
        try:
            wc.start()
        except Exception as e:
            pytest.fail(f"the whole cluster failed to start:\n{e}", pytrace=False)
        TIMINGS.update({k: round(v, 2) for k, v in wc.timings.items()})
        TIMINGS["cluster_start_total_s"] = round(sum(wc.timings.values()), 2)
        yield wc
        if request.session.testsfailed:
            print(f"\n{wc.control_plane.logs(lines=30)}", file=sys.stderr)
        wc.stop()


@pytest.fixture(scope="session")
def operator(whole: WholeCluster) -> WholeCluster:
    """The fsdp-operator installed from kustomize/overlays/clusterwide (CRDs, RBAC, Deployment) and Ready.

    Cluster-wide: every test uses a namespace of its own. The namespaced
    default is tested on its own (tests/operator/controller/test_operator_e2e.py).
    """
    try:
        # Progress (step, loss) every 2 s instead of 30: the test runs last under a minute.
        # A straggler's lateness is the training's own evidence: test_stall.py excludes its node, which
        # an admin allows (by default it only alerts; docs/operator.md, "Excluding a node").
        env = {"FSDP_OPERATOR_SCRAPE_INTERVAL": "2", WORKLOAD_EVIDENCE_ENV: "true"}
        record("operator_install_s", whole.install_operator(env=env, clusterwide=True))
    except Exception as e:
        pytest.fail(f"installing the operator failed: {e}\n{whole.describe('fsdp-system')}\n{whole.operator_logs()}")
    return whole


def timings_file(config: pytest.Config) -> Path:
    """The figures docs/e2e.md quotes; runs/ is git-ignored."""
    return Path(os.environ.get("FSDP_E2E_TIMINGS", Path(config.rootpath) / "runs" / "e2e-timings.json"))


_STARTED = time.time()  # this conftest loads as the session collects


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Here, not in the terminal summary: under pytest-xdist the worker that ran the
    # whole-cluster tests holds the figures, and only the controller prints a summary.
    if TIMINGS:
        out = timings_file(session.config)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(TIMINGS, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    out = timings_file(terminalreporter.config)
    if not TIMINGS and not (out.exists() and out.stat().st_mtime >= _STARTED):
        return
    figures = TIMINGS or json.loads(out.read_text())
    terminalreporter.section("whole-cluster timings")
    for k, v in figures.items():
        terminalreporter.write_line(f"{k:>40}: {v}")
    terminalreporter.write_line(f"(written to {out})")
