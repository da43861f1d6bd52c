"""The suite's tiers (tests/conftest.py, tests/slow_guard.py): what the unit tier runs, and its guard."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from fsdp_localcluster.binaries import ENV_UNIT_TIER, ToolBuildError, karpenter_crds, tool_path

from tests.conftest import INTEGRATION_PATHS

ROOT = Path(__file__).resolve().parents[1]

# Planted in a suite of its own: each test spends what its name says, against limits far below it.
PLANTED = textwrap.dedent(
    """
    import subprocess
    import sys
    import time

    import pytest


    def burn(seconds):
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass


    def test_quick():
        assert sum(range(100)) == 4950


    def test_burns_cpu_unmarked():
        burn(0.5)


    def test_burns_cpu_in_a_child_unmarked():
        subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                        "while time.process_time() - t < 0.5: pass"], check=True)


    def test_sleeps_unmarked():
        time.sleep(0.5)


    @pytest.mark.slow
    def test_burns_cpu_marked_slow():
        burn(0.5)


    @pytest.mark.slow
    def test_burns_cpu_and_fails_on_its_own():
        burn(0.5)
        assert False, "its own failure"
    """
)


def test_the_guard_fails_each_unmarked_test_over_its_limits_and_no_other(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FSDP_SLOW_CPU_SECONDS", "0.2")
    monkeypatch.setenv("FSDP_SLOW_WALL_SECONDS", "0.3")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest("-p", "tests.slow_guard", "-p", "no:cacheprovider")
    calls = {
        report.nodeid.split("::")[-1]: report
        for report in result.reprec.getreports("pytest_runtest_logreport")
        if report.when == "call"
    }
    assert {name: report.outcome for name, report in calls.items()} == {
        "test_quick": "passed",
        "test_burns_cpu_unmarked": "failed",
        "test_burns_cpu_in_a_child_unmarked": "failed",
        "test_sleeps_unmarked": "failed",
        "test_burns_cpu_marked_slow": "passed",
        "test_burns_cpu_and_fails_on_its_own": "failed",
    }
    # Read per report, not from the printed text: the summary lines (-ra in the suite's options) repeat them.
    said = {name: str(report.longrepr) for name, report in calls.items() if report.failed}
    for name in ("test_burns_cpu_unmarked", "test_burns_cpu_in_a_child_unmarked", "test_sleeps_unmarked"):
        assert "over the unit tier's 0.2 s of CPU or 0.3 s of wall time: mark it slow" in said[name], said[name]
    own = said["test_burns_cpu_and_fails_on_its_own"]
    assert "its own failure" in own and "mark it slow" not in own, "reported by its own failure"


def test_a_limit_that_is_no_number_is_one_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FSDP_SLOW_CPU_SECONDS", "five")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest("-p", "tests.slow_guard", "-p", "no:cacheprovider")
    assert "FSDP_SLOW_CPU_SECONDS='five' is not a number of seconds" in result.stderr.str() + result.stdout.str()
    assert result.ret != 0


def test_the_unit_tier_hands_out_no_binary_and_fetches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_UNIT_TIER, "1")
    with pytest.raises(ToolBuildError, match=r"the unit tier \(FSDP_UNIT_TIER is set\) has no kubectl: .*integration"):
        tool_path.__wrapped__("kubectl")
    with pytest.raises(ToolBuildError, match=r"has no Karpenter CRDs \(KARPENTER_MIN_VERSION\)"):
        karpenter_crds.__wrapped__("KARPENTER_MIN_VERSION")


def test_every_integration_folder_exists() -> None:
    for prefix in INTEGRATION_PATHS:
        assert list((ROOT / prefix).glob("test_*.py")), prefix
