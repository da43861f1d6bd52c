"""Which Hugging Face causal-LM architectures the trainer trains: every model type, from a tiny config.

For every model type in transformers' causal-LM mapping (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``):

1. **build**: the type's config class with its numbers shrunk (width 64, 2 layers, 4 heads,
   4 experts, vocabulary 4160 for the embedded tokenizer; sub-configs alike, per-layer fields
   cut to one layer of each kind, latent-attention sizes scaled together: ``tiny_config``), a
   random model from ``AutoModelForCausalLM.from_config`` saved with ``save_pretrained`` and
   the embedded tokenizer beside it. A type transformers cannot build that small is "not
   built" (not ours).
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
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "trainer" / "fsdp_trainer" / "assets" / "tokenizer"
VOCAB = 4160  # the embedded tokenizer (4097 tokens), rounded up to a multiple of 64
STEPS = 3

LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers", "n_layers", "num_blocks")
# Shrunk wherever a config (or one of its sub-configs) has the field (names vary by family);
# the config's own __init__ then derives what depends on them (head_dim, qk_head_dim...).
TINY: dict[str, int] = {
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "n_embed", "dim", "embed_dim", "model_dim", "emb_dim", "embedding_dim"), 64
    ),
    "hidden_size_global": 64,  # blt's local encoder/decoder: the global transformer's width
    # dots3_note: its vision and audio adapters, from their width to the text model's
    **dict.fromkeys(("adapter_in_dim", "adapter_out_dim", "adapter_input_size", "adapter_output_size"), 64),
    **dict.fromkeys(LAYERS, 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "decoder_attention_heads", "n_heads"), 4),
    "num_key_value_heads": 2,
    **dict.fromkeys(("head_dim", "attention_head_size"), 16),
    "index_n_heads": 4,  # sparse-attention indexers (deepseek_v32, glm_moe_dsa...)
    # linear attention (gated delta net: qwen3_next, qwen3_5...): value heads a multiple of key heads
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim"), 16),
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "rotary_dim": 8,  # codegen, gptj: the rotary part of a 16-wide head
    **dict.fromkeys(
        ("intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim", "d_ff", "ffn_hidden_size", "ff_dim"), 128
    ),
    **dict.fromkeys(
        (
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "expert_intermediate_size",
            "expert_ffn_hidden_size",
            "shared_experts_intermediate_size",
            "router_hidden_size",
        ),
        64,
    ),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k"), 2),
    # group-limited routing (deepseek_v3...): experts in groups, the best groups first
    **dict.fromkeys(("n_group", "num_expert_group"), 2),
    "topk_group": 2,
    "zero_expert_num": 2,  # longcat_flash's identity experts
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"), 128),
    **dict.fromkeys(("vocab_size", "padded_vocab_size", "vocab_size_per_layer_input"), VOCAB),
    # per-layer input embeddings (gemma3n, gemma4) and hash n-gram embeddings (blt): each a table
    # as large as the vocabulary, which the shrink left at 262 k and 500 k rows.
    "hidden_size_per_layer_input": 16,
    "encoder_hash_byte_group_vocab": 512,
    "laurel_rank": 8,
    **dict.fromkeys(("mamba_dt_rank", "time_step_rank"), 4),
}
# A default of None usually means "derive it" (head_dim = width / heads, kv heads = heads) or
# "not set" (dots1's experts), which breaks the model once the other numbers are small.
WHEN_NONE = {"head_dim": 16, "num_key_value_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2}
WHEN_NONE |= {"n_shared_experts": 1}
# Multi-head latent attention (deepseek_v2/v3 and their kin) and its sparse-attention indexer:
# these sizes add up (a query head is its rotary plus its plain part; dots3's head_dim is the
# sum for its per-layer plain part), so they are scaled together, by the factor that makes the
# rotary part 8 wide.
LATENT = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "qk_head_dim")
LATENT_ALSO = ("head_dim", "index_head_dim")
# Shrinking never makes a number larger (a top-1 router stays top-1), but for these: the
# vocabulary must hold the embedded tokenizer's ids, and the positions a 32-token window.
GROW = {"vocab_size", "padded_vocab_size", "vocab_size_per_layer_input", "max_position_embeddings", "n_positions"}
GROW |= {"n_ctx", "max_seq_len", "seq_length"}
# Layer counts of a config's first or last layers that are special: kept in step with the layers kept.
HEAD_COUNTS = ("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index")
TAIL_COUNTS = ("num_kv_shared_layers",)  # gemma3n: the last layers reuse earlier layers' key/value cache
MAX_LAYERS = 6

# What no generic rule gives, and why.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Its default rope_parameters is empty, where the model reads one per layer type.
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # Its attention reads attn_config.rope_theta, which the attention config does not declare,
    # and clamps to clip_qkv, which defaults to None.
    "dbrx": {"attn_config": {"kv_n_heads": 1, "rope_theta": 10000.0, "clip_qkv": 8.0}},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # its layer pattern is (pattern, repeats)
    "mamba2": {"num_heads": 8},  # heads x head_dim must equal expand (2) x width
    # Its hybrid layers share one attention block, tied across them: it needs two of them; its
    # attention is twice the model's width (both inputs concatenated).
    "zamba": {
        "num_hidden_layers": 3,
        "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # its default has none (None)
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


def _is_layer_index_list(key: str, value: Any, layers: int) -> bool:
    """mlp_only_layers, attn_layer_indices...: increasing layer indices, not one value per layer."""
    ints = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    named = "layer" in key or "ind" in key or "idx" in key
    return ints and named and all(0 <= v < layers for v in value) and value == sorted(set(value))


def _layer_keys(value: Any, layers: int) -> list[int] | None:
    """per_layer_config's keys as layer indices (ints or "05"-style strings), or None."""
    if not isinstance(value, dict) or not value or not all(isinstance(v, dict) for v in value.values()):
        return None
    try:
        keys = [int(k) for k in value]
    except (TypeError, ValueError):
        return None
    return keys if all(0 <= k < layers for k in keys) else None


def _scaled(key: str, values: list[Any], config: dict[str, Any], small: dict[str, Any]) -> list[Any]:
    """Per-layer numbers of a field the shrink knows keep their ratio to its shrunk number:
    gemma4's 512-wide full-attention heads beside 256-wide ones become 32 beside 16."""
    base = max((k for k in {*TINY, *small} if k in key), key=len, default=None)
    if base is None or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return values
    default = config.get(base)
    if isinstance(default, int) and base in small:
        new, old = small[base], default
    elif base in TINY:  # the config's own field is this list (gemma3n's intermediate_size)
        new, old = TINY[base], max(values)
    else:
        return values
    return [max(1, round(new * v / old)) for v in values]


def _keep_layers(config: dict[str, Any], small: dict[str, Any], layers: int) -> dict[str, Any]:
    """The per-layer fields, cut to a few of the config's own layers: one of each kind it has.

    A layer's kind is its entry in every per-layer list of names (layer_types, block_types...),
    whether it is in each list of layer indices (mlp_only_layers...) and in per_layer_config, and
    whether it is one of the first (dense) or last (kv-sharing) layers. The first layer of each
    kind is kept, at least two: a hybrid keeps both its attention and its linear layers, and the
    layer lists, indices and counts all say the same layers. Empty for a config without any.
    """
    indices = {k: v for k, v in config.items() if _is_layer_index_list(k, v, layers)}
    per_layer = {k: v for k, v in config.items() if isinstance(v, list) and len(v) == layers and k not in indices}
    keyed = {k: keys for k, v in config.items() if (keys := _layer_keys(v, layers)) is not None}
    heads = {k: config[k] for k in HEAD_COUNTS if isinstance(config.get(k), int) and 0 < config[k] < layers}
    tails = {k: config[k] for k in TAIL_COUNTS if isinstance(config.get(k), int) and 0 < config[k] < layers}
    if not (per_layer or indices or keyed or heads or tails):
        return {}
    names = [k for k, v in per_layer.items() if all(isinstance(x, (str, float)) or x is None for x in v)]

    def kind(i: int) -> tuple[Any, ...]:
        return (
            *(per_layer[k][i] for k in names),
            *(i in v for v in indices.values()),
            *(i in v for v in keyed.values()),
            *(i < v for v in heads.values()),
            *(i >= layers - v for v in tails.values()),
        )

    kept: dict[tuple[Any, ...], int] = {}
    for i in range(layers):
        kept.setdefault(kind(i), i)
    keep = sorted(kept.values())[:MAX_LAYERS]
    keep += [i for i in range(layers) if i not in keep][: max(0, 2 - len(keep))]
    keep.sort()
    out: dict[str, Any] = {k: _scaled(k, [v[i] for i in keep], config, small) for k, v in per_layer.items()}
    out |= {k: [keep.index(i) for i in v if i in keep] for k, v in indices.items()}
    for k in keyed:
        sub = {int(key): value for key, value in config[k].items()}
        out[k] = {
            keep.index(i): {f: _scaled(f, [v], config, small)[0] for f, v in sub[i].items()} for i in keep if i in sub
        }
    out |= {k: sum(i < v for i in keep) for k, v in heads.items()}
    out |= {k: sum(i >= layers - v for i in keep) for k, v in tails.items()}
    out |= {k: len(keep) for k in LAYERS if config.get(k) == layers}
    return out


def _latent(config: dict[str, Any], small: dict[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention's sizes, one factor for all (see LATENT); keys and values come
    from one latent per token, so a config whose every head has its own key/value keeps that."""
    rope = config.get("qk_rope_head_dim")
    if not isinstance(rope, int) or rope <= 8:
        return {}
    out = {k: max(1, config[k] * 8 // rope) for k in (*LATENT, *LATENT_ALSO) if isinstance(config.get(k), int)}
    if config.get("num_key_value_heads") == config.get("num_attention_heads") and "num_attention_heads" in small:
        out["num_key_value_heads"] = small["num_attention_heads"]
    return out


def _is_sub_config(value: Any) -> bool:
    return isinstance(value, dict) and any(k in value for k in TINY)


def _shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """What to change in one (sub-)config's defaults; nested sub-configs shrink the same way."""
    small: dict[str, Any] = {}
    for k, v in TINY.items():
        default = config.get(k)
        if isinstance(default, int) and not isinstance(default, bool) and default > 0:
            small[k] = v if k in GROW else min(v, default)
    small |= {k: v for k, v in WHEN_NONE.items() if k in config and config[k] is None}
    small |= _token_ids(config)
    small |= _latent(config, small)
    layers = next((config[k] for k in LAYERS if isinstance(config.get(k), int) and k in small), 0)
    if layers > 2:
        small |= _keep_layers(config, small, layers)
    for k, v in config.items():
        if _is_sub_config(v) and k not in small:
            small[k] = {**v, **_shrunk(v)}
    return small


def tiny_config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    return cls(**(_shrunk(cls().to_dict()) | OVERRIDES.get(model_type, {})))


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
    # Without a KV cache, as the trainer runs it (blt's cache setup fails on its config).
    with torch.no_grad():
        model(input_ids=torch.randint(3, 200, (1, 16)), labels=torch.randint(3, 200, (1, 16)), use_cache=False)
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
    try:
        refusal = check(config)
    except Exception as e:  # the check itself crashed (not a refusal): the trainer's failure
        detail = f"check: {type(e).__name__}: {str(e).splitlines()[0][:250]}"
        return Result(model_type, "fails", detail, params, time.monotonic() - t0), None
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
