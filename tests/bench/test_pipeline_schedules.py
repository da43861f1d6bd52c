"""`bench/pipeline_schedules.py --dry-run`: both schedules run 2 stages of a toy model and report an idle share."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "pipeline_schedules.py"
ROW = re.compile(r"^\| (?P<schedule>\w+) \| 2 \| [\d.]+ \| [\d.]+ \| (?P<idle>-?\d+)% \| 33% \|$", re.M)


def test_the_dry_run_times_each_schedule_against_one_process() -> None:
    cmd = [sys.executable, str(SCRIPT), "--dry-run", "--micro-batches", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {m["schedule"]: int(m["idle"]) for m in ROW.finditer(out.stdout)}
    assert list(rows) == ["1F1B", "GPipe"], out.stdout
    # A toy on gloo is all overhead, but a share is a share.
    assert all(-100 < idle < 100 for idle in rows.values()), rows
