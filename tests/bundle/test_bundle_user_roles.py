"""The user-facing fsdptraining-admin/-editor/-viewer ClusterRoles grant what they say, per the real API server.

Each role is bound in one namespace to a user of its own; ``kubectl auth
can-i --as`` asks the API server's RBAC authorizer, so the answer is the one a
user of the cluster gets.
"""

from __future__ import annotations

import pytest
from fsdp_localcluster.apiserver import TestCluster

from tests.bundle.manifests import kustomize, kustomize_text

pytestmark = pytest.mark.cluster

NAMESPACE = "team-roles"
ROLES = ("admin", "editor", "viewer")
AGGREGATES_TO = {"admin": "admin", "editor": "edit", "viewer": "view"}


def user_roles() -> dict[str, dict]:
    return {
        o["metadata"]["name"]: o
        for o in kustomize("rbac")
        if o["kind"] == "ClusterRole" and o["metadata"]["name"].startswith("fsdptraining-")
    }


@pytest.fixture(scope="module")
def roles_cluster(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> TestCluster:
    # kubectl resolves the resource through discovery: without the CRD it asks about nothing.
    crds = tmp_path_factory.mktemp("crds") / "crds.yaml"
    crds.write_text(kustomize_text("crd"))
    cluster.install_crds(crds)
    cluster.create_namespace(NAMESPACE)
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": list(user_roles().values())})
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"fsdptraining-{role}", "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"fsdptraining-{role}"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"{role}-user"}],
        }
        for role in ROLES
    ]
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": bindings})
    return cluster


def can(
    cluster: TestCluster, role: str, verb: str, resource: str, namespace: str = NAMESPACE, subresource: str = ""
) -> bool:
    # TYPE/NAME in can-i names an object: a subresource needs its own flag.
    extra = [f"--subresource={subresource}"] if subresource else []
    res = cluster.kubectl("auth", "can-i", verb, resource, *extra, "-n", namespace, "--as", f"{role}-user", check=False)
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), res.stdout + res.stderr
    return answer == "yes"


def test_the_bundle_ships_three_user_roles_aggregated_into_the_builtin_ones() -> None:
    roles = user_roles()
    assert sorted(roles) == [f"fsdptraining-{r}" for r in sorted(ROLES)]
    for role, builtin in AGGREGATES_TO.items():
        labels = roles[f"fsdptraining-{role}"]["metadata"]["labels"]
        assert labels[f"rbac.authorization.k8s.io/aggregate-to-{builtin}"] == "true"


@pytest.mark.parametrize(
    ("role", "verb", "allowed"),
    [
        ("viewer", "get", True),
        ("viewer", "list", True),
        ("viewer", "watch", True),
        ("viewer", "create", False),
        ("viewer", "patch", False),
        ("viewer", "delete", False),
        ("editor", "create", True),
        ("editor", "patch", True),
        ("editor", "update", True),
        ("editor", "delete", True),
        ("editor", "deletecollection", False),
        ("admin", "deletecollection", True),
        ("admin", "create", True),
    ],
)
def test_role_grants_fsdptrainings(roles_cluster: TestCluster, role: str, verb: str, allowed: bool) -> None:
    assert can(roles_cluster, role, verb, "fsdptrainings.training.fsdp.dev") is allowed


@pytest.mark.parametrize("role", ROLES)
def test_no_user_role_writes_the_status_or_reaches_other_namespaces(roles_cluster: TestCluster, role: str) -> None:
    # The status is the operator's: users read it, never write it.
    assert can(roles_cluster, role, "get", "fsdptrainings.training.fsdp.dev", subresource="status")
    assert not can(roles_cluster, role, "patch", "fsdptrainings.training.fsdp.dev", subresource="status")
    # A RoleBinding grants nothing outside its namespace.
    assert not can(roles_cluster, role, "get", "fsdptrainings.training.fsdp.dev", namespace="default")
    # And nothing beyond FSDPTrainings (e.g. the PyTorchJobs the operator creates).
    assert not can(roles_cluster, role, "create", "pytorchjobs.kubeflow.org")
