"""LoRA (``spec.peft``) under FSDP2 on the CPU: 2 ranks over gloo against one process.

The base is a tiny random Qwen2 (tied embeddings, attention biases) saved with
transformers' ``save_pretrained``, so the pretrained path, the tied output head
and PEFT's ``base_layer`` names are all exercised. The runs are launched once
per module and shared.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml
from fsdp_api.contract import ENV_TRAINER_FAULT
from fsdp_api.spec import PeftSpec
from fsdp_trainer.__main__ import main as cli
from fsdp_trainer.check import check
from fsdp_trainer.checkpoint import check_resumable, latest_checkpoint
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.model.architecture import build_meta_model
from fsdp_trainer.model.lora import apply_lora, find_targets
from transformers import AutoConfig, AutoModelForCausalLM

from tests.trainer.harness import RunResult, base_config, launch
from tests.trainer.model.architectures import ARCHITECTURES, build_checkpoint

pytestmark = pytest.mark.slow

PEFT = {"rank": 2, "alpha": 16}
# Wide enough that rank-2 adapters are a small share of the model, as on a real one, and that
# the checkpoints' fixed part (tokenizer, config, per-rank data state) does not dominate their size.
BASE = {"hidden_size": 256, "intermediate_size": 512}
# Sharding variants compared with the single process (every strategy, and checkpointing).
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "full": {},
    "shard_grad_op_ac": {
        "fsdp": {"shardingStrategy": "shard_grad_op"},
        "training": {"activationCheckpointing": "full"},
    },
    "no_shard": {"fsdp": {"shardingStrategy": "no_shard"}},
    "hybrid_1x2": {"fsdp": {"shardingStrategy": "hybrid", "shardGroupSize": 2}},
}


class LoraRuns:
    def __init__(self, root: Path, inputs: dict[str, Path]) -> None:
        self.root, self.inputs = root, inputs
        self.base = build_checkpoint("qwen2", root / "base", inputs["tokenizer"], **BASE)
        self._done: dict[str, RunResult] = {}

    def config(self, name: str, *, peft: dict[str, Any] | None = PEFT) -> dict[str, Any]:
        variant = VARIANTS.get(name, {})
        cfg = base_config(
            self.root / name,
            self.inputs["aligned"],
            self.inputs["tokenizer"],
            training={
                "microBatchSize": 4 if name == "reference" else 2,
                "gradAccumSteps": 2,
                "learningRate": 1e-2,
                **variant.get("training", {}),
            },
            fsdp=variant.get("fsdp", {}),
            checkpoint={"intervalSteps": 10},
        )
        cfg["model"] = {"pretrained": str(self.base)}
        if peft is not None:
            cfg["peft"] = dict(peft)
        return cfg

    def get(self, name: str) -> RunResult:
        if name not in self._done:
            if name == "full_finetune":
                cfg = self.config(name, peft=None)
                cfg["training"]["learningRate"] = 3e-3
                run = launch(self.root / name, cfg)
            elif name == "resumed":
                # Rank 0 is killed after step 13; torchrun restarts both ranks, which resume from step 10.
                run = launch(
                    self.root / name, self.config(name), env={ENV_TRAINER_FAULT: "after_step:13"}, max_restarts=1
                )
            else:
                run = launch(self.root / name, self.config(name), nproc=None if name == "reference" else 2)
            self._done[name] = run.check()
        return self._done[name]


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> LoraRuns:
    return LoraRuns(tmp_path_factory.mktemp("lora"), inputs)


def _model_keys(ckpt: Path) -> list[str]:
    metadata = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    return sorted(k for k in metadata if k.startswith("model."))


def test_only_the_adapters_train_and_the_loss_falls(lora: LoraRuns) -> None:
    run = lora.get("full")
    start = run.events("start")[0]
    # 7 projections x 2 layers, each rank 2: r * (in + out).
    per_layer = 2 * ((256 + 256) * 2 + (256 + 128) * 2 + (256 + 512) * 3)
    assert start["trainable_params"] == 2 * per_layer
    assert start["trainable_params"] < 0.05 * start["num_params"]
    # The frozen base is bit-identical after 20 steps, on both ranks.
    for rank in (0, 1):
        digests = {e["frozen_sha256"] for e in run.events("start", rank) + run.events("end", rank)}
        assert len(digests) == 1 and None not in digests
    losses = run.losses()
    assert sum(losses[s] for s in range(16, 21)) / 5 < losses[1] - 0.3, losses
    # The checkpoint holds the adapters and nothing else of the model (no tied head, no base).
    keys = _model_keys(latest_checkpoint(run.workdir / "checkpoints")[1])
    assert keys and all(".lora_A.default.weight" in k or ".lora_B.default.weight" in k for k in keys), keys
    assert len(keys) == 2 * 14


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sharded_lora_matches_one_process(lora: LoraRuns, variant: str) -> None:
    sharded, reference = lora.get(variant).losses(), lora.get("reference").losses()
    assert sorted(sharded) == sorted(reference) == list(range(1, 21))
    worst = max(abs(sharded[s] - reference[s]) for s in reference)
    assert worst <= 1e-4, f"{variant}: losses differ by {worst:.2e}"


def test_optimizer_state_is_a_small_fraction_of_full_fine_tuning(lora: LoraRuns) -> None:
    for rank in (0, 1):
        adapters = lora.get("full").events("memory", rank)[0]["optim_bytes"]
        full = lora.get("full_finetune").events("memory", rank)[0]["optim_bytes"]
        assert 0 < adapters < 0.05 * full, (rank, adapters, full)


def test_resume_from_an_adapter_checkpoint_is_bit_identical(lora: LoraRuns) -> None:
    resumed, straight = lora.get("resumed"), lora.get("full")
    assert "resumed from" in resumed.output
    assert resumed.losses() == straight.losses()  # exact: every step, including the recomputed 11-13


def test_adapter_checkpoints_are_over_ten_times_smaller(lora: LoraRuns) -> None:
    adapters = lora.get("full").events("memory")[0]["checkpoint_bytes"]
    full = lora.get("full_finetune").events("memory")[0]["checkpoint_bytes"]
    assert adapters * 10 <= full, (adapters, full)


def test_both_exports_reproduce_the_trained_logits(lora: LoraRuns, tmp_path: Path) -> None:
    from peft import PeftModel

    run = lora.get("full")
    probe = torch.load(run.trace_dir / "probe.pt")
    checkpoints = str(run.workdir / "checkpoints")
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert cli(["export", "--checkpoint", checkpoints, "--output", str(merged)]) == 0
    assert cli(["export", "--checkpoint", checkpoints, "--output", str(adapter), "--format", "peft"]) == 0

    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    assert not any("lora" in n or "base_layer" in n for n, _ in model.named_parameters())
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (2, 16, str(lora.base))
    base = AutoModelForCausalLM.from_pretrained(lora.base, dtype=torch.float32).eval()
    with torch.no_grad():
        untrained = base(input_ids=probe["input_ids"]).logits
        peft_model = PeftModel.from_pretrained(base, adapter).eval()
        # The merged weights W + s*B@A round differently from the adapter path x@W + s*(x@A)@B: on an
        # AVX-512 CPU the merged logits (up to 6.6) were 1.6e-5 off, fp32 noise; the adapters moved
        # them by more than 1e-2 (below), so 1e-4 still tells a wrong merge apart.
        for exported, tol in ((model, 1e-4), (peft_model, 1e-5)):
            logits = exported(input_ids=probe["input_ids"]).logits
            torch.testing.assert_close(logits, probe["logits"], atol=tol, rtol=tol)
    assert (untrained - probe["logits"]).abs().max() > 1e-2  # the adapters did change the model


def test_peft_export_of_a_full_checkpoint_is_one_clear_error(lora: LoraRuns, tmp_path: Path, capsys) -> None:
    checkpoints = str(lora.get("full_finetune").workdir / "checkpoints")
    assert cli(["export", "--checkpoint", checkpoints, "--output", str(tmp_path / "x"), "--format", "peft"]) == 2
    assert "is a full fine-tuning checkpoint (no peft); use --format merged" in capsys.readouterr().err


def _meta_with_lora(lora: LoraRuns, peft: dict[str, Any]) -> torch.nn.Module:
    model = build_meta_model(AutoConfig.from_pretrained(lora.base))
    apply_lora(model, PeftSpec.model_validate(peft))
    return model


def test_resuming_with_other_lora_settings_is_refused_by_name(lora: LoraRuns) -> None:
    ckpt = latest_checkpoint(lora.get("full").workdir / "checkpoints")[1]
    check_resumable(ckpt, _meta_with_lora(lora, PEFT), PeftSpec.model_validate(PEFT))  # the same settings resume
    # alpha changes no tensor shape: only the saved config can tell.
    other = {**PEFT, "alpha": 8}
    with pytest.raises(ConfigError) as e:
        check_resumable(ckpt, _meta_with_lora(lora, other), PeftSpec.model_validate(other))
    assert "peft.alpha: the checkpoint was trained with 16.0, this run has 8.0" in str(e.value)
    model = build_meta_model(AutoConfig.from_pretrained(lora.base))
    with pytest.raises(ConfigError) as e:
        check_resumable(ckpt, model, None)
    assert "peft: the checkpoint was trained with LoRA, this run uses full fine-tuning" in str(e.value)


def test_a_target_that_matches_nothing_stops_the_check_with_one_line(lora: LoraRuns, tmp_path: Path) -> None:
    cfg = lora.config("check", peft={**PEFT, "targetModules": ["q_proj", "qkv_proj", "lm_head"]})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as e:
        check(str(path), "1", 2)
    assert e.value.lines == [
        "peft.targetModules: qkv_proj matches no module of Qwen2ForCausalLM; its decoder layers' Linear layers: "
        "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj",
        "peft.targetModules: lm_head matches lm_head, outside the decoder layers (only modules inside them are "
        "adapted); its decoder layers' Linear layers: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj",
    ]
    cfg["peft"] = {**PEFT, "targetModules": ["q_proj", "v_proj"]}
    path.write_text(yaml.safe_dump(cfg))
    assert "(3,584 trainable: LoRA on 4 modules)" in check(str(path), "1", 2)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "gemma2", "gpt2"])
def test_default_targets_are_what_peft_all_linear_picks(model_type: str) -> None:
    """Found from the model, not a table: the same modules as PEFT's own all-linear selection."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    config = AutoConfig.for_model(model_type, **ARCHITECTURES[model_type])
    ours = find_targets(build_meta_model(config), PeftSpec())
    reference = build_meta_model(config)
    inject_adapter_in_model(LoraConfig(r=2, target_modules="all-linear"), reference)
    theirs = sorted(n for n, m in reference.named_modules() if isinstance(m, LoraLayer))
    assert ours == theirs


def test_mixture_of_experts_routers_and_fused_experts_are_left_alone() -> None:
    config = AutoConfig.for_model("mixtral", **ARCHITECTURES["mixtral"])
    targets = find_targets(build_meta_model(config), PeftSpec())
    assert {t.rsplit(".", 1)[-1] for t in targets} == {"q_proj", "k_proj", "v_proj", "o_proj"}


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdptraining-lora.yaml"


def test_the_lora_example_runs_locally_and_exports_an_adapter(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """examples/fsdptraining-lora.yaml under run-local, its hub references swapped for local copies."""
    from fsdp_operator.local import run_local
    from peft import PeftModel

    from tests.trainer.data.chat_inputs import build_chat_tokenizer, write_chat_jsonl

    body = yaml.safe_load(EXAMPLE.read_text())
    spec = body["spec"]
    assert spec["peft"]["rank"] == 16 and spec["model"]["pretrained"].startswith("meta-llama/")
    base = build_checkpoint("llama", tmp_path / "base", build_chat_tokenizer(tmp_path / "tokenizer"))
    spec["model"]["pretrained"] = str(base)
    spec["data"] = {"path": str(write_chat_jsonl(tmp_path / "chats.jsonl", 300)), "format": "chat"}
    spec["training"].update(seqLen=64, microBatchSize=2, precision="fp32", warmupSteps=2)
    spec["env"] = []
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(body))

    out = tmp_path / "run"
    assert run_local(path, nproc=2, output_dir=out, steps=6) == 0
    err = capfd.readouterr().err
    assert "trainable, " in err and "LoRA on 14 modules" in err, err[-3000:]
    assert all(".lora_" in k for k in _model_keys(latest_checkpoint(out / "checkpoints")[1]))

    adapter = tmp_path / "adapter"
    assert cli(["export", "--checkpoint", str(out / "checkpoints"), "--output", str(adapter), "--format", "peft"]) == 0
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    assert model.peft_config["default"].r == 16
