"""Tokens/s of our trainer against a minimal FSDP2 loop, same model, ranks, batch and steps.

CPU (default; what `make bench` runs): the tiny preset on 2 gloo ranks, then
the same numbers as a Qwen2 architecture (q/k/v biases; ``model.architecture``
with random init, the path any Hugging Face model takes). Each
repeat runs our trainer (torchrun -m fsdp_trainer, metrics endpoint on, data
from the embedded corpus) and then bench/minimal_fsdp2.py, alternating so
that background load hits both alike. Throughput is steady state: wall clock
from the end of the first 3 steps to the last step, so start-up and warm-up
are excluded from both. The result is printed as the ratio trainer/minimal
(target >= 0.95).

GPU (``--gpu``, on a machine with CUDA GPUs): llama3.2-1b, bf16, one rank per
GPU; first the trainer/minimal ratio at seqLen 2048, then tokens/s and MFU per
GPU and peak memory (next to the memory plan's estimate) at seqLen 2048 and
4096, with and without full activation checkpointing, torch.compile and the
chunked loss. ``--quick`` is the subset that fits one 8-minute device lease
(and adds float8 rows); ``--rows`` reruns named rows; ``--dry-run`` runs the same path on the CPU (tiny
preset, 2 gloo ranks, seqLen 64, 5 steps), so that tests catch a break in it
without a GPU.

    python bench/trainer_throughput.py [--steps 30] [--repeats 2] [--nproc 2]
    python bench/trainer_throughput.py --gpu [--quick | --dry-run] [--steps N] [--micro-batch-size 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import yaml
from fsdp_api.contract import TRAINER_METRICS
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env
from fsdp_api.memory_plan import plan_memory
from fsdp_api.ports import free_port
from fsdp_api.spec import FSDPTrainingSpec
from fsdp_trainer.metrics.logline import MFU_PATTERN, PEAK_MEMORY_PATTERN, SUMMARY_PATTERN, parse_bytes

REPO = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 3  # the trainer's MetricsProcessor.SUMMARY_WARMUP_STEPS
STEPS, REPEATS = 30, 2  # the defaults of the CPU run and of the full GPU run


# The tiny preset's numbers as a Qwen2 config.json (vocabulary of the embedded tokenizer).
QWEN2_TINY = {
    "model_type": "qwen2",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def write_architecture(workdir: Path, config: dict) -> Path:
    path = workdir / f"{config['model_type']}-config"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


@dataclass(frozen=True)
class Setup:
    preset: str
    nproc: int
    seq_len: int
    micro_batch_size: int
    steps: int
    precision: str
    activation_checkpointing: bool = False
    compile: bool = False
    architecture: Path | None = None  # a config.json directory instead of the preset
    logits: str = "chunked"  # training.logits of the trainer's runs (the minimal loop: full logits)
    vocab_size: int | None = None  # the preset's, unless set (model.config.vocabSize)

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch_size * self.seq_len * self.nproc

    def label(self) -> str:
        ac = "AC full" if self.activation_checkpointing else "no AC"
        model = f"{self.architecture.name}" if self.architecture else self.preset
        return f"{model} seq {self.seq_len} mbs {self.micro_batch_size} {ac}{' compile' if self.compile else ''}"


class Row(NamedTuple):
    """One row of the GPU table (micro_batch None: the run's ``--micro-batch-size``)."""

    seq_len: int
    activation_checkpointing: bool
    compile: bool
    logits: str = "chunked"
    micro_batch: int | None = None
    precision: str | None = None  # None: the run's (bf16 on the GPU)

    def describe(self) -> str:
        ac, comp = "full" if self.activation_checkpointing else "none", "compile" if self.compile else "eager"
        extra = f"/mbs {self.micro_batch}" if self.micro_batch else ""
        extra += f"/{self.precision}" if self.precision else ""
        return f"{self.seq_len}/{ac}/{comp}/{self.logits}{extra}"


@dataclass(frozen=True)
class GpuRun:
    """What one ``--gpu`` invocation measures: the real run, ``--quick``, or ``--dry-run`` on the CPU."""

    preset: str
    precision: str
    device: str  # "cuda", or "cpu" for the dry run (gloo, CUDA hidden)
    ratio_seq_len: int  # the trainer/minimal ratio runs here, no checkpointing, eager
    rows: tuple[Row, ...]
    steps: int
    repeats: int
    ratio: bool = True  # False: the table alone (--rows)

    def describe(self, device_name: str, nproc: int, micro_batch_size: int) -> str:
        rows = ", ".join(row.describe() for row in self.rows)
        return (
            f"GPU bench on {device_name} x {nproc}: {self.preset} {self.precision}, micro-batch {micro_batch_size}, "
            f"{self.steps} steps (timed after {WARMUP_STEPS}), {self.repeats} repeat(s), "
            f"ratio at seqLen {self.ratio_seq_len}; rows (seqLen/AC/compile/logits): {rows}"
        )


GPU_FULL = GpuRun(
    "llama3.2-1b",
    "bf16",
    "cuda",
    2048,
    tuple(Row(*r) for r in itertools.product((2048, 4096), (False, True), (False, True), ("full", "chunked"))),
    STEPS,
    REPEATS,
)
# The 8-row matrix at 15 steps took ~8.5 min on one H200 (about 50 s a run, start-up bound):
# nine runs in all (the three comparisons' five, four more rows) fit one call. Full logits
# against the chunked loss (the comparisons' own runs), then compiled bf16 against float8 at
# micro-batch 1 and 2: the same batch either way, so the float8 speed-up shows.
GPU_QUICK = dataclasses.replace(
    GPU_FULL,
    rows=(
        Row(2048, False, False, "full"),
        Row(2048, False, False, "chunked"),
        Row(4096, False, True, "chunked"),
        Row(4096, False, True, "chunked", precision="float8"),
        Row(4096, False, True, "chunked", 2),
        Row(4096, False, True, "chunked", 2, precision="float8"),
    ),
    steps=15,
    repeats=1,
)
# Compile stays off: inductor on the CPU needs a C++ toolchain and minutes.
# Both rows are the comparisons' own trainer runs (the minimal loop's, torchtitan's): five launches.
GPU_DRY_RUN = GpuRun("tiny", "bf16", "cpu", 64, (Row(64, False, False), Row(64, False, False, "full")), 5, 1)


@dataclass(frozen=True)
class Result:
    tokens_per_second: float
    # Tokens per second of rank 0's process CPU time: what the code costs,
    # largely independent of other load on a shared machine.
    tokens_per_cpu_second: float
    mfu: float | None = None
    peak_memory: str = ""
    nvml: tuple[str, ...] = ()  # the GPU series of the trainer's /metrics, as last scraped during the run
    scrapes: int = 0  # how often /metrics answered during the run


def _env(nproc: int, gpu: bool, workdir: Path) -> dict[str, str]:
    # One thread per rank unless OMP_NUM_THREADS says otherwise, for both loops alike.
    threads = None if "OMP_NUM_THREADS" in os.environ else 1
    return local_env(nproc, metrics_dir=workdir / "metrics-files", cpu=not gpu, threads=threads)


# What the trainer exports from NVML (GPU ranks only), as the contract names them.
NVML_SERIES = tuple(name for m in TRAINER_METRICS if m.gpu_only for name in m.series())


class MetricsWatch:
    """Scrapes a trainer's /metrics while it runs and keeps the last scrape's GPU (NVML) series.

    The endpoint lives only as long as the run, so it is read during it, every ``period`` seconds.
    """

    def __init__(self, port: int, period: float = 1.0) -> None:
        self.url, self.period = f"http://127.0.0.1:{port}/metrics", period
        self.scrapes, self.gpu_lines = 0, ()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                continue  # not serving yet, or already gone
            self.scrapes += 1
            lines = tuple(x for x in text.splitlines() if x.startswith(NVML_SERIES))
            if lines:
                self.gpu_lines = lines

    def __enter__(self) -> MetricsWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _run(cmd: list[str], env: dict[str, str], log: Path) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    log.write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}; output in {log}")
    return done.stdout


def training_section(s: Setup) -> dict:
    """The spec's training section of a setup (the trainer's config and the memory plan read the same)."""
    return {
        "maxSteps": s.steps,
        "seqLen": s.seq_len,
        "microBatchSize": s.micro_batch_size,
        "precision": s.precision,
        "activationCheckpointing": "full" if s.activation_checkpointing else "none",
        "compile": s.compile,
        "logits": s.logits,
    }


def model_section(s: Setup) -> dict:
    if s.architecture:
        return {"architecture": str(s.architecture)}
    return {"preset": s.preset} | ({"config": {"vocabSize": s.vocab_size}} if s.vocab_size else {})


def trainer_config(s: Setup, workdir: Path) -> dict:
    return {
        "job": {"name": "bench", "namespace": "bench"},
        "model": model_section(s),
        "training": {
            **training_section(s),
            "logIntervalSteps": 10,
            "evalIntervalSteps": 0,
        },
        # Only the final save, after the timed steps.
        "checkpoint": {"dir": str(workdir / "checkpoints"), "intervalSteps": s.steps * 10, "resume": "never"},
        "metrics": {"enabled": True, "port": free_port()},
    }


def run_trainer(s: Setup, workdir: Path, gpu: bool, tag: str) -> Result:
    config = workdir / f"train-{tag}.yaml"
    cfg = trainer_config(s, workdir / tag)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    try:
        with MetricsWatch(cfg["metrics"]["port"]) as watch:
            out = _run(
                torchrun_standalone(s.nproc, trainer_program(config)),
                _env(s.nproc, gpu, workdir),
                workdir / f"{tag}.log",
            )
    finally:
        # The final checkpoint (written after the timed steps) is ~15 GB for 1B: drop it.
        shutil.rmtree(workdir / tag, ignore_errors=True)
    m = SUMMARY_PATTERN.search(out)
    if m is None:
        raise SystemExit(f"no summary line in the trainer's output ({workdir / f'{tag}.log'})")
    n, seconds, cpu = int(m["n"]), float(m["seconds"]), float(m["cpu"])
    mfu, mem = MFU_PATTERN.search(m[0]), PEAK_MEMORY_PATTERN.search(m[0])
    tokens = n * s.tokens_per_step
    mfu_ratio = float(mfu["mfu"]) / 100 if mfu else None
    return Result(tokens / seconds, tokens / cpu, mfu_ratio, mem["mem"] if mem else "", watch.gpu_lines, watch.scrapes)


def run_reference(script: str, name: str, s: Setup, workdir: Path, gpu: bool, tag: str) -> tuple[Result, dict]:
    """One reference program of bench/ under torchrun on the same setup; its ``BENCH_RESULT`` as a Result."""
    program = [str(REPO / "bench" / script)]
    program += ["--architecture", str(s.architecture)] if s.architecture else ["--preset", s.preset]
    program += ["--seq-len", str(s.seq_len), "--micro-batch-size", str(s.micro_batch_size)]
    program += ["--steps", str(s.steps), "--warmup-steps", str(WARMUP_STEPS), "--precision", s.precision]
    program += ["--activation-checkpointing"] if s.activation_checkpointing else []
    program += ["--compile"] if s.compile else []
    out = _run(torchrun_standalone(s.nproc, program), _env(s.nproc, gpu, workdir), workdir / f"{tag}.log")
    line = next((x for x in out.splitlines() if x.startswith("BENCH_RESULT ")), None)
    if line is None:
        raise SystemExit(f"no BENCH_RESULT in {name}'s output ({workdir / f'{tag}.log'})")
    r = json.loads(line.removeprefix("BENCH_RESULT "))
    tokens = r["steps"] * s.tokens_per_step
    peak = f"{r['peak_memory_bytes'] / 2**30:.1f} GiB"
    return Result(tokens / r["seconds"], tokens / r["cpu_seconds"], None, peak), r


def run_minimal(s: Setup, workdir: Path, gpu: bool, tag: str) -> Result:
    return run_reference("minimal_fsdp2.py", "the minimal loop", s, workdir, gpu, tag)[0]


def run_accelerate(s: Setup, workdir: Path, gpu: bool, tag: str) -> Result:
    result, r = run_reference("accelerate_fsdp2.py", "Accelerate", s, workdir, gpu, tag)
    if r["distributed_type"] != "DistributedType.FSDP":
        # Accelerate switches to FSDP only for accelerator devices (GPU, NPU, XPU ...):
        # on the CPU its AcceleratorState keeps MULTI_CPU, i.e. DDP (accelerate/state.py).
        print(f"  note: Accelerate ran {r['distributed_type']} (DDP), not FSDP, on this device", flush=True)
    return result


def run_torchtitan(s: Setup, workdir: Path, gpu: bool, tag: str) -> Result:
    return run_reference("torchtitan_llama.py", "torchtitan", s, workdir, gpu, tag)[0]


def compare(
    s: Setup, repeats: int, workdir: Path, gpu: bool, reference=run_minimal
) -> tuple[list[Result], list[Result]]:
    ours: list[Result] = []
    minimal: list[Result] = []
    for i in range(repeats):
        ours.append(run_trainer(s, workdir, gpu, f"trainer-{i}"))
        minimal.append(reference(s, workdir, gpu, f"reference-{i}"))
        o, m = ours[-1], minimal[-1]
        print(
            f"  repeat {i + 1}: trainer {o.tokens_per_second:,.0f} tok/s ({o.tokens_per_cpu_second:,.0f} per CPU-s), "
            f"reference {m.tokens_per_second:,.0f} tok/s ({m.tokens_per_cpu_second:,.0f} per CPU-s)",
            flush=True,
        )
    return ours, minimal


def report_ratio(
    ours: list[Result], minimal: list[Result], *, cpu_time: bool, name: str = "minimal FSDP2", target: float = 0.95
) -> None:
    wall_o = statistics.median(r.tokens_per_second for r in ours)
    wall_m = statistics.median(r.tokens_per_second for r in minimal)
    cpu_o = statistics.median(r.tokens_per_cpu_second for r in ours)
    cpu_m = statistics.median(r.tokens_per_cpu_second for r in minimal)
    print(f"trainer {wall_o:,.0f} tok/s | {name} {wall_m:,.0f} tok/s | ratio {wall_o / wall_m:.3f} (target {target})")
    if cpu_time:  # on a GPU the host's CPU time says nothing about speed
        print(f"per CPU-second of rank 0: trainer {cpu_o:,.0f} | {name} {cpu_m:,.0f} | ratio {cpu_o / cpu_m:.3f}")


def cpu_bench(args: argparse.Namespace, workdir: Path) -> None:
    s = Setup("tiny", args.nproc, args.seq_len or 256, args.micro_batch_size or 8, args.steps or STEPS, "fp32")
    qwen2 = dataclasses.replace(s, architecture=write_architecture(workdir, QWEN2_TINY))
    repeats = args.repeats or REPEATS
    if args.accelerate:
        print(f"CPU: {qwen2.label()} vs Hugging Face Accelerate (FSDP2 plugin), {s.nproc} ranks (gloo)", flush=True)
        results = compare(qwen2, repeats, workdir, gpu=False, reference=run_accelerate)
        report_ratio(*results, cpu_time=True, name="Accelerate", target=1.1)
        return
    for setup in (s, qwen2):
        print(f"CPU: {setup.label()}, {s.nproc} ranks (gloo), {s.steps} steps, timed after {WARMUP_STEPS}", flush=True)
        report_ratio(*compare(setup, repeats, workdir, gpu=False), cpu_time=True)


# Llama 3's vocabulary, where the loss's buffers outgrow the model (the chunked loss's case).
LLAMA3_VOCAB = 128_256


def cpu_logits_bench(args: argparse.Namespace, workdir: Path) -> None:
    """Peak memory and speed of full logits against the chunked loss at a 128,256 vocabulary, on the CPU.

    The peak is rank 0's resident set (what the trainer's summary line reports on a CPU), so
    it includes the libraries; the plan's figure is its tensor estimate of the same job.
    """
    steps = args.steps or 8
    base = Setup("tiny", args.nproc, args.seq_len or 256, args.micro_batch_size or 4, steps, "fp32")
    base = dataclasses.replace(base, vocab_size=LLAMA3_VOCAB)
    print(
        f"CPU: tiny with a {LLAMA3_VOCAB:,} vocabulary, {base.nproc} ranks (gloo), {base.micro_batch_size} x "
        f"{base.seq_len} tokens per rank, fp32, {steps} steps, timed after {WARMUP_STEPS}: full logits vs chunked",
        flush=True,
    )
    print("| logits | tokens/s | tokens per CPU-s | peak memory (RSS, rank 0) | plan (tensors) |")
    print("| --- | ---: | ---: | ---: | ---: |", flush=True)
    results = {}
    for logits in ("full", "chunked"):
        s = dataclasses.replace(base, logits=logits)
        r = results[logits] = run_trainer(s, workdir, False, f"logits-{logits}")
        cells = [logits, f"{r.tokens_per_second:,.0f}", f"{r.tokens_per_cpu_second:,.0f}", r.peak_memory]
        print("| " + " | ".join([*cells, planned_memory(s, False)]) + " |", flush=True)
    full, chunked = results["full"], results["chunked"]
    print(
        f"chunked / full: peak memory {parse_bytes(chunked.peak_memory) / parse_bytes(full.peak_memory):.2f}, "
        f"tokens/s {chunked.tokens_per_second / full.tokens_per_second:.2f}",
        flush=True,
    )


def gpu_run(args: argparse.Namespace) -> GpuRun:
    run = GPU_DRY_RUN if args.dry_run else GPU_QUICK if args.quick else GPU_FULL
    run = dataclasses.replace(run, steps=args.steps or run.steps, repeats=args.repeats or run.repeats)
    if getattr(args, "rows", None):
        # A subset to rerun inside a short lease: rows named as the settings line prints them.
        wanted = [w.strip() for w in args.rows.split(",")]
        every = {row.describe(): row for row in (*GPU_FULL.rows, *GPU_QUICK.rows, *run.rows)}
        unknown = [w for w in wanted if w not in every]
        if unknown:
            raise SystemExit(f"--rows: unknown row(s) {', '.join(unknown)}; known: {', '.join(every)}")
        run = dataclasses.replace(run, rows=tuple(every[w] for w in wanted), ratio=False)
    return run


def gpu_bench(args: argparse.Namespace, workdir: Path) -> None:
    run = gpu_run(args)
    on_gpu = run.device == "cuda"
    if on_gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--gpu needs CUDA GPUs (--dry-run runs the same path on the CPU)")
        nproc = args.nproc if args.nproc_given else torch.cuda.device_count()
        device_name = torch.cuda.get_device_name(0)
    else:
        nproc, device_name = args.nproc, "CPU (dry run, gloo)"
    mbs = args.micro_batch_size or 1
    print(run.describe(device_name, nproc, mbs), flush=True)

    def setup(row: Row) -> Setup:
        return Setup(
            run.preset,
            nproc,
            row.seq_len,
            row.micro_batch or mbs,
            run.steps,
            row.precision or run.precision,
            row.activation_checkpointing,
            row.compile,
            logits=row.logits,
        )

    # A lease is too short to run one setup twice: the table reuses the comparisons' trainer runs.
    measured: dict[Setup, Result] = {}

    def trainer_result(s: Setup, tag: str) -> Result:
        if s not in measured:
            measured[s] = run_trainer(s, workdir, on_gpu, tag)
        return measured[s]

    # The headline ratios first, so that a device lease cut short still reports them.
    ratio_row = Row(run.ratio_seq_len, False, False)
    if run.ratio:
        print(f"seqLen {run.ratio_seq_len}, no checkpointing, eager: trainer vs minimal FSDP2 loop", flush=True)
        ours, minimal = compare(setup(ratio_row), run.repeats, workdir, gpu=on_gpu)
        measured[setup(ratio_row)] = ours[0]
        report_ratio(ours, minimal, cpu_time=False)
        compare_accelerate(setup(ratio_row), ours, workdir, on_gpu)
        compare_torchtitan(setup(ratio_row._replace(logits="full")), trainer_result, workdir, on_gpu)
    unit = "GPU" if on_gpu else "rank"
    header = f"| seqLen | micro-batch | precision | activation ckpt | compile | logits | tokens/s/{unit} | MFU |"
    print(header + " peak memory | plan |")
    print("| ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: |", flush=True)
    for row in run.rows:
        s = setup(row)
        cells = [str(row.seq_len), str(s.micro_batch_size), s.precision]
        cells += ["full" if s.activation_checkpointing else "none", "on" if s.compile else "off", s.logits]
        tag = f"gpu-{row.seq_len}-{s.micro_batch_size}-{'ac' if s.activation_checkpointing else 'noac'}"
        tag += f"-{'compile' if s.compile else 'eager'}-{s.logits}-{s.precision}"
        try:
            r = trainer_result(s, tag)
        except SystemExit as e:  # e.g. out of memory at 4096 without checkpointing
            print("| " + " | ".join(cells) + f" | failed: {e} | | | |", flush=True)
            continue
        mfu = f"{r.mfu:.1%}" if r.mfu is not None else "n/a"
        cells += [f"{r.tokens_per_second / nproc:,.0f}", mfu, r.peak_memory, planned_memory(s, on_gpu)]
        print("| " + " | ".join(cells) + " |", flush=True)
    report_nvml(measured)


def compare_accelerate(s: Setup, ours: list[Result], workdir: Path, on_gpu: bool) -> None:
    """The same setup under Hugging Face Accelerate's FSDP2 plugin, against the trainer runs just made.

    A failure is one line, not the end of the bench: the table after it is what a short lease is for.
    """
    print(f"seqLen {s.seq_len}, no checkpointing, eager: trainer vs Hugging Face Accelerate FSDP2", flush=True)
    try:
        theirs = [run_accelerate(s, workdir, on_gpu, f"accelerate-{i}") for i in range(len(ours))]
    except SystemExit as e:
        print(f"Accelerate FSDP2: failed: {e}", flush=True)
        return
    for i, r in enumerate(theirs):
        print(f"  repeat {i + 1}: Accelerate {r.tokens_per_second:,.0f} tok/s, peak memory {r.peak_memory}", flush=True)
    report_ratio(ours, theirs, cpu_time=False, name="Accelerate FSDP2", target=1.1)


def compare_torchtitan(s: Setup, trainer_result, workdir: Path, on_gpu: bool) -> None:
    """The same shape under torchtitan's own trainer, against the trainer at the same settings.

    torchtitan's loss is the plain cross-entropy, so the trainer's run it is set against has full
    logits. A failure is one line, as for Accelerate.
    """
    print(f"seqLen {s.seq_len}, no checkpointing, eager, full logits: trainer vs torchtitan", flush=True)
    try:
        ours = trainer_result(s, "trainer-full-logits")
        theirs = run_torchtitan(s, workdir, on_gpu, "torchtitan")
    except SystemExit as e:
        print(f"torchtitan: failed: {e}", flush=True)
        return
    print(f"  torchtitan {theirs.tokens_per_second:,.0f} tok/s, peak memory {theirs.peak_memory}", flush=True)
    report_ratio([ours], [theirs], cpu_time=False, name="torchtitan", target=1.0)


def report_nvml(measured: dict[Setup, Result]) -> None:
    """What the trainer's /metrics served from NVML during the last run that had it (GPU ranks only)."""
    with_gpu = [(s, r) for s, r in measured.items() if r.nvml]
    scrapes = sum(r.scrapes for r in measured.values())
    if not with_gpu:
        print(
            f"NVML series on /metrics: none in {scrapes} scrapes of {len(measured)} runs "
            f"({', '.join(NVML_SERIES)} come from GPU ranks only)",
            flush=True,
        )
        return
    s, r = with_gpu[-1]
    print(f"NVML series on /metrics ({scrapes} scrapes in all), the last of {s.label()}:", flush=True)
    for line in r.nvml:
        print(f"  {line}", flush=True)


def planned_memory(s: Setup, on_gpu: bool) -> str:
    """``fsdp-operator plan``'s tensor estimate of the same job (the trainer reports allocated bytes too)."""
    spec = FSDPTrainingSpec.model_validate(
        {
            "image": "bench:plan",
            "model": model_section(s),
            "training": training_section(s),
            # an H100 node: float8 is admitted only where the GPUs have float8 tensor cores
            "resources": {"nodes": 1, "gpusPerNode": s.nproc, "instanceTypes": ["p5.48xlarge"]}
            if on_gpu
            else {"nodes": s.nproc, "gpusPerNode": 0},
        }
    )
    estimate = plan_memory(spec).estimate
    return f"{estimate.tensor_bytes / 2**30:.2f} GiB" if estimate is not None else "n/a"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="llama3.2-1b on the GPUs of this machine")
    p.add_argument(
        "--accelerate", action="store_true", help="CPU: the Qwen2 shape vs Hugging Face Accelerate FSDP2 (.[bench])"
    )
    p.add_argument("--logits", action="store_true", help="CPU: full logits vs the chunked loss at a 128,256 vocabulary")
    p.add_argument("--quick", action="store_true", help="with --gpu: the subset that fits an 8-minute lease")
    p.add_argument(
        "--dry-run", action="store_true", help="with --gpu: the same path on the CPU (tiny preset, 2 gloo ranks)"
    )
    p.add_argument("--steps", type=int, default=None, help=f"default {STEPS} (--quick 15, --dry-run 5)")
    p.add_argument("--repeats", type=int, default=None, help=f"default {REPEATS} (--quick and --dry-run 1)")
    p.add_argument("--nproc", type=int, default=None, help="ranks (CPU default 2, GPU default: all GPUs)")
    p.add_argument("--seq-len", type=int, default=None, help="CPU only (default 256, the example's)")
    p.add_argument("--micro-batch-size", type=int, default=None, help="default: 8 on CPU (the example's), 1 on GPU")
    p.add_argument("--keep", action="store_true", help="keep the work directory with the runs' logs")
    p.add_argument("--rows", help="with --gpu: only these rows, comma-separated as the settings line names them")
    args = p.parse_args()
    if (args.quick or args.dry_run) and not args.gpu:
        p.error("--quick and --dry-run go with --gpu")
    if args.quick and args.dry_run:
        p.error("--quick and --dry-run exclude each other")
    if args.steps is not None and args.steps <= WARMUP_STEPS:
        p.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")
    args.nproc_given = args.nproc is not None
    args.nproc = args.nproc or 2
    workdir = Path(tempfile.mkdtemp(prefix="fsdp-bench-"))
    try:
        (gpu_bench if args.gpu else cpu_logits_bench if args.logits else cpu_bench)(args, workdir)
    finally:
        if args.keep:
            print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
