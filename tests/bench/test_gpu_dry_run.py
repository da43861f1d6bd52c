"""`bench/trainer_throughput.py --gpu` without a GPU: its settings, and its whole path run on the CPU.

The GPU machine is lent rarely and briefly, so a break in the GPU path must show here first.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench.scripts import load_bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "trainer_throughput.py"
RATIO_LINE = re.compile(
    r"^trainer [\d,]+ tok/s \| minimal FSDP2 [\d,]+ tok/s \| ratio (?P<ratio>[\d.]+) ", re.MULTILINE
)
ACCELERATE_LINE = re.compile(
    r"^trainer [\d,]+ tok/s \| Accelerate FSDP2 (?P<theirs>[\d,]+) tok/s \| ratio (?P<ratio>[\d.]+) \(target 1.1\)$",
    re.MULTILINE,
)
TORCHTITAN_LINE = re.compile(
    r"^trainer [\d,]+ tok/s \| torchtitan (?P<theirs>[\d,]+) tok/s \| ratio (?P<ratio>[\d.]+) \(target 1.0\)$",
    re.MULTILINE,
)
NVML_NONE = re.compile(
    r"^NVML series on /metrics: none in (?P<scrapes>\d+) scrapes of (?P<runs>\d+) runs ", re.MULTILINE
)
TABLE_ROW = re.compile(
    r"^\| (?P<seq>\d+) \| (?P<mbs>\d+) \| (?P<precision>bf16|float8|fp32) \| (?P<ac>none|full) \| "
    r"(?P<compile>on|off) \| (?P<logits>chunked|full) \| "
    r"(?P<tps>[\d,]+) \| (?P<mfu>[^|]+) \| (?P<peak>[^|]+) \| (?P<plan>[\d.]+ GiB) \|$",
    re.MULTILINE,
)


def _bench() -> ModuleType:
    return load_bench_script("trainer_throughput")


def _args(**given: object) -> argparse.Namespace:
    defaults = {"quick": False, "dry_run": False, "steps": None, "repeats": None}
    return argparse.Namespace(**{**defaults, **given})


def test_each_gpu_run_has_its_settings() -> None:
    bench = _bench()
    full, quick, dry = (bench.gpu_run(_args(**a)) for a in ({}, {"quick": True}, {"dry_run": True}))
    assert (full.preset, full.device, full.steps, full.repeats, len(full.rows)) == ("llama3.2-1b", "cuda", 30, 2, 16)
    # --quick: full logits against the chunked loss at 15 steps, once; then compiled bf16 against
    # float8 at micro-batch 1 and 2 (those three rows are not in the full matrix).
    assert (quick.preset, quick.steps, quick.repeats) == ("llama3.2-1b", 15, 1)
    assert len(set(quick.rows) - set(full.rows)) == 3
    assert {(r.micro_batch, r.precision) for r in quick.rows if r.compile} == {
        (None, None),
        (None, "float8"),
        (2, None),
        (2, "float8"),
    }
    assert {row.logits for row in quick.rows} == {"full", "chunked"}
    assert {row.precision for row in quick.rows} == {None, "float8"}
    # --dry-run: the CPU, seqLen 64, the chunked loss and full logits, more steps than the warm-up.
    assert (dry.preset, dry.device, dry.steps, dry.repeats) == ("tiny", "cpu", 5, 1)
    assert dry.steps > bench.WARMUP_STEPS
    assert sorted(dry.rows) == [(64, False, False, "chunked", None, None), (64, False, False, "full", None, None)]
    assert bench.gpu_run(_args(quick=True, steps=20, repeats=3)).steps == 20
    assert bench.gpu_run(_args(quick=True, steps=20, repeats=3)).repeats == 3


@pytest.mark.slow
def test_gpu_path_runs_on_the_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--gpu", "--dry-run"], capture_output=True, text=True, timeout=900, check=False
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    first = out.splitlines()[0]
    assert first.startswith("GPU bench on CPU") and "tiny bf16" in first and "5 steps" in first, first

    ratio = RATIO_LINE.search(out)
    assert ratio is not None, out
    assert float(ratio["ratio"]) > 0
    # The ratio comes before the table, so that a lease cut short still reports it.
    assert ratio.start() < out.index("| seqLen |")
    # Then Hugging Face Accelerate on the same setup, against the same trainer runs; on the CPU
    # Accelerate does not shard (its FSDP plugin is for accelerators) and the bench says so.
    accelerate = ACCELERATE_LINE.search(out)
    assert accelerate is not None, out
    assert ratio.start() < accelerate.start() < out.index("| seqLen |")
    assert int(accelerate["theirs"].replace(",", "")) > 0
    assert "note: Accelerate ran DistributedType.MULTI_CPU (DDP), not FSDP, on this device" in out
    # Then torchtitan's own trainer (its PyPI release) on the preset's shape, against the trainer
    # with full logits like torchtitan's loss: one more trainer run, the table's second row.
    titan = TORCHTITAN_LINE.search(out)
    assert titan is not None, out
    assert accelerate.start() < titan.start() < out.index("| seqLen |")
    assert int(titan["theirs"].replace(",", "")) > 0 and float(titan["ratio"]) > 0
    assert "seqLen 64, no checkpointing, eager, full logits: trainer vs torchtitan" in out
    # The trainer's /metrics was read during its runs; a CPU exports no NVML series, and says so.
    nvml = NVML_NONE.search(out)
    assert nvml is not None, out
    assert int(nvml["runs"]) == 2 and int(nvml["scrapes"]) >= 1, nvml[0]

    rows = list(TABLE_ROW.finditer(out))
    expected = [
        (str(r.seq_len), "full" if r.activation_checkpointing else "none", "on" if r.compile else "off", r.logits)
        for r in _bench().GPU_DRY_RUN.rows
    ]
    assert [(r["seq"], r["ac"], r["compile"], r["logits"]) for r in rows] == expected, out
    for r in rows:
        assert int(r["tps"].replace(",", "")) > 0, r[0]
        assert r["mfu"] == "n/a", r[0]  # no peak TFLOP/s is known for a CPU


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "untied"), [("tiny", 4_999_424), ("llama3.2-1b", 1_498_482_688)])
def test_torchtitan_builds_the_presets_shape_with_an_untied_head(preset: str, untied: int) -> None:
    """torchtitan 0.2 has no tied Llama: its model is the preset's plus a head of vocab x hidden, no more."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "torchtitan_llama.py"), "--preset", preset, "--check-shape"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shape = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("SHAPE ")).removeprefix("SHAPE "))
    assert shape["parameters"] == shape["untied_parameters"] == untied, shape
