"""`bench/s3_upload.py` runs end to end on a tiny step (the timed run is `make bench`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "s3_upload.py"


def test_the_upload_bench_commits_a_step_and_prints_its_ratio() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", "2", "--mb-per-rank", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ratio (remote tier / plain):" in out.stdout and "commit lag" in out.stdout, out.stdout
