"""own_namespace's teardown: a failed test's namespace is cleared, a passed one's is kept (a fake cluster)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.e2e.namespaces import REPORTS, own_namespace


class _Whole:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.cluster = SimpleNamespace(create_namespace=lambda name: self.calls.append(("create", name)))

    def kubectl(self, *args: str, **_: Any) -> None:
        self.calls.append(args)


def _run(outcome: str) -> list[tuple[str, ...]]:
    whole = _Whole()
    node = SimpleNamespace(name="test_a_training_of_mine", stash=pytest.Stash())
    request = cast(pytest.FixtureRequest, SimpleNamespace(node=node))
    namespace = own_namespace(cast(Any, whole), "ft-", request)
    assert next(namespace) == "ft-a-training-of-mine"
    node.stash[REPORTS] = {"setup": SimpleNamespace(failed=False), "call": SimpleNamespace(failed=outcome == "failed")}
    with pytest.raises(StopIteration):
        next(namespace)
    return whole.calls


def test_a_failed_tests_pods_and_namespace_are_deleted() -> None:
    assert _run("failed") == [
        ("create", "ft-a-training-of-mine"),
        ("delete", "pods", "--all", "--namespace=ft-a-training-of-mine", "--grace-period=0", "--force"),
        ("delete", "namespace", "ft-a-training-of-mine", "--wait=false"),
    ]


def test_a_passed_tests_namespace_is_kept() -> None:
    assert _run("passed") == [("create", "ft-a-training-of-mine")]
