"""DPO (full, LoRA) and SimPO against supervised fine-tuning of the same model on the same rows.

CPU (what `make bench` runs): the Qwen2-shaped base of ``lora_vs_full.py``
(about 25M parameters, random weights saved with ``save_pretrained``, the
embedded tokenizer), 2 gloo ranks, seqLen 256, micro-batch 2, fp32. The rows
are built from the embedded corpus: a prompt of 48 words, a chosen answer
(the 48 words that follow it) and a rejected one (48 words from elsewhere).
Supervised fine-tuning trains prompt + chosen (``data.format:
prompt-completion``); the preference runs train the pairs. Each repeat runs
every variant in turn, so background load hits them alike. Reported, medians
over the repeats, as ratios to SFT in the same invocation:

- positions/s: the steady-state tokens/s of the summary line (sequence
  positions, padding included; the same shape for every variant);
- rows/s: SFT rows, or preference pairs, trained per second. A pair is two
  sequences, so at equal positions/s it comes at half the rows; dpo also
  runs the reference forward (no gradient) on every micro-batch.

    python bench/dpo_vs_sft.py [--steps 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import yaml
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env
from fsdp_trainer.metrics.logline import SUMMARY_PATTERN
from lora_vs_full import build_base

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN, MICRO_BATCH, NPROC, WORDS = 256, 2, 2, 48
VARIANTS = {
    "sft": {"format": "prompt-completion", "objective": "lm"},
    "dpo": {"format": "preference", "objective": "dpo"},
    "dpo-lora": {"format": "preference", "objective": "dpo", "peft": {"rank": 16}},
    "simpo": {"format": "preference", "objective": "simpo"},
}


def corpus_words() -> list[str]:
    from fsdp_trainer.data.corpus import ASSET

    documents = json.loads(lzma.decompress(ASSET.read_bytes()))["documents"]
    return [word for document in documents for word in document.split()]


def write_rows(workdir: Path, count: int = 2000) -> tuple[Path, Path]:
    words, rng = corpus_words(), random.Random(0)
    pairs, sft = workdir / "pairs.jsonl", workdir / "sft.jsonl"
    with open(pairs, "w") as p, open(sft, "w") as s:
        for _ in range(count):
            at, other = rng.randrange(len(words) - 2 * WORDS), rng.randrange(len(words) - WORDS)
            prompt, chosen = " ".join(words[at : at + WORDS]), " ".join(words[at + WORDS : at + 2 * WORDS])
            rejected = " ".join(words[other : other + WORDS])
            p.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
            s.write(json.dumps({"prompt": prompt, "completion": chosen}) + "\n")
    return pairs, sft


def config(base: Path, data: Path, workdir: Path, steps: int, variant: dict) -> dict:
    cfg = {
        "job": {"name": "bench-dpo", "namespace": "bench"},
        "model": {"pretrained": str(base)},
        "data": {"path": str(data), "format": variant["format"]},
        "training": {
            "objective": variant["objective"],
            "maxSteps": steps,
            "seqLen": SEQ_LEN,
            "microBatchSize": MICRO_BATCH,
            "precision": "fp32",
            "learningRate": 1e-5,
            "logIntervalSteps": 10,
        },
        "checkpoint": {"dir": str(workdir / "checkpoints"), "intervalSteps": 100000, "resume": "never"},
        "metrics": {"enabled": False},
    }
    if "peft" in variant:
        cfg["peft"] = variant["peft"]
        cfg["training"]["learningRate"] = 2e-4
    return cfg


def run(base: Path, data: Path, workdir: Path, steps: int, name: str, tag: str) -> dict:
    work = workdir / tag
    work.mkdir(parents=True)
    path = work / "train.yaml"
    path.write_text(yaml.safe_dump(config(base, data, work, steps, VARIANTS[name]), sort_keys=False))
    trace = work / "trace"
    cmd = torchrun_standalone(NPROC, trainer_program(path, "--trace-dir", str(trace)))
    done = subprocess.run(cmd, env=local_env(NPROC, threads=1), capture_output=True, text=True, check=False)
    (workdir / f"{tag}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{tag} exited {done.returncode}; output in {workdir / f'{tag}.log'}")
    m = SUMMARY_PATTERN.search(done.stdout)
    assert m, f"no summary line in {workdir / f'{tag}.log'}"
    steps_done, seconds = int(m["n"]), float(m["seconds"])
    records = [json.loads(line) for rank in range(NPROC) for line in (trace / f"trace-rank{rank}.jsonl").open()]
    measured = [r for r in records if r["event"] == "step" and r["step"] > steps - steps_done]
    rows = sum(len(sample.split("+")) for r in measured for sample in r["samples"])
    shutil.rmtree(work)
    return {"positions_per_s": steps_done * SEQ_LEN * MICRO_BATCH * NPROC / seconds, "rows_per_s": rows / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-dpo-"))
    base = build_base(workdir / "base")
    pairs, sft = write_rows(workdir)
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for i in range(args.repeats):
        for name in VARIANTS:
            data = sft if name == "sft" else pairs
            results[name].append(run(base, data, workdir, args.steps, name, f"{name}-{i}"))
    print(f"{'':10} {'positions/s':>12} {'ratio':>6} {'rows/s':>8} {'ratio':>6}   (rows: SFT rows, or pairs)")
    ref = {k: statistics.median(r[k] for r in results["sft"]) for k in ("positions_per_s", "rows_per_s")}
    for name, runs in results.items():
        pos = statistics.median(r["positions_per_s"] for r in runs)
        rows = statistics.median(r["rows_per_s"] for r in runs)
        ratios = f"{pos / ref['positions_per_s']:>6.2f} {rows:>8.2f} {rows / ref['rows_per_s']:>6.2f}"
        print(f"{name:10} {pos:>12,.0f} {ratios}")
    out = REPO / "runs" / "bench-dpo.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"per-run figures in {out}")
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
