"""The memory plan (fsdp_api.memory_plan) and ``fsdp-operator plan`` / ``validate --memory``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api.instance_types import GIB, INSTANCE_TYPES
from fsdp_api.memory_plan import dims_from_config, plan_memory
from fsdp_api.memory_suggest import pipeline_changes
from fsdp_api.presets import PRESETS
from fsdp_api.spec import FSDPTrainingSpec
from fsdp_operator.cli import EXIT_INVALID, EXIT_OK, main
from fsdp_operator.controller.status.compute import (
    Observations,
    TrainingFacts,
    compute_status,
    status_document,
    transition_events,
)

from tests.operator.status_fixtures import training


def spec(**sections: dict[str, Any]) -> FSDPTrainingSpec:
    body: dict[str, Any] = {
        "image": "trainer:1.0",
        "model": {"preset": "llama3.1-8b"},
        "training": {"maxSteps": 10, "seqLen": 2048},
        "resources": {"nodes": 2, "gpusPerNode": 8, "instanceTypes": ["p5.48xlarge"]},
    }
    for name, values in sections.items():
        body[name] = {**body.get(name, {}), **values}
    return FSDPTrainingSpec.model_validate(body)


def component(s: FSDPTrainingSpec, name: str) -> int:
    plan = plan_memory(s)
    assert plan.estimate is not None
    return next(c.bytes for c in plan.estimate.components if c.name == name)


def test_8b_full_shard_on_two_p5_holds_one_sixteenth_of_the_fp32_weights() -> None:
    assert PRESETS["llama3.1-8b"].num_params() == 8_030_261_248
    s = spec()
    assert component(s, "parameters") == 8_030_261_248 * 4 // 16 == 2_007_565_312
    assert component(s, "optimizer state") == 2 * 2_007_565_312  # fused AdamW on CUDA: no temporaries
    plan = plan_memory(s)
    assert plan.gpu_memory_bytes == 80 * GIB
    assert plan.fits is True
    assert plan.total_bytes is not None and 20 * GIB < plan.total_bytes < 40 * GIB
    assert plan.summary().startswith("fits: about ")


def test_no_shard_holds_sixteen_times_the_parameters_of_full() -> None:
    full = component(spec(), "parameters")
    replicated = component(spec(fsdp={"shardingStrategy": "no_shard"}), "parameters")
    assert replicated == 16 * full
    grad_op = spec(fsdp={"shardingStrategy": "shard_grad_op"})
    # ZeRO-2: same shards, but every layer stays gathered between forward and backward.
    assert component(grad_op, "parameters") == full
    assert component(grad_op, "communication") > 5 * component(spec(), "communication")


def test_hybrid_shards_within_its_group() -> None:
    hybrid = spec(fsdp={"shardingStrategy": "hybrid", "shardGroupSize": 4})
    assert component(hybrid, "parameters") == 8_030_261_248 * 4 // 4


def test_activation_checkpointing_reduces_activations() -> None:
    none, selective, full = (
        component(spec(training={"activationCheckpointing": mode}), "activations")
        for mode in ("none", "selective", "full")
    )
    assert none > selective > full
    # Every other layer checkpointed: a little over half of none.
    assert 0.45 < selective / none < 0.6
    assert full < none / 10


def test_activations_grow_with_the_tokens_per_micro_batch() -> None:
    base = component(spec(), "activations")
    assert component(spec(training={"microBatchSize": 2}), "activations") == pytest.approx(2 * base, rel=0.01)


def test_cpu_offload_moves_weights_gradients_and_optimizer_state_to_the_host() -> None:
    plan = plan_memory(spec(fsdp={"cpuOffload": True}))
    assert plan.estimate is not None
    on_gpu = {c.name: c.bytes for c in plan.estimate.components}
    assert on_gpu["parameters"] == on_gpu["gradients"] == on_gpu["optimizer state"] == 0
    assert plan.estimate.host == 2_007_565_312 * 4


def test_gradient_accumulation_keeps_whole_gradients() -> None:
    assert component(spec(training={"gradAccumSteps": 4}), "gradients") == 8_030_261_248 * 4


def test_70b_on_one_g5_does_not_fit_and_says_what_would() -> None:
    s = spec(model={"preset": "llama3.1-70b"}, resources={"nodes": 1, "gpusPerNode": 1, "instanceTypes": ["g5.xlarge"]})
    plan = plan_memory(s)
    assert plan.fits is False
    assert plan.gpu_memory_bytes == 24 * GIB
    assert plan.suggestion and "resources.nodes" in plan.suggestion
    assert plan.summary().startswith("does not fit: about ")


def test_the_first_single_change_that_fits_is_suggested() -> None:
    # 8B on 16 A100-40GB at 2 x 2048 tokens: full logits (the default) are what does not fit.
    resources = {"instanceTypes": ["p4d.24xlarge"]}
    s = spec(training={"microBatchSize": 2}, resources=resources)
    plan = plan_memory(s)
    assert plan.fits is False
    assert plan.suggestion == "set training.logits: chunked"
    assert plan_memory(spec(training={"microBatchSize": 2, "logits": "chunked"}, resources=resources)).fits is True
    # At 4 x 2048 the chunked loss is not enough, nor is selective checkpointing: full checkpointing is.
    s = spec(training={"microBatchSize": 4, "logits": "chunked"}, resources=resources)
    assert plan_memory(s).suggestion == "set training.activationCheckpointing: full"
    fixed = spec(training={"microBatchSize": 4, "logits": "chunked", "activationCheckpointing": "full"})
    assert plan_memory(fixed.model_copy(update={"resources": s.resources})).fits is True


def test_the_chunked_loss_gives_back_the_logits_memory() -> None:
    # 4,096 tokens x 128,256 entries x 12 bytes of loss buffers become one 512-token chunk.
    resources = {"instanceTypes": ["p4d.24xlarge"]}
    full = plan_memory(spec(training={"microBatchSize": 2}, resources=resources))
    chunked = plan_memory(spec(training={"microBatchSize": 2, "logits": "chunked"}, resources=resources))
    assert {p.estimate.components[4].name for p in (full, chunked)} == {"logits"}
    full_logits, chunked_logits = (p.estimate.components[4].bytes for p in (full, chunked))
    assert full_logits == 4096 * 128_256 * 12
    assert chunked_logits == 4096 * 4096 * 2 + 512 * 128_256 * 12
    assert "chunks of 512 tokens" in chunked.estimate.components[4].note


def test_dpo_counts_a_frozen_reference_copy_unless_lora_makes_the_base_the_reference() -> None:
    preference = {"dataset": "trl-lib/ultrafeedback_binarized", "format": "preference"}
    lm, dpo = spec(), spec(training={"objective": "dpo"}, data=preference)
    # The reference's fp32 weights, sharded like the policy's: one more sixteenth of the model.
    assert component(dpo, "parameters") - component(lm, "parameters") == 8_030_261_248 * 4 // 16
    assert "frozen dpo reference" in plan_memory(dpo).estimate.components[0].note
    assert plan_memory(dpo).total_bytes > plan_memory(lm).total_bytes
    for name in ("gradients", "optimizer state", "activations", "logits"):
        assert component(dpo, name) == component(lm, name), name
    # SimPO has no reference; LoRA's reference is its own base with the adapters off.
    simpo = spec(training={"objective": "simpo"}, data=preference)
    assert component(simpo, "parameters") == component(lm, "parameters")
    peft = {"rank": 16}
    assert component(spec(training={"objective": "dpo"}, data=preference, peft=peft), "parameters") == component(
        spec(peft=peft), "parameters"
    )


def test_the_smallest_gpu_among_the_instance_types_is_the_bound() -> None:
    plan = plan_memory(spec(resources={"instanceTypes": ["p5e.48xlarge", "p4d.24xlarge"]}))
    assert plan.gpu is not None and plan.gpu.name == "p4d.24xlarge"
    assert plan.gpu_memory_bytes == 40 * GIB


def test_without_instance_types_the_estimate_is_still_given() -> None:
    plan = plan_memory(spec(resources={"instanceTypes": []}))
    assert plan.fits is None
    assert plan.total_bytes is not None
    assert "no instance types given" in plan.summary()
    assert plan_memory(spec(resources={"instanceTypes": ["x9.huge"]})).gpu_note == "not in the instance table: x9.huge"


def test_a_cpu_job_has_no_gpu_to_fit() -> None:
    plan = plan_memory(spec(resources={"gpusPerNode": 0, "instanceTypes": []}))
    assert plan.fits is None and plan.gpu is None
    assert "CPU job" in plan.summary()


def test_a_hub_model_is_unknown_rather_than_guessed() -> None:
    plan = plan_memory(spec(model={"preset": None, "pretrained": "Qwen/Qwen2.5-1.5B"}))
    assert plan.estimate is None and plan.fits is None and plan.total_bytes is None
    assert "not a local directory" in plan.summary()


def test_a_script_of_your_own_is_unknown_and_says_why() -> None:
    body = {
        "image": "trainer:1.0",
        "command": ["/workspace/train.py"],
        "resources": {"gpusPerNode": 1, "instanceTypes": ["g5.xlarge"]},
    }
    plan = plan_memory(FSDPTrainingSpec.model_validate(body))
    assert plan.estimate is None and plan.fits is None
    assert "the model is your script's (spec.command)" in plan.summary()


def test_a_hub_model_with_a_presets_numbers_is_planned_as_that_preset() -> None:
    by_hub = plan_memory(spec(model={"preset": None, "pretrained": "meta-llama/Llama-3.2-1B-Instruct"}))
    by_preset = plan_memory(spec(model={"preset": "llama3.2-1b"}))
    assert by_hub.total_bytes is not None and by_hub.total_bytes == by_preset.total_bytes


def test_a_local_config_json_gives_the_dims(tmp_path: Path) -> None:
    d = PRESETS["llama3.2-1b"]
    config = {
        "model_type": "llama",
        "hidden_size": d.hidden_size,
        "num_hidden_layers": d.num_layers,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_key_value_heads,
        "intermediate_size": d.intermediate_size,
        "vocab_size": d.vocab_size,
        "max_position_embeddings": d.max_seq_len,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    local = spec(model={"preset": None, "architecture": str(tmp_path)})
    preset = spec(model={"preset": "llama3.2-1b"})
    assert component(local, "parameters") == component(preset, "parameters") == d.num_params() * 4 // 16


def test_a_mixture_of_experts_config_counts_every_expert_and_what_is_not_modelled_says_so() -> None:
    # Mixtral 8x7B's config.json (mistralai/Mixtral-8x7B-v0.1): 46.7B parameters, 12.9B active per token.
    mixtral = {
        "model_type": "mixtral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    d, why = dims_from_config(mixtral)
    assert why is None and d is not None
    assert (d.num_experts, d.experts_per_token, d.intermediate_size) == (8, 2, 14336)
    assert round(d.num_params() / 1e9, 1) == 46.7
    assert round(d.num_active_params() / 1e9, 1) == 12.9
    # Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B): the experts' width is moe_intermediate_size
    # (intermediate_size is a dense layer's), and 32 heads of head_dim 128 are twice the width 2048.
    # Qwen publishes 30.5B parameters, 3.3B activated.
    qwen = {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }
    q, _ = dims_from_config(qwen)
    assert q is not None and (q.num_experts, q.intermediate_size, q.head_dim) == (128, 768, 128)
    # 3.35B here: the active count includes both untied embeddings (0.31B each).
    assert round(q.num_params() / 1e9, 1) == 30.5 and abs(q.num_active_params() / 1e9 - 3.3) < 0.1
    for extra, what in (
        ({"shared_expert_intermediate_size": 5632}, "shared experts"),
        ({"first_k_dense_replace": 3}, "dense layers among the expert layers"),
        ({"kv_lora_rank": 512}, "latent attention"),
    ):
        none, why = dims_from_config({**mixtral, **extra})
        assert none is None and why is not None and why.startswith(f"mixture-of-experts models with {what}"), why
    assert dims_from_config({**mixtral, "num_experts_per_tok": None})[1] == "config.json has no num_experts_per_tok"


def test_the_instance_table_cites_a_source_for_every_type() -> None:
    assert INSTANCE_TYPES["p5.48xlarge"].gpus == 8
    assert all(t.source.startswith("https://") for t in INSTANCE_TYPES.values())


# --- the CLI -------------------------------------------------------------------------


def write(tmp_path: Path, s: FSDPTrainingSpec, name: str = "job") -> Path:
    doc = {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": name},
        "spec": s.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


TOO_BIG = {
    "model": {"preset": "llama3.1-70b"},
    "resources": {"nodes": 1, "gpusPerNode": 1, "instanceTypes": ["g5.xlarge"]},
}


def test_plan_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(write(tmp_path, spec()))]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("FSDPTraining 'job' (16 ranks): fits: about ")
    for row in ("parameters", "gradients", "optimizer state", "activations", "communication", "total"):
        assert f"\n  {row} " in out
    assert "          1.9  fp32 master weights, 1/16 of each" in out
    assert "GPU memory" in out and "80.0  p5.48xlarge (NVIDIA H100)" in out
    assert "\n  fits" in out and " yes" in out


def test_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(write(tmp_path, spec(**TOO_BIG))), "-o", "json"]) == EXIT_OK
    (item,) = json.loads(capsys.readouterr().out)
    assert item["name"] == "job" and item["fits"] is False
    assert item["gpuMemoryBytes"] == 24 * GIB
    assert item["components"][0] == {
        "name": "parameters",
        "bytes": 70553706496 * 4,
        "note": "fp32 master weights, whole",
    }
    assert item["suggestion"]


def test_validate_memory_refuse_exits_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, spec(**TOO_BIG))
    assert main(["validate", "-f", str(path), "--memory", "refuse"]) == EXIT_INVALID
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1  # on stderr, like every error
    assert err[0].startswith(f"{path}: FSDPTraining 'job': does not fit: about ")


def test_validate_memory_warns_by_default_and_can_be_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, spec(**TOO_BIG))
    assert main(["validate", "-f", str(path)]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"warning: {path}: FSDPTraining 'job': does not fit" in err
    assert main(["validate", "-f", str(path), "--memory", "off"]) == EXIT_OK
    assert "does not fit" not in capsys.readouterr().err
    assert main(["validate", "-f", str(write(tmp_path, spec(), "ok")), "--memory", "refuse"]) == EXIT_OK


def test_the_plan_becomes_the_fits_memory_condition_and_status_memory() -> None:
    facts = TrainingFacts.from_body(training(generation=3))
    plan = plan_memory(spec(resources={"nodes": 1, "gpusPerNode": 1, "instanceTypes": ["g5.xlarge"]}))
    status = compute_status(facts, None, None, Observations(memory=plan, now="2026-01-01T00:00:00Z"))
    cond = {c.type: c for c in status.conditions}["FitsMemory"]
    assert (cond.status, cond.reason, cond.observed_generation) == ("False", "DoesNotFit", 3)
    assert cond.message == plan.summary()
    assert status.memory is not None
    assert status.memory.estimated_bytes_per_gpu == plan.total_bytes > status.memory.gpu_memory_bytes == 24 << 30
    assert ("Warning", "DoesNotFit") in [(e.type, e.reason) for e in transition_events(None, status)]
    # A status write without a new plan (a job event) keeps both.
    stored = status_document(status)
    kept = compute_status(facts, None, stored, Observations(now="2026-01-01T00:01:00Z"))
    assert {c.type: c.reason for c in kept.conditions}["FitsMemory"] == "DoesNotFit"
    assert kept.memory == status.memory
    assert transition_events(stored, kept) == []
    unknown = plan_memory(spec(model={"preset": None, "pretrained": "Qwen/Qwen2.5-1.5B"}))
    cond = {c.type: c for c in compute_status(facts, None, None, Observations(memory=unknown)).conditions}["FitsMemory"]
    assert (cond.status, cond.reason) == ("Unknown", "NoEstimate")


def test_tensor_parallelism_splits_the_projections_and_their_activations_not_the_rest() -> None:
    d = PRESETS["llama3.1-8b"]
    projections = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)  # q, o, k, v, gate, up, down
    plain, split = spec(), spec(parallelism={"tensor": 2})
    # 16 ranks: 2-way tensor x 8-way data parallel; the projections' halves are sharded 8 ways, the rest too.
    assert component(split, "parameters") == math.ceil((d.num_params() - projections // 2) / 8) * 4
    assert component(split, "parameters") > component(plain, "parameters")  # embedding and head: 8 ways, not 16
    assert component(split, "activations") < component(plain, "activations")
    assert component(split, "communication") < component(plain, "communication")


def test_a_row_too_long_for_one_gpu_is_told_to_split_it() -> None:
    # 8B at 131,072 tokens on one p5: micro-batch 1, full checkpointing and the chunked loss already.
    long_row = {"seqLen": 131_072, "microBatchSize": 1, "logits": "chunked", "activationCheckpointing": "full"}
    s = spec(model={"preset": "llama3.1-8b", "config": {"maxSeqLen": 131_072}}, training=long_row)
    s = s.model_copy(update={"resources": s.resources.model_copy(update={"nodes": 1})})
    plan = plan_memory(s)
    assert plan.fits is False
    # Splitting the row splits every activation; splitting the layers, only the attention's and MLP's.
    assert plan.suggestion == "set parallelism.context: 2"
    for degrees in ({"context": 2}, {"tensor": 2}):
        fixed = s.model_copy(update={"parallelism": s.parallelism.model_copy(update=degrees)})
        assert plan_memory(fixed).fits is True, degrees
    split = s.model_copy(update={"parallelism": s.parallelism.model_copy(update={"context": 2})})
    # A rank's own half of the row, plus the whole row's keys and values its attention gathers.
    assert component(split, "activations") < 0.6 * component(s, "activations")
    assert component(split, "logits") < component(s, "logits")


def test_packed_rows_under_context_parallelism_count_the_attention_mask() -> None:
    row = {"seqLen": 32_768, "microBatchSize": 1}
    text = spec(training=row, parallelism={"context": 2})
    chats = spec(training=row, parallelism={"context": 2}, data={"format": "chat", "path": "/data/chats.jsonl"})
    # bf16 additive mask: 16,384 local queries x 32,768 keys x 2 bytes.
    assert component(chats, "activations") - component(text, "activations") == 16_384 * 32_768 * 2


# --- float8 -------------------------------------------------------------------------


def float8_spec(model: dict[str, Any] | None = None, **sections: dict[str, Any]) -> FSDPTrainingSpec:
    """llama3.2-1b on 16 H100 (p5: float8 tensor cores), full shard: one layer gathered at a time and a buffer."""
    return spec(model={"preset": "llama3.2-1b", **(model or {})}, **sections)


# q, o: 2048 x 2048; k, v: 2048 x 512; gate, up, down: 2048 x 8192. All divide by 16.
PROJECTIONS_1B = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192


def test_float8_tensorwise_gathers_the_decoder_projections_in_one_byte() -> None:
    bf16, fp32 = float8_spec(), float8_spec(training={"precision": "fp32"})
    # The bf16 and fp32 plans of before float8 was modelled, to the byte.
    assert component(bf16, "communication") == 768_626_688
    assert plan_memory(bf16).total_bytes == 11_358_843_341
    assert plan_memory(fp32).total_bytes == 15_387_809_434
    tensorwise = float8_spec(training={"precision": "float8"})  # tensorwise: the default recipe
    # One layer gathered (prefetch 0) and the all-gather buffer: 1 byte less per projection element in each.
    assert PROJECTIONS_1B == 60_817_408
    assert component(tensorwise, "communication") == 768_626_688 - 2 * PROJECTIONS_1B
    assert "decoder projections gathered in float8 (tensorwise)" in plan_memory(tensorwise).estimate.components[5].note
    for name in ("parameters", "gradients", "optimizer state", "activations", "logits"):
        assert component(tensorwise, name) == component(bf16, name), name
    # shard_grad_op keeps all 16 layers gathered, plus the buffer.
    grad_op = {"shardingStrategy": "shard_grad_op"}
    saved = component(float8_spec(fsdp=grad_op), "communication") - component(
        float8_spec(training={"precision": "float8"}, fsdp=grad_op), "communication"
    )
    assert saved == 17 * PROJECTIONS_1B


def test_float8_rowwise_gathers_in_bf16_and_plans_like_bf16() -> None:
    # rowwise has no float8 all-gather; its casts live inside each matmul, never at the plan's peak.
    bf16, rowwise = float8_spec(), float8_spec(training={"precision": "float8", "float8Recipe": "rowwise"})
    assert plan_memory(rowwise).estimate.components == plan_memory(bf16).estimate.components


def test_float8_counts_only_the_projections_whose_dimensions_divide_by_16() -> None:
    # An MLP of 8,200 (not a multiple of 16): gate, up and down stay bf16; q, k, v, o convert.
    model = {"config": {"intermediateSize": 8200}}
    bf16 = component(float8_spec(model=model), "communication")
    tensorwise = component(float8_spec(model=model, training={"precision": "float8"}), "communication")
    assert bf16 - tensorwise == 2 * (2 * 2048 * 2048 + 2 * 2048 * 512)


def _qwen3_moe_example(expert: int) -> FSDPTrainingSpec:
    example = Path(__file__).resolve().parents[2] / "examples" / "fsdptraining-qwen3-30b-a3b-moe.yaml"
    doc = yaml.safe_load(example.read_text())
    doc["spec"]["parallelism"]["expert"] = expert
    return FSDPTrainingSpec.model_validate(doc["spec"])


def test_expert_parallelism_gathers_a_ranks_experts_only_and_adds_the_all_to_all() -> None:
    # Qwen3-30B-A3B on 16 H100s: a hub id the plan knows without a download.
    whole, split = (plan_memory(_qwen3_moe_example(e)).estimate for e in (1, 8))
    assert whole is not None and split is not None
    parts = {e: {c.name: c for c in est.components} for e, est in ((1, whole), (8, split))}
    # Sharded state is the same: each expert is still split over all 16 ranks (8 ep x 2 efsdp).
    for name in ("parameters", "gradients", "optimizer state", "activations", "logits"):
        assert parts[1][name].bytes == parts[8][name].bytes, name
    # A layer's 128 experts (3 x 2048 x 768 each, bf16) are gathered 16 at a time, not all 128, in the
    # layer being computed and in the all-gather buffer: 7/8 of them saved twice; the exchange added.
    experts = 128 * 3 * 2048 * 768 * 2
    tokens_exchanged = 2 * 4096 * 8 * 2048 * 2  # sent and received, bf16, 8 experts per token
    saved = parts[1]["communication"].bytes - parts[8]["communication"].bytes
    assert saved == 2 * (experts - experts // 8) - tokens_exchanged
    assert "1/8 of the experts) + the experts' all-to-all" in parts[8]["communication"].note
    assert "128 experts, each layer's split over 8 ranks, 8 per token: 30.53B parameters, 3.35B active" in (
        parts[8]["parameters"].note
    )


def test_pipeline_stages_hold_their_layers_state_and_the_larger_end_is_planned() -> None:
    # Llama 3.1 8B (32 layers, untied) on 16 H100s, 4 micro-batches of 1 row a step.
    training = {"microBatchSize": 1, "gradAccumSteps": 4, "activationCheckpointing": "full"}
    one, two = (plan_memory(spec(training=training, parallelism={"pipeline": n})).estimate for n in (1, 2))
    assert one is not None and two is not None
    parts = {n: {c.name: c for c in est.components} for n, est in ((1, one), (2, two))}
    # Half the layers and one end of the root (the embedding or the head: 128256 x 4096 each) per stage;
    # whole while accumulating, so the gradients shrink with the stage, not with the 8 ranks it is sharded over.
    dims = PRESETS["llama3.1-8b"]
    layer = (dims.num_params() - 2 * 128256 * 4096 - 4096) // 32
    assert parts[2]["gradients"].bytes == (16 * layer + 128256 * 4096 + 4096) * 4
    assert parts[1]["gradients"].bytes == dims.num_params() * 4
    # Checkpointed layers keep little: the last stage, with one micro-batch's 128k-vocabulary logits, is the larger.
    assert parts[2]["activations"].note.startswith("1x2048 tokens x 1 in flight on the last of 2 stages (16 layers")
    assert parts[2]["logits"].bytes == parts[1]["logits"].bytes
    assert two.total_bytes < one.total_bytes
    # Without checkpointing, 1F1B's first stage holds 2 micro-batches' activations of its 16 layers: as
    # much as one stage-less micro-batch of all 32, and no logits.
    kept = {**training, "activationCheckpointing": "none"}
    plain, staged = (plan_memory(spec(training=kept, parallelism={"pipeline": n})).estimate for n in (1, 2))
    assert plain is not None and staged is not None
    acts = {n: {c.name: c for c in est.components} for n, est in ((1, plain), (2, staged))}
    assert acts[2]["activations"].note.startswith("1x2048 tokens x 2 in flight on the first of 2 stages (16 layers")
    assert acts[2]["logits"].bytes == 0
    assert acts[2]["activations"].bytes == pytest.approx(acts[1]["activations"].bytes, rel=0.01)


def test_the_plan_names_pipeline_stages_where_they_are_what_fits() -> None:
    # 8B on 4 nodes of 8 A10G (24 GB) with gradient accumulation: FSDP keeps the whole fp32 gradient
    # (32 GB) between micro-batches, whatever tensor parallelism splits; four stages hold a quarter each.
    training = {"seqLen": 4096, "microBatchSize": 1, "gradAccumSteps": 4, "activationCheckpointing": "full"}
    resources = {"nodes": 4, "gpusPerNode": 8, "instanceTypes": ["g5.48xlarge"]}
    plan = plan_memory(spec(training=training, resources=resources))
    assert plan.fits is False
    assert plan.suggestion == "set parallelism.pipeline: 4"
    assert plan_memory(spec(training=training, resources=resources, parallelism={"pipeline": 4})).fits
    # With fewer micro-batches a step than stages, a stage count comes with the micro-batch split to keep
    # the global batch where it divides (each stage needs one in flight), else with more of them.
    rows = {**training, "microBatchSize": 4, "gradAccumSteps": 1}
    changes = dict(pipeline_changes(spec(training=rows, resources=resources)))
    assert "set parallelism.pipeline: 4 (and microBatchSize: 1, gradAccumSteps: 4: the same global batch)" in changes
    assert "set parallelism.pipeline: 8 (and gradAccumSteps: 8, a larger global batch)" in changes
    assert not pipeline_changes(spec(model={"preset": "llama3.2-3b"}))  # tied embeddings: never split
