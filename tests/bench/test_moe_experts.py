"""`bench/moe_experts.py --dry-run`: every kernel runs the one-layer toy and matches eager's gradients."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "moe_experts.py"
ROW = re.compile(r"^\| (?P<kernel>\w+) \| [\d.]+ ms \| [\d,]+ \| (?P<speedup>[\d.]+)x \| (?P<diff>[\d.e+-]+) \|$", re.M)


def test_the_dry_run_times_each_kernel_against_the_loop() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {m["kernel"]: m for m in ROW.finditer(out.stdout)}
    assert list(rows) == ["eager", "grouped_mm", "batched_mm"], out.stdout
    assert float(rows["eager"]["speedup"]) == 1.0
    assert all(float(r["diff"]) <= 1e-4 for r in rows.values()), out.stdout
