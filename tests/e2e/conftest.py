"""Fixtures of the whole-cluster end-to-end tests (``pytest -m e2e``; skip them with ``-m 'not e2e'``).

One WholeCluster per session, separate from the plain ``cluster`` fixture:
its controllers act on everything (the training operator's webhook, garbage
collection...), which the other suites do not expect.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_localcluster.whole_cluster import WholeCluster, machine_lock

from tests.e2e.timings import TIMINGS, record


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
    default is tested on its own (tests/operator/test_operator_e2e.py).
    """
    try:
        # Progress (step, loss) every 2 s instead of 30: the test runs last under a minute.
        env = {"FSDP_OPERATOR_SCRAPE_INTERVAL": "2"}
        record("operator_install_s", whole.install_operator(env=env, clusterwide=True))
    except Exception as e:
        pytest.fail(f"installing the operator failed: {e}\n{whole.describe('fsdp-system')}\n{whole.operator_logs()}")
    return whole


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS:
        return
    terminalreporter.section("whole-cluster timings")
    for k, v in TIMINGS.items():
        terminalreporter.write_line(f"{k:>40}: {v}")
    # The figures docs/e2e.md quotes; runs/ is git-ignored.
    default = Path(terminalreporter.config.rootpath) / "runs" / "e2e-timings.json"
    out = Path(os.environ.get("FSDP_E2E_TIMINGS", default))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(TIMINGS, indent=2) + "\n")
    terminalreporter.write_line(f"(written to {out})")
