"""The model section: which model to train, and the CEL for a preset's effective dimensions."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..presets import PRESETS, ModelDims, PresetName
from ..rules import Rule
from .object_refs import MAX_REFERENCE_LENGTH, no_bucket_root_rule, no_other_scheme_rule, s3_form_rule


class ModelOverrides(ApiModel):
    """Architecture overrides applied on top of the preset or the architecture's config.json."""

    hidden_size: int | None = Field(
        default=None, ge=64, le=65536, description="Width of the residual stream (d_model)."
    )
    num_layers: int | None = Field(default=None, ge=1, le=512, description="Number of decoder layers.")
    num_heads: int | None = Field(default=None, ge=1, le=1024, description="Number of attention (query) heads.")
    num_key_value_heads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Number of key/value heads (grouped-query attention); divides numHeads.",
    )
    intermediate_size: int | None = Field(
        default=None, ge=64, le=262144, description="Hidden width of the MLP (per expert for mixture-of-experts)."
    )
    vocab_size: int | None = Field(
        default=None, ge=256, le=1048576, description="Vocabulary size; must cover the tokenizer's vocabulary."
    )
    max_seq_len: int | None = Field(
        default=None, ge=16, le=1048576, description="Longest sequence the model supports (max_position_embeddings)."
    )


def preset_cel(field: str) -> str:
    """CEL for the effective value of a model dimension: override or preset's."""
    attr = {
        "hiddenSize": "hidden_size",
        "numHeads": "num_heads",
        "numKeyValueHeads": "num_key_value_heads",
        "maxSeqLen": "max_seq_len",
        "intermediateSize": "intermediate_size",
    }[field]
    table = ", ".join(f"'{name}': {getattr(dims, attr)}" for name, dims in PRESETS.items())
    return f"(has(self.config) && has(self.config.{field}) ? self.config.{field} : {{{table}}}[self.preset])"


class ModelSpec(ApiModel):
    """Which model to train: a Llama preset, any Hugging Face causal LM's architecture, or its weights.

    Exactly one of ``preset``, ``architecture`` and ``pretrained`` names the
    model. The operator cannot read a hub config at admission, so the checks
    that need the architecture's numbers run in ``fsdp-operator validate`` (for
    a local path) and in the trainer before any process group exists.
    """

    preset: PresetName | None = Field(
        default=None,
        description=(
            "Llama architecture preset, randomly initialised: tiny (smoke tests, CPU), llama3.2-1b, "
            "llama3.2-3b, llama3.1-8b, llama3.1-70b."
        ),
    )
    architecture: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description=(
            "Hugging Face model id or local/PVC directory whose config.json gives the architecture "
            "(any decoder-only AutoModelForCausalLM); weights are randomly initialised with the "
            "architecture's own init. Its weights, if any, are not read."
        ),
    )
    config: ModelOverrides | None = Field(
        default=None, description="Overrides of the preset's or architecture's numbers (not with pretrained)."
    )
    pretrained: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description=(
            "Hugging Face model id, local/PVC path or s3://bucket/prefix of a causal LM: its config.json "
            "gives the architecture, its safetensors the weights (streamed into the shards), its tokenizer "
            "the tokenizer unless data.tokenizer is set. From S3 the files are copied into HF_HOME first."
        ),
    )

    experts_implementation: Literal["grouped_mm", "batched_mm", "eager"] | None = Field(
        default=None,
        description=(
            "Mixture-of-experts models only: how transformers runs the experts. grouped_mm (one grouped GEMM over "
            "every expert's tokens), batched_mm (each token's experts' weights gathered, one batched matmul), or "
            "eager (the model's own per-expert loop). Unset: transformers' choice, grouped_mm where the model can "
            "dispatch it; the trainer's log names what each run uses."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.expertsImplementation) || !has(self.preset)",
            message="expertsImplementation applies to mixture-of-experts models; the presets are dense Llama models",
            field_path=".expertsImplementation",
            check=lambda m: m.experts_implementation is None or m.preset is None,
        ),
        no_other_scheme_rule("architecture", "a Hugging Face model id or a local directory", s3=False),
        no_other_scheme_rule("pretrained", "a Hugging Face model id, a local path or s3://bucket/prefix", s3=True),
        s3_form_rule("pretrained"),
        no_bucket_root_rule("pretrained", "model's files"),
        Rule(
            cel="[has(self.preset), has(self.architecture), has(self.pretrained)].filter(x, x).size() == 1",
            message="set exactly one of preset, architecture and pretrained",
            field_path=".preset",
            check=lambda m: sum(x is not None for x in (m.preset, m.architecture, m.pretrained)) == 1,
        ),
        Rule(
            cel="!(has(self.pretrained) && has(self.config))",
            message="config overrides need preset or architecture: pretrained weights fix the architecture",
            field_path=".config",
            check=lambda m: not (m.pretrained and m.config is not None),
        ),
        Rule(
            cel=f"!has(self.preset) || {preset_cel('hiddenSize')} % {preset_cel('numHeads')} == 0",
            message="hiddenSize must be divisible by numHeads",
            field_path=".config.hiddenSize",
            check=lambda m: m.dims() is None or m.dims().hidden_size % m.dims().num_heads == 0,
        ),
        Rule(
            cel=f"!has(self.preset) || {preset_cel('numHeads')} % {preset_cel('numKeyValueHeads')} == 0",
            message="numHeads must be divisible by numKeyValueHeads",
            field_path=".config.numHeads",
            check=lambda m: m.dims() is None or m.dims().num_heads % m.dims().num_key_value_heads == 0,
        ),
    )

    def dims(self) -> ModelDims | None:
        """A preset's effective numbers (plus overrides); None when the architecture comes from a config.json."""
        if self.preset is None:
            return None
        base = PRESETS[self.preset]
        if self.config is None:
            return base
        return base.with_overrides(**self.config.model_dump())

    def source(self) -> str:
        """What names the model, for log lines and metric labels."""
        return self.preset or self.pretrained or self.architecture or ""
