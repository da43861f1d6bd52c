"""Each end-to-end test's namespace, cleared after a failure so the next tests get the nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fsdp_localcluster.whole_cluster import WholeCluster

# Each test's phase reports (conftest.py's hook), so a fixture's teardown knows whether its test failed.
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def own_namespace(whole: WholeCluster, prefix: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace named after the test; after a failed test, its pods are force-deleted and it is deleted.

    A failed test's training may still run, on the nodes' GPUs the next tests
    need: left there, one failure becomes a timeout of later ones (CI saw a
    hung remote-tier test take the happy path down with it). The failure's
    output is captured before this teardown runs.
    """
    name = prefix + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    whole.cluster.create_namespace(name)
    yield name
    if any(report.failed for report in request.node.stash.get(REPORTS, {}).values()):
        whole.kubectl("delete", "pods", "--all", f"--namespace={name}", "--grace-period=0", "--force", check=False)
        whole.kubectl("delete", "namespace", name, "--wait=false", check=False)
