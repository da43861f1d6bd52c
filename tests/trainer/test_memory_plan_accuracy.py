"""The memory plan against the peak memory the real trainer allocates, on CPU with 2 gloo ranks.

``memory_probe.py`` runs the trainer's own set-up and train steps under
torchrun and reads the CPU allocator's running total (see its docstring);
the plan of the same spec (gpusPerNode 0: a CPU job, so no CUDA overhead
and the foreach AdamW) must be within 20% of the peak (the lower rank's: see
the test).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_api.memory_plan import plan_memory
from fsdp_api.spec import FSDPTrainingSpec, ParallelismSpec
from fsdp_api.trainer_config import TrainerConfig

from tests.trainer.harness import run_script

PROBE = Path(__file__).with_name("memory_probe.py")
TOLERANCE = 0.20

# tiny as it is; "small": wider and deeper than tiny (about 25M parameters),
# still a few seconds per step on one core per rank. The vocabulary stays the
# preset's so the embedded tokenizer fits.
SMALL = {"hiddenSize": 512, "numLayers": 8, "numHeads": 8, "numKeyValueHeads": 4, "intermediateSize": 1376}
LONG_MODEL = {"preset": "tiny", "config": {"maxSeqLen": 2048}}
CASES: dict[str, dict[str, Any]] = {
    "tiny": {"model": {"preset": "tiny"}, "training": {"seqLen": 256, "microBatchSize": 4}},
    "small": {"model": {"preset": "tiny", "config": SMALL}, "training": {"seqLen": 256, "microBatchSize": 2}},
    # LoRA on the same model: gradients and optimizer state for the adapters only.
    "small-lora": {
        "model": {"preset": "tiny", "config": SMALL},
        "training": {"seqLen": 256, "microBatchSize": 2},
        "peft": {"rank": 16},
    },
    # Llama 3's vocabulary, where the loss is the largest buffer: full logits, then the chunked loss.
    "vocab128k-full": {
        "model": {"preset": "tiny", "config": {"vocabSize": 128_256}},
        "training": {"seqLen": 256, "microBatchSize": 4, "logits": "full"},
    },
    "vocab128k-chunked": {
        "model": {"preset": "tiny", "config": {"vocabSize": 128_256}},
        "training": {"seqLen": 256, "microBatchSize": 4, "logits": "chunked"},
    },
    # Op-level activation checkpointing: each layer keeps its matmuls' outputs, recomputes the rest.
    "small-ac-op": {
        "model": {"preset": "tiny", "config": SMALL},
        "training": {"seqLen": 256, "microBatchSize": 2, "activationCheckpointing": "op"},
    },
    # A mixture of experts (Mixtral's layers: 8 experts, 2 per token), from its config.json (MIXTRAL below).
    "mixtral": {"model": {"architecture": "MIXTRAL"}, "training": {"seqLen": 256, "microBatchSize": 4}},
    # Tensor parallelism over both ranks: each holds half of every block's projections
    # and computes half of the attention and MLP activations.
    "tiny-tp2": {
        "model": {"preset": "tiny"},
        "training": {"seqLen": 256, "microBatchSize": 4},
        "parallelism": {"tensor": 2},
    },
    # Two pipeline stages of 4 layers each (untied embeddings: the first stage holds the embedding, the
    # last the head and the logits), 1F1B over 2 micro-batches: the first stage holds both in flight.
    "untied-pp2": {
        "model": {"architecture": "LLAMA_UNTIED"},
        "training": {"seqLen": 256, "microBatchSize": 2, "gradAccumSteps": 2},
        "parallelism": {"pipeline": 2},
    },
    # A long row, whole on each rank and then split over both (context parallelism).
    "long": {"model": LONG_MODEL, "training": {"seqLen": 2048, "microBatchSize": 1}},
    "long-cp2": {
        "model": LONG_MODEL,
        "training": {"seqLen": 2048, "microBatchSize": 1},
        "parallelism": {"context": 2},
    },
}


MIXTRAL = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 344,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 4096,  # the embedded tokenizer's, as the tiny preset's
    "max_position_embeddings": 1024,
}


# "small"'s Llama with a head of its own, as config.json (the presets tie theirs, which pipelining refuses).
LLAMA_UNTIED = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "intermediate_size": 1376,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
PLACEHOLDERS = {"MIXTRAL": ("mixtral", MIXTRAL), "LLAMA_UNTIED": ("llama", LLAMA_UNTIED)}


def _architecture(case: dict[str, Any], root: Path) -> dict[str, Any]:
    """The case with its placeholder architecture (MIXTRAL, LLAMA_UNTIED) made a directory holding its config.json."""
    placeholder = PLACEHOLDERS.get(case["model"].get("architecture"))
    if placeholder is None:
        return case
    from transformers import AutoConfig

    model_type, config = placeholder
    AutoConfig.for_model(model_type, **config).save_pretrained(root / model_type)
    return {**case, "model": {"architecture": str(root / model_type)}}


def cpu_spec(case: dict[str, Any], checkpoint_dir: Path) -> FSDPTrainingSpec:
    """A 2-rank CPU job (2 nodes of one process: the same world as torchrun's 2 local ranks).

    A spec refuses tensor parallelism across nodes and on CPU-only nodes, so the
    parallelism section is set past validation: the probe's two ranks are one node's.
    """
    spec = FSDPTrainingSpec.model_validate(
        {
            "image": "trainer:test",
            "model": case["model"],
            "training": {"maxSteps": 3, "precision": "fp32", "warmupSteps": 1, **case["training"]},
            "fsdp": {"shardingStrategy": "full"},
            "resources": {"nodes": 2, "gpusPerNode": 0},
            "checkpoint": {"dir": str(checkpoint_dir), "intervalSteps": 1000},
            "metrics": {"enabled": False},
            **({"peft": case["peft"]} if "peft" in case else {}),
        }
    )
    if "parallelism" in case:
        spec = spec.model_copy(update={"parallelism": ParallelismSpec.model_validate(case["parallelism"])})
    return spec


def measure(spec: FSDPTrainingSpec, workdir: Path) -> list[dict[str, Any]]:
    """Run the probe under torchrun (2 ranks); one result per rank."""
    config = workdir / "train.yaml"
    config.write_text(TrainerConfig.from_spec(spec, "memory-probe", "test").to_yaml())
    out = workdir / "out"
    returncode, output = run_script(PROBE, [str(config), str(out)], cwd=workdir)
    assert returncode == 0, f"memory probe failed:\n{output[-8000:]}"
    return [json.loads(p.read_text()) for p in sorted(out.glob("memory-rank*.json"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_plan_is_within_20_percent_of_the_measured_peak(name: str, tmp_path: Path) -> None:
    spec = cpu_spec(_architecture(CASES[name], tmp_path), tmp_path / "checkpoints")
    results = measure(spec, tmp_path)
    assert len(results) == 2
    # Both ranks hold the same shards, batch sizes and activations, so their own peaks are equal. Yet a
    # rank reads its peak plus 0 to 6 buffers of exactly one layer's parameters (11.6 MB for "small"),
    # run to run: 382 to 483 MB, taken at the same place (the last layer's pre-backward gather). Not
    # Python's garbage collector (the same with it off); most likely gloo's worker threads releasing
    # their reference to an all-gather's flat buffer late. The lower reading is the closer one.
    # Pipeline stages hold different layers: the plan is the larger end's, so the higher peak.
    pipelined = spec.parallelism.pipeline > 1
    measured = (max if pipelined else min)(r["peak_bytes"] for r in results)
    plan = plan_memory(spec)
    assert plan.estimate is not None
    estimated = plan.estimate.tensor_bytes
    # The parameter share is exact: the trainer's own count of its shard.
    assert plan.estimate.components[0].bytes == pytest.approx(max(r["param_bytes"] for r in results), rel=0.01)
    error = estimated / measured - 1
    print(f"{name}: estimated {estimated} bytes, measured {measured} bytes ({error:+.1%})")
    assert abs(error) <= TOLERANCE, f"{name}: estimated {estimated}, measured {measured} ({error:+.1%})"
