"""The suite's two-worker schedule (tests/conftest.py): the tests that share a machine-wide resource stay together."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SERIAL_GROUPS, serial_group

ROOT = Path(__file__).resolve().parents[1]


def test_the_whole_cluster_and_image_tests_are_serial_groups_and_the_rest_is_not() -> None:
    assert serial_group("tests/e2e/test_faults.py::test_killed_worker") == "whole-cluster"
    assert serial_group("tests/e2e/test_kueue.py::test_a_second_training[x]") == "whole-cluster"
    assert serial_group("tests/images/test_kubelet.py::test_sigterm") == "images"
    assert serial_group("tests/operator/controller/test_operator_e2e.py::test_x") is None
    assert serial_group("tests/e2etrick/test_x.py::t") is None


def test_every_serial_group_names_a_test_folder_that_exists() -> None:
    for prefix in SERIAL_GROUPS:
        assert list((ROOT / prefix).glob("test_*.py")), prefix
