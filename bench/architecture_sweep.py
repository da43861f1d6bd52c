"""Which Hugging Face causal-LM architectures the trainer trains: every model type, from a tiny config.

For every model type in transformers' causal-LM mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``):

1. **build**: the type's config class with its numbers shrunk (width 64, 2 layers, 4 heads,
   4 experts, vocabulary 4160 for the embedded tokenizer), a random model from
   ``AutoModelForCausalLM.from_config`` saved with ``save_pretrained`` and the embedded
   tokenizer beside it. A type transformers cannot build that small is "not built" (not ours).
2. **check**: the pod's config check, in this process (``fsdp_trainer.check.check``):
   a refusal is one ``field: message`` line, kept as the reason.
3. **train**: 3 steps on 2 CPU ranks under torchrun (gloo, fp32, FULL_SHARD), the
   embedded corpus, a checkpoint at step 3; then ``fsdp-train export`` and
   ``AutoModelForCausalLM.from_pretrained`` of the export.

"trains" needs all three: exit 0, finite losses at steps 1-3, an export that loads.
Anything else is "fails", with the last error line. Not in CI (minutes of CPU per type);
the table in docs/architectures.md comes from it.

    python bench/architecture_sweep.py [--jobs 4] [--only llama,gpt2] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.launch import local_env, torchrun_standalone, trainer_program

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "trainer" / "fsdp_trainer" / "assets" / "tokenizer"
VOCAB = 4160  # the embedded tokenizer (4097 tokens), rounded up to a multiple of 64
STEPS = 3

# Shrunk wherever a config has the field (names vary by family); the config's own
# __init__ then derives what depends on them (layer_types, head_dim...).
TINY: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "n_embed", "dim", "embed_dim", "model_dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "decoder_layers", "n_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "decoder_attention_heads", "n_heads"), 4),
    "num_key_value_heads": 2,
    "head_dim": 16,
    **dict.fromkeys(
        ("intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim", "d_ff", "ffn_hidden_size", "ff_dim"), 128
    ),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 64),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k"), 2),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"), 128),
    **dict.fromkeys(("vocab_size", "padded_vocab_size"), VOCAB),
}


# A config's default special-token ids point into its own (large) vocabulary: with the
# vocabulary shrunk they would be out of range (an embedding's padding_idx refuses that), so
# they become the embedded tokenizer's, which the model is trained with anyway.
TOKEN_IDS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "decoder_start_token_id": 0, "sep_token_id": 1}


def _token_ids(config: dict[str, Any]) -> dict[str, Any]:
    def in_range(key: str, value: Any) -> Any:
        if isinstance(value, int) and value >= VOCAB:
            return TOKEN_IDS[key]
        if isinstance(value, list):
            return [in_range(key, v) for v in value]
        return value

    return {k: in_range(k, config[k]) for k in TOKEN_IDS if config.get(k) is not None}


@dataclass
class Result:
    model_type: str
    outcome: str  # trains | refused | fails | not built
    detail: str = ""
    params: int = 0
    seconds: float = 0.0


def tiny_config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    kwargs = {k: v for k, v in TINY.items() if k in defaults and isinstance(defaults[k], int)}
    kwargs |= _token_ids(defaults)
    text = defaults.get("text_config")
    if isinstance(text, dict):  # a composite config: shrink its language model
        small = {k: v for k, v in TINY.items() if k in text and isinstance(text[k], int)}
        kwargs["text_config"] = {**text, **small, **_token_ids(text)}
    return cls(**kwargs)


def last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("fsdp-train:") or re.match(r"^\s*[a-z]+(\.[a-zA-Z]+)+: ", line)]
    errors = [
        line
        for line in lines
        if re.search(r"(Error|Exception)\b.*:", line) and "ChildFailedError" not in line and "elastic" not in line
    ]
    return (ours or errors or lines or ["(no output)"])[-1][:300]


# A tiny model has well under this; more means fields the shrink does not know (blt's hash
# embeddings built a 23 GB model and the kernel killed the sweep): said, not built.
MAX_PARAMS = 50_000_000


class TooLarge(Exception):
    pass


def build(model_type: str, root: Path) -> tuple[Path, int]:
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    with torch.device("meta"):  # counted first, without memory
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if params > MAX_PARAMS:
        raise TooLarge(f"{params:,} parameters after the shrink (fields it does not know); over {MAX_PARAMS:,}")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    # transformers' own forward on the shrunk config: when it fails, the shrink made an
    # inconsistent config (e.g. rotary sizes it does not know), which says nothing of the trainer.
    with torch.no_grad():
        model(input_ids=torch.randint(3, 200, (1, 16)), labels=torch.randint(3, 200, (1, 16)))
    path = root / "model"
    model.save_pretrained(path)
    for file in TOKENIZER.iterdir():
        shutil.copy(file, path / file.name)
    return path, sum(p.numel() for p in model.parameters())


def trainer_config(root: Path, model: Path) -> Path:
    cfg = {
        "job": {"name": "sweep"},
        "model": {"pretrained": str(model)},
        "data": {},
        "training": {
            "maxSteps": STEPS,
            "seqLen": 32,
            "microBatchSize": 2,
            "precision": "fp32",
            "learningRate": 1e-3,
            "warmupSteps": 1,
            "logIntervalSteps": 1,
        },
        "fsdp": {"shardingStrategy": "full"},
        "checkpoint": {"dir": str(root / "checkpoints"), "intervalSteps": STEPS},
        "metrics": {"enabled": False},
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def check(config: Path) -> str | None:
    """The pod's config check, in this process: None, or the refusal's lines."""
    from fsdp_trainer.check import check as config_check
    from fsdp_trainer.errors import ConfigError

    try:
        config_check(str(config), "1", 2)
    except ConfigError as e:
        return " / ".join(e.lines)
    return None


def train_and_export(root: Path, config: Path, timeout: float) -> tuple[str, str]:
    env = {**local_env(1, threads=1), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    trace = root / "trace"
    cmd = torchrun_standalone(2, trainer_program(config, "--trace-dir", str(trace)))
    try:
        run = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "fails", f"still training after {timeout:.0f} s"
    if run.returncode != 0:
        out = run.stdout + run.stderr
        return ("refused" if run.returncode == 2 else "fails"), last_error(out)
    losses = [r["loss"] for r in map(json.loads, (trace / "trace-rank0.jsonl").open()) if r["event"] == "step"]
    if len(losses) != STEPS or not all(math.isfinite(x) for x in losses):
        return "fails", f"losses {losses}"
    exported = root / "hf"
    cmd = [sys.executable, "-m", "fsdp_trainer", "export", "--checkpoint", str(root / "checkpoints" / "step-00000003")]
    out = subprocess.run([*cmd, "--output", str(exported)], env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        return "fails", "export: " + last_error(out.stdout + out.stderr)
    probe = f"from transformers import AutoModelForCausalLM as A; A.from_pretrained({str(exported)!r})"
    loaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=timeout)
    if loaded.returncode != 0:
        return "fails", "the export does not load: " + last_error(loaded.stderr)
    return "trains", f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    return fn(*args), time.monotonic() - t0


def build_and_check(model_type: str, root: Path) -> tuple[Result, Path | None]:
    """The type's tiny model and the config check: a final Result, or one still to train (and its config)."""
    t0 = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    try:
        model, params = build(model_type, root)
    except Exception as e:  # transformers' own limits on a tiny config: not the trainer's
        return Result(model_type, "not built", f"{type(e).__name__}: {str(e).splitlines()[0][:250]}"), None
    config = trainer_config(root, model)
    refusal = check(config)
    result = Result(model_type, "refused" if refusal else "", refusal or "", params, time.monotonic() - t0)
    return result, None if refusal else config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 3))
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    import torch
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()
    types = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.only:
        types = [t for t in args.only.split(",") if t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {len(types)} model types", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="arch-sweep-"))
    # Build and check here, one type after another (transformers' imports are not thread-safe);
    # the torchrun launches, which are separate processes, run in parallel.
    results: list[Result] = []

    lock = threading.Lock()  # results come from the main thread and from the pool's callbacks

    def report(result: Result) -> None:
        """Each result as it comes, on stdout and in --out (a sweep cut short keeps what it found)."""
        with lock:
            results.append(result)
            print(f"{result.model_type}: {result.outcome}: {result.detail}", flush=True)
            if args.out:
                args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))

    def finish(result: Result, future: Future) -> None:
        (result.outcome, result.detail), seconds = future.result()
        result.seconds += seconds
        shutil.rmtree(workdir / result.model_type, ignore_errors=True)
        report(result)

    with ThreadPoolExecutor(args.jobs) as pool:
        for t in types:
            result, config = build_and_check(t, workdir / t)
            if config is None:
                report(result)
            else:
                future = pool.submit(timed, train_and_export, workdir / t, config, args.timeout)
                future.add_done_callback(lambda f, r=result: finish(r, f))
    results.sort(key=lambda r: r.model_type)
    print("\n| model type | result | parameters | detail |\n| --- | --- | ---: | --- |")
    for r in results:
        print(f"| `{r.model_type}` | {r.outcome} | {r.params:,} | {r.detail.replace('|', '/')} |")
    counts = {k: sum(r.outcome == k for r in results) for k in ("trains", "refused", "fails", "not built")}
    built = len(results) - counts["not built"]
    tried = f"{len(results)} tried of {len(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)} mapped"
    print(f"\n{counts['trains']} of {built} built types train ({tried}); {counts}")
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
