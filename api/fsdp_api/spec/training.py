"""The training section: steps, batch, learning rate, precision."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..precision import DEFAULT_FLOAT8_RECIPE, Float8Recipe, Precision
from ..rules import Rule, cel_literal
from .preference import PreferenceSpec
from .samples import SamplesSpec

# The objectives that train on preference pairs (data.format: preference).
PREFERENCE_OBJECTIVES = ("dpo", "simpo")
# Those of them that compare the policy with a frozen reference model (the memory plan counts it).
REFERENCE_OBJECTIVES = ("dpo",)
_PREFERENCE_CEL = "has(self.objective) && self.objective in " + str(list(PREFERENCE_OBJECTIVES))
# SimPO's target margin: the one preference setting dpo does not read.
_GAMMA_DEFAULT = PreferenceSpec.model_fields["gamma"].default


class TrainingSpec(ApiModel):
    """Optimisation settings: steps, batch, learning rate, precision."""

    max_steps: int = Field(ge=1, le=100_000_000, description="Number of optimizer steps to train for.")
    seq_len: int | None = Field(
        default=None,
        ge=16,
        le=1048576,
        description="Tokens per sequence. Unset: min(2048, the model's maximum sequence length).",
    )
    micro_batch_size: int = Field(
        default=1, ge=1, le=4096, description="Sequences per GPU (per rank) per forward pass."
    )
    grad_accum_steps: int = Field(default=1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step.")
    learning_rate: float = Field(default=3e-4, gt=0, le=1, description="Peak learning rate of AdamW.")
    min_learning_rate_ratio: float = Field(
        default=0.1, ge=0, le=1, description="Final learning rate of the cosine schedule, as a fraction of the peak."
    )
    warmup_steps: int | None = Field(
        default=None, ge=0, description="Linear warm-up steps before the cosine decay. Unset: min(100, maxSteps/10)."
    )
    weight_decay: float = Field(default=0.1, ge=0, le=10, description="AdamW weight decay.")
    grad_clip_norm: float = Field(
        default=1.0, ge=0, description="Clip the global gradient norm to this value; 0 disables."
    )
    precision: Precision = Field(
        default="bf16",
        description=(
            "bf16: bf16 parameters and compute with fp32 gradient reduction; float8: the same, with the decoder "
            "blocks' matmuls in float8 (torchao; GPUs with float8 tensor cores: H100, H200); fp32: full precision."
        ),
    )
    float8_recipe: Float8Recipe | None = Field(
        default=None,
        description=(
            "With precision float8: tensorwise (one scale per tensor, float8 all-gather of the weights) or "
            "rowwise (one scale per row: more accurate, slower). Unset: tensorwise."
        ),
    )
    activation_checkpointing: Literal["none", "op", "selective", "full"] = Field(
        default="none",
        description=(
            "Recompute activations in backward: none; op (in every layer, keep the matmuls', attention's and "
            "collectives' outputs and recompute the cheap ops between them: about half the activation memory for a "
            "few percent of compute); selective (every other layer whole); full (every layer whole)."
        ),
    )
    compile: bool | None = Field(
        default=None,
        description=(
            "torch.compile each decoder layer (inductor). Unset: on for GPU ranks, off for CPU ranks. A layer that "
            "inductor cannot compile runs eager, with one warning line naming the reason; false: always eager."
        ),
    )
    logits: Literal["full", "chunked"] = Field(
        default="full",
        description=(
            "full: the model's logits, then the loss. chunked: the output head and the cross-entropy run a chunk of "
            "tokens at a time, so the fp32 logits of a whole micro-batch never exist: less memory (about 12 bytes "
            "per token and vocabulary entry), somewhat slower (measured 10-20% on an H100 with a 1B model); the "
            "model trains on full logits, with a warning, where its logits are not its head's output."
        ),
    )
    kernels: Literal["auto", "liger", "none"] = Field(
        default="auto",
        description=(
            "Fused kernels patched into the model by its type: liger (Liger-Kernel's RMSNorm, rotary and "
            "SwiGLU/GeGLU Triton kernels, for the model types Liger covers: Llama, Mistral, Mixtral, Qwen2/3, "
            "Qwen3-MoE, Gemma 1-3, Phi-3, OLMo 2 and more); none: the model's own modules. auto: liger on GPU ranks "
            "for a covered type without tensor parallelism, none otherwise (the log says which and why). The loss "
            "stays the trainer's (training.logits)."
        ),
    )
    router_aux_loss_coef: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description=(
            "A mixture-of-experts model: weight of its routers' load-balancing loss (Switch Transformer's, as "
            "transformers adds it with output_router_logits) added to the training loss; the logged loss stays the "
            "token loss. 0: the token loss only, like transformers by default. Mixtral's, Qwen3-MoE's and gpt-oss's "
            "configs use 0.001, OLMoE's 0.01. The trainer refuses a value above 0 for a dense model in one line."
        ),
    )
    packed_attention: Literal["auto", "flex", "mask"] = Field(
        default="auto",
        description=(
            "How packed rows (data.format prompt-completion, chat, preference) keep their documents apart. mask: "
            "an explicit block-diagonal mask (batch x seqLen x seqLen booleans) through the model's SDPA or eager "
            "attention, which keeps SDPA off its flash kernel. flex: PyTorch FlexAttention with a document block "
            "mask, no dense mask (transformers' flex_attention; sliding windows kept); GPU ranks only, since "
            "FlexAttention has no backward pass on CPU. auto: flex on GPU ranks for models whose attention supports "
            "it, mask otherwise (the log says which and why). parallelism.context > 1 uses the context-parallel "
            "attention's own mask."
        ),
    )
    objective: Literal["lm", "dpo", "simpo"] = Field(
        default="lm",
        description=(
            "lm: next-token cross-entropy (pre-training and supervised fine-tuning, per data.format). "
            "dpo: direct preference optimisation against a frozen reference (the model as loaded; with peft, the "
            "base with the adapters off), sigmoid loss. simpo: SimPO, reference-free, on length-normalised "
            "log-probabilities. dpo and simpo train on data.format: preference."
        ),
    )
    preference: PreferenceSpec | None = Field(
        default=None, description="objective dpo or simpo: beta (and gamma for simpo). Unset: TRL's defaults."
    )
    seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Random seed for weight init and data order.")
    log_interval_steps: int = Field(default=10, ge=1, description="Steps between log lines on rank 0.")
    eval_interval_steps: int = Field(
        default=0, ge=0, description="Steps between validation runs; 0 disables validation."
    )
    eval_steps: int = Field(default=10, ge=1, description="Micro-batches per validation run.")
    samples: SamplesSpec | None = Field(
        default=None,
        description=(
            "Prompts the model answers (greedy) at each validation (evalIntervalSteps) and at the end of training: "
            "on rank 0's log, and as text in the trackers. Unset: none."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.float8Recipe) || (has(self.precision) && self.precision == 'float8')",
            message="float8Recipe applies to precision: float8 only",
            field_path=".float8Recipe",
            check=lambda t: t.float8_recipe is None or t.precision == "float8",
        ),
        Rule(
            cel="!has(self.preference) || " + _PREFERENCE_CEL,
            message="preference applies to objective dpo or simpo only",
            field_path=".preference",
            check=lambda t: t.preference is None or t.objective in PREFERENCE_OBJECTIVES,
        ),
        Rule(
            cel=(
                "!has(self.preference) || !has(self.preference.gamma)"
                f" || self.preference.gamma == {cel_literal(_GAMMA_DEFAULT)}"
                " || (has(self.objective) && self.objective == 'simpo')"
            ),
            message="preference.gamma is SimPO's target margin and applies to objective simpo only: leave it unset",
            field_path=".preference.gamma",
            check=lambda t: t.preference is None or t.preference.gamma == _GAMMA_DEFAULT or t.objective == "simpo",
        ),
        Rule(
            cel="!has(self.logits) || self.logits != 'chunked' || !(" + _PREFERENCE_CEL + ")",
            message=(
                "logits chunked computes one summed token loss; objective dpo and simpo need each answer's "
                "log-probability: use logits full"
            ),
            field_path=".logits",
            check=lambda t: t.logits != "chunked" or t.objective not in PREFERENCE_OBJECTIVES,
        ),
        Rule(
            cel="!has(self.warmupSteps) || self.warmupSteps < self.maxSteps",
            message="warmupSteps must be smaller than maxSteps",
            field_path=".warmupSteps",
            check=lambda t: t.warmup_steps is None or t.warmup_steps < t.max_steps,
        ),
    )

    @property
    def trains_preferences(self) -> bool:
        return self.objective in PREFERENCE_OBJECTIVES

    @property
    def needs_reference(self) -> bool:
        return self.objective in REFERENCE_OBJECTIVES

    def effective_preference(self) -> PreferenceSpec:
        return self.preference or PreferenceSpec()

    def effective_float8_recipe(self) -> Float8Recipe:
        return self.float8_recipe or DEFAULT_FLOAT8_RECIPE

    def compile_decision(self, device_type: str) -> tuple[bool, str]:
        """Whether to compile on this device, and why (unset: GPUs compile, CPUs do not)."""
        if self.compile is not None:
            return self.compile, f"training.compile: {str(self.compile).lower()}"
        if device_type == "cpu":
            # Inductor builds C++ for every new shape on CPU ranks: minutes on a
            # small machine for runs that are tests and demos.
            return False, "training.compile unset: off on CPU ranks"
        return True, "training.compile unset: on for GPU ranks"

    def effective_warmup_steps(self) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return min(100, self.max_steps // 10)
