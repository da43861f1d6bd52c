"""The ``FSDPTraining`` spec: the single source of truth for the API.

The CRD schema (``fsdp_operator.crd``), the renderer, the trainer's config and
the docs' API reference are all derived from these models. Every field has a
description because it becomes ``kubectl explain`` output.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_snake
from pydantic_core import PydanticCustomError

from .base import ApiModel
from .contract import (
    API_VERSION,
    BACKENDS,
    CONFIG_DIR,
    GROUP,
    KIND,
    KUEUE_GROUP,
    METRICS_PORT,
    POD_MOUNTS,
    RDZV_PORT,
    SHM_DIR,
    TRAINJOB,
    TRAINJOB_RUNTIME,
)
from .pod_resources import (
    DefaultRequests,
    default_memory_bytes,
    default_requests,
    default_shared_memory,
    parse_quantity,
)
from .presets import PRESETS, ModelDims, PresetName
from .rules import Rule, TransitionRule, immutable

# PyTorchJob pods and services are named <name>-worker-<index>; with up to
# 1000 nodes the index has 3 digits, and the whole must stay a 63-char label.
MAX_NODES = 1000
MAX_NAME_LENGTH = 63 - len("-worker-") - len(str(MAX_NODES - 1))

# Kubernetes resource.Quantity, as the API server parses it, without the
# minus sign: no request or limit of ours can be negative.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Env var names that look like credentials must come from a Secret, never
# inline: any name with one of these words between underscores (WANDB_KEY,
# DB_PASS, GH_PAT, AWS_SESSION_TOKEN, HF_TOKEN ...). A heuristic on the name
# only: a credential under an innocent name is not caught (docs/renderer.md).
SECRET_ENV_PATTERN = r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|KEY|PAT|CREDENTIALS?|PRIVATE)(_|$)"
# A reference with a tag (after the last "/") or a digest: an untagged image
# means :latest, whatever is pushed under it next.
IMAGE_PINNED_PATTERN = r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@[A-Za-z0-9_+.-]+:[0-9a-fA-F]{32,})$"
# The longest image reference the API accepts (bounds the CEL rule's cost).
MAX_IMAGE_LENGTH = 512
# EC2 families whose instances have GPUs (p: NVIDIA training, g: NVIDIA graphics/inference).
GPU_INSTANCE_PATTERN = r"^(p|g)[0-9]"

Quantity = Annotated[
    int | str,
    # pattern checks the strings, minimum the integers.
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "minimum": 0}),
]


ScriptWord = Annotated[str, Field(min_length=1, max_length=4096, description="One word of the command line.")]


# --- model -----------------------------------------------------------------


class ModelOverrides(ApiModel):
    """Architecture overrides applied on top of the preset or the architecture's config.json."""

    hidden_size: int | None = Field(None, ge=64, le=65536, description="Width of the residual stream (d_model).")
    num_layers: int | None = Field(None, ge=1, le=512, description="Number of decoder layers.")
    num_heads: int | None = Field(None, ge=1, le=1024, description="Number of attention (query) heads.")
    num_key_value_heads: int | None = Field(
        None, ge=1, le=1024, description="Number of key/value heads (grouped-query attention); divides numHeads."
    )
    intermediate_size: int | None = Field(
        None, ge=64, le=262144, description="Hidden width of the MLP (per expert for mixture-of-experts)."
    )
    vocab_size: int | None = Field(
        None, ge=256, le=1048576, description="Vocabulary size; must cover the tokenizer's vocabulary."
    )
    max_seq_len: int | None = Field(
        None, ge=16, le=1048576, description="Longest sequence the model supports (max_position_embeddings)."
    )


def _preset_cel(field: str) -> str:
    """CEL for the effective value of a model dimension: override or preset's."""
    attr = {
        "hiddenSize": "hidden_size",
        "numHeads": "num_heads",
        "numKeyValueHeads": "num_key_value_heads",
        "maxSeqLen": "max_seq_len",
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
        None,
        description=(
            "Llama architecture preset, randomly initialised: tiny (smoke tests, CPU), llama3.2-1b, "
            "llama3.2-3b, llama3.1-8b, llama3.1-70b."
        ),
    )
    architecture: str | None = Field(
        None,
        min_length=1,
        description=(
            "Hugging Face model id or local/PVC directory whose config.json gives the architecture "
            "(any decoder-only AutoModelForCausalLM); weights are randomly initialised with the "
            "architecture's own init. Its weights, if any, are not read."
        ),
    )
    config: ModelOverrides | None = Field(
        None, description="Overrides of the preset's or architecture's numbers (not with pretrained)."
    )
    pretrained: str | None = Field(
        None,
        min_length=1,
        description=(
            "Hugging Face model id or local/PVC path of a causal LM: its config.json gives the "
            "architecture, its safetensors the weights (streamed into the shards), its tokenizer "
            "the tokenizer unless data.tokenizer is set."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
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
            cel=f"!has(self.preset) || {_preset_cel('hiddenSize')} % {_preset_cel('numHeads')} == 0",
            message="hiddenSize must be divisible by numHeads",
            field_path=".config.hiddenSize",
            check=lambda m: m.dims() is None or m.dims().hidden_size % m.dims().num_heads == 0,
        ),
        Rule(
            cel=f"!has(self.preset) || {_preset_cel('numHeads')} % {_preset_cel('numKeyValueHeads')} == 0",
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


# --- data ------------------------------------------------------------------


class DataSpec(ApiModel):
    """Training data: a Hugging Face dataset, local files, or the embedded corpus."""

    dataset: str | None = Field(
        None, min_length=1, description="Hugging Face dataset id (e.g. allenai/c4). Mutually exclusive with path."
    )
    config: str | None = Field(None, min_length=1, description="Dataset configuration name (e.g. en for allenai/c4).")
    split: str = Field("train", min_length=1, description="Split to train on.")
    path: str | None = Field(
        None,
        min_length=1,
        description=(
            "Local or PVC path to json/jsonl/parquet/txt files (a file, a directory or a glob) "
            "instead of the hub. With neither dataset nor path, the corpus embedded in the trainer is used."
        ),
    )
    text_field: str = Field("text", min_length=1, description="Name of the column holding the text.")
    format: Literal["text", "chat", "prompt-completion"] = Field(
        "text",
        description=(
            "text: documents concatenated into full windows, every token trained (pre-training); "
            "chat: rows of messages rendered with the tokenizer's chat template, loss on assistant turns only; "
            "prompt-completion: rows of prompt and completion, loss on the completion only. "
            "chat and prompt-completion pack whole rows into sequences that never attend across rows."
        ),
    )
    messages_field: str = Field(
        "messages", min_length=1, description="format chat: column holding the list of {role, content} messages."
    )
    prompt_field: str = Field("prompt", min_length=1, description="format prompt-completion: column of the prompt.")
    completion_field: str = Field(
        "completion", min_length=1, description="format prompt-completion: column of the completion."
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate",
        description=(
            "chat and prompt-completion: a row longer than seqLen + 1 tokens is cut to its first seqLen + 1 "
            "tokens (truncate) or skipped (drop); either way it is counted and logged."
        ),
    )
    streaming: bool = Field(False, description="Stream the dataset instead of downloading it whole first.")
    tokenizer: str | None = Field(
        None,
        min_length=1,
        description=(
            "Hugging Face tokenizer id or local path (AutoTokenizer). "
            "Unset: pretrained's tokenizer if set, else the tokenizer embedded in the trainer."
        ),
    )
    validation_split: str | None = Field(
        None,
        min_length=1,
        description=(
            "Split used for validation. Unset: a deterministic held-out slice of the training "
            "documents (never trained on)."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.dataset) && has(self.path))",
            message="set either dataset or path, not both",
            field_path=".path",
            check=lambda d: not (d.dataset and d.path),
        ),
        Rule(
            cel="!has(self.format) || self.format == 'text' || has(self.dataset) || has(self.path)",
            message="format chat and prompt-completion need dataset or path: the embedded corpus is plain text",
            field_path=".format",
            check=lambda d: d.format == "text" or bool(d.dataset or d.path),
        ),
    )


# --- training --------------------------------------------------------------


class TrainingSpec(ApiModel):
    """Optimisation settings: steps, batch, learning rate, precision."""

    max_steps: int = Field(ge=1, le=100_000_000, description="Number of optimizer steps to train for.")
    seq_len: int | None = Field(
        None,
        ge=16,
        le=1048576,
        description="Tokens per sequence. Unset: min(2048, the model's maximum sequence length).",
    )
    micro_batch_size: int = Field(1, ge=1, le=4096, description="Sequences per GPU (per rank) per forward pass.")
    grad_accum_steps: int = Field(1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step.")
    learning_rate: float = Field(3e-4, gt=0, le=1, description="Peak learning rate of AdamW.")
    min_learning_rate_ratio: float = Field(
        0.1, ge=0, le=1, description="Final learning rate of the cosine schedule, as a fraction of the peak."
    )
    warmup_steps: int | None = Field(
        None, ge=0, description="Linear warm-up steps before the cosine decay. Unset: min(100, maxSteps/10)."
    )
    weight_decay: float = Field(0.1, ge=0, le=10, description="AdamW weight decay.")
    grad_clip_norm: float = Field(1.0, ge=0, description="Clip the global gradient norm to this value; 0 disables.")
    precision: Literal["bf16", "fp32"] = Field(
        "bf16", description="bf16: bf16 parameters and compute with fp32 gradient reduction; fp32: full precision."
    )
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none",
        description="Recompute activations in backward: none, selective (every other layer) or full (every layer).",
    )
    compile: bool = Field(False, description="torch.compile each decoder layer.")
    seed: int = Field(42, ge=0, le=2**31 - 1, description="Random seed for weight init and data order.")
    log_interval_steps: int = Field(10, ge=1, description="Steps between log lines on rank 0.")
    eval_interval_steps: int = Field(0, ge=0, description="Steps between validation runs; 0 disables validation.")
    eval_steps: int = Field(10, ge=1, description="Micro-batches per validation run.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.warmupSteps) || self.warmupSteps < self.maxSteps",
            message="warmupSteps must be smaller than maxSteps",
            field_path=".warmupSteps",
            check=lambda t: t.warmup_steps is None or t.warmup_steps < t.max_steps,
        ),
    )

    def effective_warmup_steps(self) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return min(100, self.max_steps // 10)


# --- fsdp ------------------------------------------------------------------


class FSDPSpec(ApiModel):
    """How FSDP2 shards the model."""

    sharding_strategy: Literal["full", "shard_grad_op", "no_shard", "hybrid"] = Field(
        "full",
        description=(
            "full: shard parameters, gradients and optimizer state, reshard after forward (ZeRO-3); "
            "shard_grad_op: keep parameters unsharded between forward and backward (ZeRO-2); "
            "no_shard: replicate (DDP-like); hybrid: shard within a node, replicate across nodes (needs nodes >= 2)."
        ),
    )
    cpu_offload: bool = Field(
        False, description="Keep sharded parameters, gradients and optimizer state in CPU memory."
    )
    prefetch: int = Field(
        0,
        ge=0,
        le=8,
        description="Explicit forward/backward prefetch depth in layers; 0 leaves FSDP's implicit prefetch.",
    )
    shard_group_size: int | None = Field(
        None,
        ge=1,
        le=16384,
        description=(
            "hybrid only: ranks per shard group (the inner dimension of the 2-D mesh); "
            "unset: the processes of one node. The world size must be a multiple of it."
        ),
    )


# --- peft ------------------------------------------------------------------

# A module name as transformers spells it (q_proj, mlp.down_proj, c_attn).
MODULE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$"
ModuleName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=MODULE_NAME_PATTERN,
        description="A module name or a suffix of one (q_proj, self_attn.v_proj).",
    ),
]


class PeftSpec(ApiModel):
    """Parameter-efficient fine-tuning: LoRA adapters on a frozen base model.

    The base weights are frozen (no gradients, no optimizer state) and only
    the adapters train; checkpoints hold the adapters, their optimizer state
    and the data position, and ``fsdp-train export`` writes a PEFT adapter
    directory or a merged model (docs/fine-tuning.md).
    """

    method: Literal["lora", "qlora"] = Field(
        "lora",
        description="lora: low-rank adapters on the frozen base (qlora, a 4-bit base, is not supported).",
    )
    rank: int = Field(16, ge=1, le=1024, description="Rank r of each adapter (A is r x in, B is out x r).")
    alpha: float | None = Field(
        None,
        gt=0,
        le=65536,
        description="LoRA alpha: the adapter's output is scaled by alpha / rank. Unset: twice the rank.",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input while training.")
    target_modules: list[ModuleName] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description=(
            "Modules to adapt, by name or name suffix as PEFT matches them (q_proj, self_attn.v_proj); "
            "each must match a Linear layer inside the decoder layers. Unset: every Linear layer of the "
            "decoder layers (attention and MLP projections; MoE routers excepted), found from the model."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.method != 'qlora'",
            message="qlora (4-bit base weights) is not supported; use lora (docs/fine-tuning.md says why)",
            field_path=".method",
            check=lambda s: s.method != "qlora",
        ),
    )

    def effective_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * self.rank

    def scaling(self) -> float:
        return self.effective_alpha() / self.rank


# --- resources -------------------------------------------------------------


# sharedMemory <= the memory limit: memory, else the smallest default of the listed instance
# types (when all of them have one). Quantities are compared with the API server's quantity
# library; the defaults (bytes) are a table from pod_resources, so both sides use the same
# numbers. Against the table the comparison is in float64, exact for any size up to 8 PiB:
# quantity(string(<an int the estimator cannot bound>)) exceeds the CEL cost budget.
_DEFAULT_MEMORY = "{" + ", ".join(f"'{name}': {size}" for name, size in default_memory_bytes().items()) + "}"
_SHARED_MEMORY_CEL = (
    "!has(self.sharedMemory) || !isQuantity(string(self.sharedMemory)) || ("
    "has(self.memory) ? (!isQuantity(string(self.memory)) || "
    "quantity(string(self.sharedMemory)).compareTo(quantity(string(self.memory))) <= 0) : ("
    "!has(self.instanceTypes) || self.instanceTypes.size() == 0 || "
    f"self.instanceTypes.exists(t, !(t in {_DEFAULT_MEMORY})) || "
    "quantity(string(self.sharedMemory)).asApproximateFloat() <= "
    f"double(self.instanceTypes.map(t, {_DEFAULT_MEMORY}[t]).min())))"
)


class ResourcesSpec(ApiModel):
    """Where the job runs: node count, GPUs, EFA and Karpenter capacity."""

    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Number of nodes (pods); one pod per node.")
    gpus_per_node: int = Field(
        8, ge=0, le=16, description="GPUs per node; one training process per GPU. 0 runs one CPU process per node."
    )
    instance_types: list[Annotated[str, Field(min_length=1, max_length=64, description="An EC2 instance type.")]] = (
        Field(
            default_factory=list,
            max_length=64,
            description="Allowed EC2 instance types (e.g. p5.48xlarge); empty: any in the NodePool.",
        )
    )
    capacity_type: Literal["on-demand", "spot", "reserved"] = Field(
        "on-demand", description="Karpenter capacity type to run on."
    )
    node_pool: str = Field("gpu", pattern=DNS_LABEL, description="Karpenter NodePool that provisions the nodes.")
    placement: Literal["karpenter", "none"] = Field(
        "karpenter",
        description=(
            "karpenter: select nodes of nodePool with capacityType (Karpenter's labels) and ask Karpenter not to "
            "disrupt them; none: no Karpenter label, selector or annotation at all (SageMaker HyperPod, managed "
            "node groups): nodePool and capacityType are ignored, pod.nodeSelector and pod.affinity choose the nodes."
        ),
    )
    efa_per_node: int = Field(0, ge=0, le=32, description="EFA interfaces (vpc.amazonaws.com/efa) per node; 0: no EFA.")
    cpu: Quantity | None = Field(
        None,
        description=(
            "CPU request per pod (e.g. 90); no limit. Unset: derived from instanceTypes, the smallest "
            "type's allocatable vCPUs as Karpenter computes them less room for DaemonSets "
            "(docs/renderer.md); no request when none is listed or one has no known size."
        ),
    )
    memory: Quantity | None = Field(
        None,
        description=(
            "Memory request and limit per pod (e.g. 1800Gi). Unset: derived from instanceTypes like cpu "
            "(docs/renderer.md); none when none is listed or one has no known size."
        ),
    )
    shared_memory: Quantity | None = Field(
        None,
        description=(
            "Size limit of the memory-backed /dev/shm, whose pages count against the memory limit "
            "(at most that limit). Unset: a quarter of the memory limit; no limit when the pod has none."
        ),
    )

    @field_validator("cpu", "memory", "shared_memory")
    @classmethod
    def _quantity(cls, v: int | str | None) -> str | None:
        if v is None:
            return None
        s = str(v)
        if s.startswith("-") and re.match(QUANTITY_PATTERN, s[1:]):
            raise ValueError(f"{s!r} is negative: requests and limits must be at least 0")
        if not re.match(QUANTITY_PATTERN, s):
            raise ValueError(f"{s!r} is not a Kubernetes quantity (e.g. 64Gi, 500m)")
        return s

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "(has(self.gpusPerNode) ? self.gpusPerNode : 8) > 0 || !has(self.instanceTypes)"
                f" || !self.instanceTypes.exists(t, t.matches('{GPU_INSTANCE_PATTERN}'))"
            ),
            message=(
                "gpusPerNode is 0 but instanceTypes lists GPU instances (p*, g*): the CPU job would hold "
                "GPU nodes it never uses; set gpusPerNode or list CPU instance types"
            ),
            field_path=".instanceTypes",
            check=lambda r: r.gpus_per_node > 0 or not any(re.match(GPU_INSTANCE_PATTERN, t) for t in r.instance_types),
        ),
        Rule(
            cel=_SHARED_MEMORY_CEL,
            message=(
                "sharedMemory must not exceed the memory limit (memory, or the one derived from "
                "instanceTypes): /dev/shm's pages count against it"
            ),
            field_path=".sharedMemory",
            check=lambda r: r.shared_memory_fits(),
        ),
    )

    def default_requests(self) -> DefaultRequests | None:
        """CPU and memory derived from instanceTypes (pod_resources), whether or not cpu/memory are set."""
        return default_requests(self.instance_types)

    def effective_cpu(self) -> str | None:
        """The CPU request: cpu, else derived from instanceTypes, else None."""
        if self.cpu is not None:
            return str(self.cpu)
        defaults = self.default_requests()
        return defaults.cpu if defaults else None

    def effective_memory(self) -> str | None:
        """The memory request and limit: memory, else derived from instanceTypes, else None."""
        if self.memory is not None:
            return str(self.memory)
        defaults = self.default_requests()
        return defaults.memory if defaults else None

    def effective_shared_memory(self) -> str | None:
        """/dev/shm's size limit: sharedMemory, else a quarter of the memory limit, else None."""
        if self.shared_memory is not None:
            return str(self.shared_memory)
        memory = self.effective_memory()
        return default_shared_memory(memory) if memory is not None else None

    def shared_memory_fits(self) -> bool:
        memory = self.effective_memory()
        if self.shared_memory is None or memory is None:
            return True
        return parse_quantity(self.shared_memory) <= parse_quantity(memory)


# --- checkpoint ------------------------------------------------------------


class CheckpointSpec(ApiModel):
    """Distributed checkpoints (torch.distributed.checkpoint) and resume."""

    dir: str = Field(
        "/checkpoints",
        max_length=4096,
        pattern=r"^(/[^/]+)+$",
        description="Absolute directory for checkpoints inside the pod (no trailing slash).",
    )
    interval_steps: int = Field(500, ge=1, description="Steps between checkpoints (one is always written at the end).")
    keep_last: int = Field(3, ge=1, le=1000, description="Complete checkpoints to keep; older ones are deleted.")
    claim_name: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description=(
            "PersistentVolumeClaim mounted at dir. Unset: checkpoints live in an emptyDir and are lost "
            "with the pod, and when it finishes (the status says so)."
        ),
    )
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: resume from the newest complete checkpoint in dir; never: always start fresh."
    )
    async_save: bool = Field(False, description="Save checkpoints asynchronously, overlapping the next steps.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            # has(): the API server also checks the schema's default ({}) before it is filled.
            cel=r"!has(self.dir) || !self.dir.matches('(^|/)\\.\\.?(/|$)')",
            message="dir must not contain . or .. segments",
            field_path=".dir",
            check=lambda c: re.search(r"(^|/)\.\.?(/|$)", c.dir) is None,
        ),
        Rule(
            cel=(
                "!has(self.dir) || ![" + ", ".join(f"'{m}'" for m in POD_MOUNTS) + "]"
                ".exists(m, m == self.dir || m.startsWith(self.dir + '/'))"
            ),
            message=(
                "dir must not be a directory the pod already mounts ("
                + ", ".join(POD_MOUNTS)
                + ") nor a parent of one: the checkpoint volume would hide it"
            ),
            field_path=".dir",
            check=lambda c: not any(m == c.dir or m.startswith(c.dir + "/") for m in POD_MOUNTS),
        ),
    )


class ElasticSpec(ApiModel):
    """Elastic training: torchrun tolerates node loss between minNodes and maxNodes."""

    min_nodes: int = Field(ge=1, le=MAX_NODES, description="Fewest nodes to keep training with.")
    max_nodes: int = Field(ge=1, le=MAX_NODES, description="Most nodes to train with.")
    max_restarts: int = Field(3, ge=0, le=1000, description="Times torchrun restarts the workers before failing.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.minNodes <= self.maxNodes",
            message="minNodes must not exceed maxNodes",
            field_path=".minNodes",
            check=lambda e: e.min_nodes <= e.max_nodes,
        ),
    )


class MetricsSpec(ApiModel):
    """The trainer's Prometheus endpoint (one per pod, covering all local ranks)."""

    enabled: bool = Field(True, description="Serve Prometheus metrics and emit a PodMonitor.")
    port: int = Field(METRICS_PORT, ge=1024, le=65535, description="Port of the metrics endpoint in each pod.")


NamespaceName = Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description="A namespace.")]


class NetworkPolicySpec(ApiModel):
    """A NetworkPolicy around the job's pods: only the job's pods and, on the metrics port, listed namespaces."""

    enabled: bool = Field(
        True,
        description=(
            "Emit the NetworkPolicy. It is enforced only where the cluster's network plugin implements "
            "NetworkPolicy (on EKS: the VPC CNI with network policy enabled, or Calico/Cilium)."
        ),
    )
    metrics_from_namespaces: list[NamespaceName] = Field(
        default_factory=lambda: ["fsdp-system", "monitoring"],
        max_length=32,
        description="Namespaces whose pods may read the metrics port: the operator's and Prometheus'.",
    )


# --- stall watchdog -----------------------------------------------------------


class StallSpec(ApiModel):
    """When a training counts as stalled (no new optimizer step for too long) and what happens then.

    The operator times the steps it reads from the trainer's metrics; the
    trainer has its own in-process watchdog for a single step.
    """

    on_stall: Literal["alert", "restart"] = Field(
        "alert",
        description=(
            "alert: set the Stalled condition and post an Event; restart: also delete the job's pods "
            "so that they are re-created and resume from the last checkpoint (at most maxRestarts times)."
        ),
    )
    step_time_factor: float = Field(
        10.0,
        ge=2,
        le=1000,
        description="Stalled when no new step for this many times the recent step time (and at least minSeconds).",
    )
    min_seconds: int = Field(300, ge=5, le=86400, description="Floor of the no-new-step limit, in seconds.")
    startup_seconds: int = Field(
        1800,
        ge=5,
        le=86400,
        description="Allowance for the first steps after a start or restart (model and checkpoint loading).",
    )
    checkpoint_seconds: int = Field(
        1800,
        ge=0,
        le=86400,
        description="Extra allowance after a step that saves a checkpoint or runs validation.",
    )
    max_restarts: int = Field(
        3, ge=0, le=100, description="onStall restart: restarts for stalls before the operator only alerts."
    )
    trainer_step_timeout_seconds: int = Field(
        1800,
        ge=0,
        le=604800,
        description=(
            "The trainer's own watchdog: a rank whose step takes longer (plus startupSeconds for the first "
            "step, checkpointSeconds for a save or validation) writes every thread's stack to its log and to "
            "<checkpoint.dir>/stalls/, then exits so that it is restarted; 0 disables it."
        ),
    )


# --- env -------------------------------------------------------------------


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap."""

    name: str = Field(min_length=1, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, description="Key to read.")
    optional: bool | None = Field(None, description="Whether the reference may be missing.")


class FieldSelector(ApiModel):
    """A field of the pod (downward API)."""

    field_path: str = Field(min_length=1, description="Path of the field, e.g. metadata.name.")


class EnvVarSource(ApiModel):
    """Where the value of an environment variable comes from."""

    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret (use this for tokens).")
    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(None, description="A field of the pod.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)].filter(x, x).size() == 1",
            message="exactly one of secretKeyRef, configMapKeyRef or fieldRef must be set",
            check=lambda s: sum(x is not None for x in (s.secret_key_ref, s.config_map_key_ref, s.field_ref)) == 1,
        ),
    )


class EnvVar(ApiModel):
    """An extra environment variable for the trainer container."""

    # maxLength bounds the cost of the credential-name regex (CEL cost budget).
    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=128, description="Variable name.")
    value: str | None = Field(None, description="Literal value (not allowed for credentials: use valueFrom).")
    value_from: EnvVarSource | None = Field(None, description="Source of the value, e.g. a Secret key.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set either value or valueFrom, not both",
            field_path=".valueFrom",
            check=lambda e: not (e.value is not None and e.value_from is not None),
        ),
        Rule(
            cel=f"!(has(self.value) && self.name.matches('{SECRET_ENV_PATTERN}'))",
            message="looks like a credential: take it from a Secret with valueFrom.secretKeyRef, not a literal value",
            field_path=".value",
            check=lambda e: not (e.value is not None and re.search(SECRET_ENV_PATTERN, e.name)),
        ),
    )


# --- pod -------------------------------------------------------------------

# Label and annotation keys that are ours or the Kubeflow training operator's:
# the renderer sets them and selectors, the PodMonitor and the operator's pod
# loop rely on them, so a user value must not replace them.
RESERVED_KEY_PREFIXES = ("app.kubernetes.io/", f"{GROUP}/", "training.kubeflow.org/")
# Set on every pod under placement karpenter (docs/renderer.md).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
# Keys of the nodeSelector that resources.nodePool and resources.capacityType own.
KARPENTER_SELECTOR_KEYS = ("karpenter.sh/nodepool", "karpenter.sh/capacity-type")
# A qualified name, as label and annotation keys are (an optional DNS-subdomain
# prefix and '/', then at most 63 characters), bounded for the CEL cost budget.
QUALIFIED_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# Where the default grace period comes from: docs/renderer.md, "Pod settings".
DEFAULT_GRACE_SECONDS = 300
# Volume names the renderer uses (pod.volumes in operator/fsdp_operator/render).
RESERVED_VOLUME_NAMES = ("config", "dshm", "checkpoints", "tmp", "home")
# Mounts of ours that a user mount may not lie inside: read-only config, the
# memory-backed /dev/shm, and checkpoint.dir (the trainer rotates its contents).
NO_NESTING_MOUNTS = (CONFIG_DIR, SHM_DIR)

LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN, description="A label value.")]
AnnotationValue = Annotated[str, Field(max_length=8192, description="An annotation value.")]


def _reserved_key(key: str) -> bool:
    return key.startswith(RESERVED_KEY_PREFIXES)


_RESERVED_CEL = " || ".join(f"k.startsWith('{p}')" for p in RESERVED_KEY_PREFIXES)
_RESERVED_TEXT = ", ".join(f"{p}*" for p in RESERVED_KEY_PREFIXES)


def _keys_rule(field: str, what: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || self.{field}.all(k, k.matches('{QUALIFIED_NAME_PATTERN}'))",
        message=f"{field} keys must be {what}: an optional DNS-subdomain prefix and '/', then a name of at most 63 "
        "letters, digits, '-', '_' or '.' that starts and ends with a letter or digit",
        field_path=f".{field}",
        check=lambda p: all(re.match(QUALIFIED_NAME_PATTERN, k) for k in getattr(p, to_snake(field))),
    )


class Toleration(ApiModel):
    """A toleration of a node taint, added to the pods' own (the nvidia.com/gpu taint for GPU jobs)."""

    key: str | None = Field(
        None, min_length=1, max_length=317, description="Taint key to tolerate; unset (with Exists): every taint."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        None, description="Equal (default): the taint's value must equal value; Exists: any value."
    )
    value: str | None = Field(None, max_length=63, description="Taint value to match (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; unset: every effect."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, le=2**31 - 1, description="NoExecute only: how long the pod stays bound after the taint appears."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.key) || (has(self.operator) && self.operator == 'Exists')",
            message="a toleration without key needs operator Exists (it then tolerates every taint)",
            field_path=".operator",
            check=lambda t: t.key is not None or t.operator == "Exists",
        ),
        Rule(
            cel="!(has(self.operator) && self.operator == 'Exists' && has(self.value))",
            message="value must be unset with operator Exists",
            field_path=".value",
            check=lambda t: not (t.operator == "Exists" and t.value is not None),
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds needs effect NoExecute",
            field_path=".tolerationSeconds",
            check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
    )


_SET_OPERATORS = ("In", "NotIn")
_VALUE_RULE_CEL = (
    "self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || size(self.values) == 0) : "
    "(has(self.values) && (self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : size(self.values) == 1))"
)


def _values_ok(r: NodeSelectorRequirement | LabelSelectorRequirement) -> bool:
    n = len(r.values or [])
    if r.operator in ("Exists", "DoesNotExist"):
        return n == 0
    return n > 0 if r.operator in _SET_OPERATORS else n == 1


_VALUES_MESSAGE = (
    "values must be empty with Exists or DoesNotExist, non-empty with In or NotIn, one value with Gt or Lt"
)


class NodeSelectorRequirement(ApiModel):
    """A requirement on a node label."""

    key: str = Field(min_length=1, max_length=317, description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the label relates to values."
    )
    values: list[Annotated[str, Field(max_length=63, description="A label value.")]] | None = Field(
        None, max_length=64, description="Values (In, NotIn: one or more; Gt, Lt: one integer; else none)."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(cel=_VALUE_RULE_CEL, message=_VALUES_MESSAGE, field_path=".values", check=_values_ok),
    )


class NodeSelectorTerm(ApiModel):
    """Requirements that a node must all meet (ANDed)."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        min_length=1, max_length=16, description="Requirements on node labels, all of which must hold."
    )


class NodeSelector(ApiModel):
    """Node selector terms, any one of which suffices (ORed)."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=8, description="Terms; a node must meet at least one."
    )


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="Weight of the preference (1-100).")
    preference: NodeSelectorTerm = Field(description="The preferred node term.")


class NodeAffinity(ApiModel):
    """Node affinity, combined with the pods' own (resources.instanceTypes)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        None, description="Nodes the pods must run on; each term is ANDed with resources.instanceTypes."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        None, max_length=8, description="Nodes the pods prefer."
    )


class LabelSelectorRequirement(ApiModel):
    """A requirement on a pod label."""

    key: str = Field(min_length=1, max_length=317, description="Pod label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the label relates to values.")
    values: list[Annotated[str, Field(max_length=63, description="A label value.")]] | None = Field(
        None, max_length=64, description="Values (In, NotIn: one or more; else none)."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(cel=_VALUE_RULE_CEL, message=_VALUES_MESSAGE, field_path=".values", check=_values_ok),
    )


class LabelSelector(ApiModel):
    """A pod label selector."""

    match_labels: dict[str, LabelValue] | None = Field(None, max_length=16, description="Labels to match.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        None, max_length=8, description="Requirements on pod labels."
    )


class PodAffinityTerm(ApiModel):
    """Pods (by label) in whose topology domain the pods must, or must not, run."""

    label_selector: LabelSelector | None = Field(None, description="Pods this term is about.")
    namespaces: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description="A namespace.")]] | None = (
        Field(None, max_length=16, description="Namespaces of those pods; unset: the training's namespace.")
    )
    topology_key: str = Field(
        min_length=1, max_length=317, description="Node label of the domain (e.g. topology.kubernetes.io/zone)."
    )


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="Weight of the preference (1-100).")
    pod_affinity_term: PodAffinityTerm = Field(description="The preferred term.")


class PodAffinity(ApiModel):
    """Pod affinity or anti-affinity terms, added to the pods' own."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        None, max_length=8, description="Terms the pods must meet."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        None, max_length=8, description="Terms the pods prefer."
    )


class Affinity(ApiModel):
    """Extra affinity: a typed subset of the pod's affinity, merged with the renderer's (docs/renderer.md)."""

    node_affinity: NodeAffinity | None = Field(None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(None, description="Pod affinity (added to the EFA zone affinity).")
    pod_anti_affinity: PodAffinity | None = Field(
        None, description="Pod anti-affinity (added to the one-pod-per-node term)."
    )


class PersistentVolumeClaimSource(ApiModel):
    """A PersistentVolumeClaim in the training's namespace (e.g. a data set on EBS or FSx for Lustre)."""

    claim_name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Name of the claim.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class ConfigMapSource(ApiModel):
    """A ConfigMap's keys as files."""

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Name of the ConfigMap.")
    optional: bool | None = Field(None, description="Whether the ConfigMap may be missing.")


class SecretSource(ApiModel):
    """A Secret's keys as files."""

    secret_name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Name of the Secret.")
    optional: bool | None = Field(None, description="Whether the Secret may be missing.")


class EmptyDirSource(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = Field(None, description="Memory: a tmpfs counted against memory.")
    size_limit: Quantity | None = Field(None, description="Size limit (e.g. 100Gi).")

    @field_validator("size_limit")
    @classmethod
    def _quantity(cls, v: int | str | None) -> str | None:
        if v is not None and not re.match(QUANTITY_PATTERN, str(v)):
            raise ValueError(f"{v!r} is not a Kubernetes quantity (e.g. 64Gi)")
        return None if v is None else str(v)


class CSISource(ApiModel):
    """An inline CSI volume (drivers that support ephemeral inline volumes, e.g. the Mountpoint for S3 driver)."""

    driver: str = Field(pattern=DNS_SUBDOMAIN, max_length=63, description="CSI driver name.")
    read_only: bool | None = Field(None, description="Mount read-only.")
    volume_attributes: dict[str, Annotated[str, Field(max_length=1024, description="An attribute value.")]] | None = (
        Field(None, max_length=32, description="Driver-specific attributes.")
    )


class NFSSource(ApiModel):
    """An NFS export (e.g. EFS by its DNS name)."""

    server: str = Field(min_length=1, max_length=253, description="NFS server host name or IP.")
    path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Exported path.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class Volume(ApiModel):
    """An extra volume of the training pods: exactly one source."""

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="Volume name, referenced by volumeMounts.")
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(None, description="A PVC.")
    config_map: ConfigMapSource | None = Field(None, description="A ConfigMap.")
    secret: SecretSource | None = Field(None, description="A Secret.")
    empty_dir: EmptyDirSource | None = Field(None, description="An emptyDir.")
    csi: CSISource | None = Field(None, description="An inline CSI volume.")
    nfs: NFSSource | None = Field(None, description="An NFS export.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                "[has(self.persistentVolumeClaim), has(self.configMap), has(self.secret), has(self.emptyDir),"
                " has(self.csi), has(self.nfs)].filter(x, x).size() == 1"
            ),
            message="set exactly one source: persistentVolumeClaim, configMap, secret, emptyDir, csi or nfs",
            check=lambda v: v.source_count() == 1,
        ),
    )

    def source_count(self) -> int:
        sources = (self.persistent_volume_claim, self.config_map, self.secret, self.empty_dir, self.csi, self.nfs)
        return sum(x is not None for x in sources)


class VolumeMount(ApiModel):
    """Where an extra volume is mounted in the trainer container."""

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="Name of a volume in pod.volumes.")
    mount_path: str = Field(
        max_length=1024,
        pattern=r"^(/[^/]+)+$",
        description=(
            "Absolute path (no trailing slash); not one of the pod's own mounts nor a parent of one, "
            "not inside /etc/fsdp, /dev/shm or checkpoint.dir."
        ),
    )
    read_only: bool | None = Field(None, description="Mount read-only.")
    sub_path: str | None = Field(
        None, min_length=1, max_length=1024, pattern=r"^[^/]", description="Path inside the volume to mount."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                r"!self.mountPath.matches('(^|/)\\.\\.?(/|$)')"
                r" && (!has(self.subPath) || !self.subPath.matches('(^|/)\\.\\.(/|$)'))"
            ),
            message="mountPath must not contain . or .. segments, nor subPath ..",
            field_path=".mountPath",
            check=lambda m: (
                re.search(r"(^|/)\.\.?(/|$)", m.mount_path) is None
                and (m.sub_path is None or re.search(r"(^|/)\.\.(/|$)", m.sub_path) is None)
            ),
        ),
    )


class PodSettings(ApiModel):
    """Settings of the training pods beyond what the renderer derives (docs/renderer.md, "Pod settings").

    Immutable: the training operator does not re-create running pods when their
    template changes, so a change would apply to some pods and not others.
    """

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "Labels added to the PyTorchJob and to its pods (e.g. a team or cost-center label). "
            f"Keys under {_RESERVED_TEXT} are the operator's and are refused."
        ),
    )
    annotations: dict[str, AnnotationValue] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "Annotations added to the PyTorchJob and to its pods. Keys under "
            f"{_RESERVED_TEXT} and {DO_NOT_DISRUPT} are the operator's and are refused."
        ),
    )
    priority_class_name: str | None = Field(
        None, pattern=DNS_SUBDOMAIN, max_length=253, description="PriorityClass of the pods."
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "Node labels the pods require, added to the Karpenter selector of resources "
            "(karpenter.sh/nodepool and karpenter.sh/capacity-type come from resources and are refused here)."
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Tolerations added to the pods' own."
    )
    affinity: Affinity | None = Field(None, description="Affinity merged with the pods' own (docs/renderer.md).")
    volumes: list[Volume] = Field(
        default_factory=list, max_length=16, description="Extra volumes (a data PVC, FSx for Lustre, a Secret)."
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=16, description="Mounts of the extra volumes in the trainer container."
    )
    termination_grace_period_seconds: int = Field(
        DEFAULT_GRACE_SECONDS,
        ge=0,
        le=86400,
        description=(
            "Seconds between SIGTERM and SIGKILL on pod deletion (drain, spot interruption, suspend, preemption); "
            "the trainer checkpoints its current step in that time, and torchrun waits for it up to 15 s less. "
            f"Default {DEFAULT_GRACE_SECONDS}: room for a sharded save (docs/renderer.md)."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        _keys_rule("labels", "label keys"),
        Rule(
            cel=f"!has(self.labels) || !self.labels.exists(k, {_RESERVED_CEL})",
            message=f"labels must not use the operator's keys ({_RESERVED_TEXT}): they select the job's pods",
            field_path=".labels",
            check=lambda p: not any(_reserved_key(k) for k in p.labels),
        ),
        Rule(
            cel=f"!has(self.labels) || !self.labels.exists(k, k.startsWith('{KUEUE_GROUP}/'))",
            message=f"labels must not set Kueue's keys ({KUEUE_GROUP}/*): use spec.scheduling",
            field_path=".labels",
            check=lambda p: not any(k.startswith(f"{KUEUE_GROUP}/") for k in p.labels),
        ),
        _keys_rule("annotations", "qualified names"),
        Rule(
            cel=f"!has(self.annotations) || !self.annotations.exists(k, {_RESERVED_CEL} || k == '{DO_NOT_DISRUPT}')",
            message=f"annotations must not use the operator's keys ({_RESERVED_TEXT}, {DO_NOT_DISRUPT})",
            field_path=".annotations",
            check=lambda p: not any(_reserved_key(k) or k == DO_NOT_DISRUPT for k in p.annotations),
        ),
        _keys_rule("nodeSelector", "label keys"),
        Rule(
            cel="!has(self.nodeSelector) || !["
            + ", ".join(f"'{k}'" for k in KARPENTER_SELECTOR_KEYS)
            + "].exists(k, k in self.nodeSelector)",
            message=(
                "nodeSelector must not set karpenter.sh/nodepool or karpenter.sh/capacity-type: "
                "use resources.nodePool and resources.capacityType"
            ),
            field_path=".nodeSelector",
            check=lambda p: not any(k in p.node_selector for k in KARPENTER_SELECTOR_KEYS),
        ),
        Rule(
            cel=(
                "!has(self.volumes) || self.volumes.all(v, !(v.name in ["
                + ", ".join(f"'{n}'" for n in RESERVED_VOLUME_NAMES)
                + "]) && self.volumes.filter(w, w.name == v.name).size() == 1)"
            ),
            message=(
                "volume names must be unique and not one of the pod's own (" + ", ".join(RESERVED_VOLUME_NAMES) + ")"
            ),
            field_path=".volumes",
            check=lambda p: (
                len({v.name for v in p.volumes}) == len(p.volumes)
                and not any(v.name in RESERVED_VOLUME_NAMES for v in p.volumes)
            ),
        ),
        Rule(
            cel=(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, "
                "has(self.volumes) && self.volumes.exists(v, v.name == m.name))"
            ),
            message="each volumeMount must name a volume of pod.volumes",
            field_path=".volumeMounts",
            check=lambda p: all(any(v.name == m.name for v in p.volumes) for m in p.volume_mounts),
        ),
        Rule(
            cel=(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, self.volumeMounts.all(n, "
                "m == n || (m.mountPath != n.mountPath && !n.mountPath.startsWith(m.mountPath + '/'))))"
            ),
            message="volumeMounts must not share a mountPath nor lie inside one another",
            field_path=".volumeMounts",
            check=lambda p: all(
                m is n or (m.mount_path != n.mount_path and not n.mount_path.startswith(m.mount_path + "/"))
                for m in p.volume_mounts
                for n in p.volume_mounts
            ),
        ),
    )


class SchedulingSpec(ApiModel):
    """Queueing on a shared cluster with Kueue (docs/kueue.md)."""

    queue: str | None = Field(
        None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description=(
            "Kueue LocalQueue in the training's namespace that admits the job (the kueue.x-k8s.io/queue-name "
            "label). The job is then created suspended and Kueue decides when it runs; unset: no queueing."
        ),
    )
    priority_class: str | None = Field(
        None,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
        description=(
            "Kueue WorkloadPriorityClass of the job (the kueue.x-k8s.io/priority-class label): orders the queue "
            "and decides who preempts whom. The pods' own PriorityClass is pod.priorityClassName."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!has(self.priorityClass) || has(self.queue)",
            message="priorityClass is Kueue's: set queue too",
            field_path=".priorityClass",
            check=lambda s: s.priority_class is None or s.queue is not None,
        ),
    )


class RunPolicySpec(ApiModel):
    """Deadlines of the whole job (the PyTorchJob's runPolicy)."""

    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description=(
            "Seconds after the job starts before the training operator fails it and deletes its running pods; "
            "unset: no deadline. Set it above the expected run time (plus restarts)."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description=(
            "Seconds after the job finishes before the training operator deletes it and its pods "
            "(the FSDPTraining, its status and the checkpoints stay); unset: kept until the FSDPTraining is deleted."
        ),
    )


def _mounts_clash(mount_path: str, checkpoint_dir: str) -> bool:
    ours = (*POD_MOUNTS, checkpoint_dir)
    hides = any(p == mount_path or p.startswith(mount_path + "/") for p in ours)
    inside = any(mount_path.startswith(p + "/") for p in (*NO_NESTING_MOUNTS, checkpoint_dir))
    return hides or inside


_CKPT_CEL = (
    "(has(self.checkpoint) && has(self.checkpoint.dir) ? self.checkpoint.dir : "
    f"'{CheckpointSpec.model_fields['dir'].default}')"
)


# --- the whole spec --------------------------------------------------------


# training.seqLen when unset: this, or the model's maximum if that is shorter.
DEFAULT_SEQ_LEN = 2048


def effective_seq_len(training: TrainingSpec, model: ModelSpec, max_positions: int | None = None) -> int:
    """training.seqLen, or its documented default when unset.

    ``max_positions`` is the model's maximum when it is known only from a
    config.json (the trainer reads it); a preset knows its own.
    """
    if training.seq_len is not None:
        return training.seq_len
    dims = model.dims()
    limit = dims.max_seq_len if dims is not None else max_positions
    return DEFAULT_SEQ_LEN if limit is None else min(DEFAULT_SEQ_LEN, limit)


# Checked on the spec (CEL + pydantic) and again on the trainer's config, where
# CLI overrides can change seqLen after kubectl apply has accepted the object.
SEQ_LEN_RULE = Rule(
    cel=(
        "!has(self.training) || !has(self.training.seqLen) || !has(self.model) || !has(self.model.preset)"
        " || self.training.seqLen <= " + _preset_cel("maxSeqLen").replace("self.", "self.model.")
    ),
    message="training.seqLen must not exceed the model's maxSeqLen",
    field_path=".training.seqLen",
    check=lambda s: (
        s.training is None
        or s.training.seq_len is None
        or s.model is None
        or s.model.dims() is None
        or s.training.seq_len <= s.model.dims().max_seq_len
    ),
)


# --- your own training script (spec.command) -------------------------------------


def _cel_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and "'" not in value:
        return f"'{value}'"
    raise TypeError(f"no CEL literal for {value!r}")


def _wire_name(owner: type[BaseModel], attr: str) -> str:
    return owner.model_fields[attr].alias or attr


def _left_alone(section: str, owner: type[BaseModel], attrs: tuple[str, ...]) -> Rule:
    """With spec.command, ``section``'s ``attrs`` (settings only the built-in trainer reads) keep their defaults.

    The CRD defaults these sections, so the API server cannot tell "unset"
    from "set to the default": comparing with the defaults is what both sides
    can check, and a value the script would silently ignore is refused.
    """
    fields = [(attr, _wire_name(owner, attr), owner.model_fields[attr].default) for attr in attrs]
    terms = [
        f"!has(self.{section}.{wire})"
        if default is None
        else f"(!has(self.{section}.{wire}) || self.{section}.{wire} == {_cel_literal(default)})"
        for _, wire, default in fields
    ]
    whole = len(fields) == len(owner.model_fields)
    shown = [section] if whole else [f"{section}.{wire}" for _, wire, _ in fields]
    return Rule(
        cel=f"!has(self.command) || !has(self.{section}) || (" + " && ".join(terms) + ")",
        message=_replaced_message(shown),
        field_path=f".{section}",
        check=lambda s: (
            s.command is None or all(getattr(getattr(s, section), attr) == default for attr, _, default in fields)
        ),
    )


def _replaced_message(names: list[str]) -> str:
    one = len(names) == 1
    return (
        f"{', '.join(names)} {'is a setting' if one else 'are settings'} of the built-in trainer, which command "
        f"replaces: leave {'it' if one else 'them'} unset and give your script its own settings in args"
    )


def _all_fields(owner: type[BaseModel]) -> tuple[str, ...]:
    return tuple(owner.model_fields)


COMMAND_RULES: tuple[Rule, ...] = (
    Rule(
        cel="has(self.command) || has(self.model)",
        message="model is required (unless command runs your own training script)",
        field_path=".model",
        check=lambda s: s.command is not None or s.model is not None,
    ),
    Rule(
        cel="has(self.command) || has(self.training)",
        message="training is required (unless command runs your own training script)",
        field_path=".training",
        check=lambda s: s.command is not None or s.training is not None,
    ),
    Rule(
        cel="!has(self.args) || has(self.command)",
        message="args are the arguments of command: set command too",
        field_path=".args",
        check=lambda s: s.args is None or s.command is not None,
    ),
    Rule(
        cel=(
            "!has(self.command)"
            " || (self.command[0] == '-m' ? size(self.command) >= 2 : !self.command[0].startsWith('-'))"
        ),
        message="command must start with a script path or with -m and a module name, as torchrun takes them "
        "(torchrun's own flags are the operator's)",
        field_path=".command",
        check=lambda s: (
            s.command is None or (len(s.command) >= 2 if s.command[0] == "-m" else not s.command[0].startswith("-"))
        ),
    ),
    *(
        Rule(
            cel=f"!has(self.command) || !has(self.{section})",
            message=_replaced_message([section]),
            field_path=f".{section}",
            check=lambda s, attr=attr: s.command is None or getattr(s, attr) is None,
        )
        for section, attr in (("model", "model"), ("training", "training"), ("peft", "peft"))
    ),
    _left_alone("data", DataSpec, _all_fields(DataSpec)),
    _left_alone("fsdp", FSDPSpec, _all_fields(FSDPSpec)),
    _left_alone("checkpoint", CheckpointSpec, ("interval_steps", "keep_last", "resume", "async_save")),
    _left_alone("stall", StallSpec, ("trainer_step_timeout_seconds",)),
)


Backend = Literal["pytorchjob", "trainjob"]
assert set(Backend.__args__) == set(BACKENDS)  # type: ignore[attr-defined]

_TRAINJOB = f"self.backend == '{TRAINJOB.name}'"
_TRAINJOB_WHY = (
    f"with backend: trainjob the pods come from the ClusterTrainingRuntime {TRAINJOB_RUNTIME}, and a TrainJob "
    "can change only some of their fields (docs/backends.md)"
)

# What Trainer v2.3.0's torch plugin injects and refuses in a TrainJob's env
# (pkg/constants/constants.go TorchRunReservedEnvNames).
TORCHRUN_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


# What a TrainJob (Kubeflow Trainer v2.3) cannot express; each is refused with
# that backend rather than dropped (docs/backends.md lists them).
BACKEND_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"!has(self.elastic) || !({_TRAINJOB})",
        message="elastic needs backend: pytorchjob: Kubeflow Trainer v2 has no elastic node range "
        "(a TrainJob runs a fixed numNodes)",
        field_path=".elastic",
        check=lambda s: s.elastic is None or s.backend != TRAINJOB.name,
    ),
    Rule(
        cel=f"!has(self.runPolicy) || !has(self.runPolicy.ttlSecondsAfterFinished) || !({_TRAINJOB})",
        message="runPolicy.ttlSecondsAfterFinished needs backend: pytorchjob: a TrainJob has no TTL "
        "(delete the FSDPTraining, or its TrainJob, when done)",
        field_path=".runPolicy.ttlSecondsAfterFinished",
        check=lambda s: s.run_policy.ttl_seconds_after_finished is None or s.backend != TRAINJOB.name,
    ),
    Rule(
        cel=f"!has(self.pod) || !has(self.pod.priorityClassName) || !({_TRAINJOB})",
        message="pod.priorityClassName needs backend: pytorchjob: a TrainJob's runtimePatches cannot set it "
        "(use scheduling.priorityClass with Kueue, or a runtime of your own)",
        field_path=".pod.priorityClassName",
        check=lambda s: s.pod.priority_class_name is None or s.backend != TRAINJOB.name,
    ),
    Rule(
        cel=f"!has(self.metrics) || self.metrics.port == {METRICS_PORT} || !({_TRAINJOB})",
        message=f"metrics.port must be {METRICS_PORT} with backend: trainjob: {_TRAINJOB_WHY}",
        field_path=".metrics.port",
        check=lambda s: s.metrics.port == METRICS_PORT or s.backend != TRAINJOB.name,
    ),
    Rule(
        cel=(
            f"!has(self.pod) || !has(self.pod.volumeMounts) || !({_TRAINJOB}) || "
            "self.pod.volumeMounts.all(m, self.pod.volumeMounts.filter(n, n.name == m.name).size() == 1)"
        ),
        message="pod.volumeMounts must mount each volume once with backend: trainjob: a TrainJob's runtimePatches "
        "key mounts by volume name (mount the volume's root and use paths below it instead of subPaths)",
        field_path=".pod.volumeMounts",
        check=lambda s: (
            s.backend != TRAINJOB.name or len({m.name for m in s.pod.volume_mounts}) == len(s.pod.volume_mounts)
        ),
    ),
    Rule(
        cel=f"!has(self.env) || !({_TRAINJOB}) || !self.env.exists(e, e.name in {_cel_list(TORCHRUN_RESERVED_ENV)})",
        message=f"env must not set {', '.join(TORCHRUN_RESERVED_ENV)} with backend: trainjob: Kubeflow Trainer "
        "sets them (and refuses a TrainJob that does)",
        field_path=".env",
        check=lambda s: s.backend != TRAINJOB.name or not any(e.name in TORCHRUN_RESERVED_ENV for e in s.env),
    ),
    Rule(
        cel=f"!has(self.imagePullPolicy) || self.imagePullPolicy == 'IfNotPresent' || !({_TRAINJOB})",
        message=f"imagePullPolicy must be IfNotPresent with backend: trainjob: {_TRAINJOB_WHY}",
        field_path=".imagePullPolicy",
        check=lambda s: s.image_pull_policy == "IfNotPresent" or s.backend != TRAINJOB.name,
    ),
)


class FSDPTrainingSpec(ApiModel):
    """Desired state of an FSDP training job."""

    backend: Backend = Field(
        "pytorchjob",
        description=(
            "What runs the pods: pytorchjob (a Kubeflow PyTorchJob, training operator v1) or trainjob "
            f"(a Kubeflow Trainer v2 TrainJob on the ClusterTrainingRuntime {TRAINJOB_RUNTIME}, which the bundle "
            "ships). Same trainer, status and checkpoints either way; trainjob refuses elastic, "
            "runPolicy.ttlSecondsAfterFinished, pod.priorityClassName, a non-default metrics.port and "
            "imagePullPolicy (docs/backends.md). Immutable."
        ),
    )

    image: str = Field(
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        pattern=r"^[^\s]+$",
        description="Trainer container image, pinned by tag or digest (':latest' is rejected).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the trainer container."
    )
    model: ModelSpec | None = Field(None, description="The model to train (required unless command is set).")
    data: DataSpec = Field(default_factory=DataSpec, description="Training data and tokenizer.")
    training: TrainingSpec | None = Field(None, description="Optimisation settings (required unless command is set).")
    command: list[ScriptWord] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description=(
            "Your own training program instead of the built-in trainer: what torchrun runs on every rank, "
            "a script path (e.g. /workspace/train.py) or -m and a module, as torchrun takes it. The pods keep the "
            "same launch (c10d rendezvous), environment, /dev/shm, GPUs/EFA, volumes and placement "
            "(docs/your-own-script.md). model, training, peft, data and fsdp are then refused (immutable)."
        ),
    )
    args: list[ScriptWord] | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Arguments of command, after it on torchrun's command line (immutable).",
    )
    fsdp: FSDPSpec = Field(default_factory=FSDPSpec, description="FSDP2 sharding settings.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Nodes, GPUs, EFA and capacity.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing and resume.")
    elastic: ElasticSpec | None = Field(None, description="Elastic training bounds; unset: a fixed node count.")
    peft: PeftSpec | None = Field(
        None, description="LoRA fine-tuning: train adapters on the frozen base model; unset: train every weight."
    )
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus metrics of the trainer.")
    stall: StallSpec = Field(
        default_factory=StallSpec, description="Stall watchdog: when no new step counts as stalled, and the action."
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Who may reach the job's pods (a NetworkPolicy)."
    )
    # maxItems bounds the per-item CEL rules' cost, or the API server rejects the CRD.
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Extra environment variables of the trainer container."
    )
    service_account_name: str | None = Field(
        None, pattern=DNS_LABEL, description="ServiceAccount of the training pods (e.g. for IRSA access to S3)."
    )
    suspend: bool = Field(
        False, description="Suspend the job: its pods are deleted; unsuspending resumes from checkpoint."
    )
    pod: PodSettings = Field(
        default_factory=PodSettings,
        description=(
            "Settings of the training pods: labels, annotations, priority class, extra volumes, node selection, "
            "tolerations, affinity and the termination grace period (immutable)."
        ),
    )
    run_policy: RunPolicySpec = Field(
        default_factory=RunPolicySpec, description="Deadlines of the job: active deadline and TTL after it finishes."
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="Queueing with Kueue: the LocalQueue and the WorkloadPriorityClass (immutable).",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!self.image.endsWith(':latest')",
            message="image must be pinned to a tag or digest, not :latest",
            field_path=".image",
            check=lambda s: not s.image.endswith(":latest"),
        ),
        Rule(
            cel=f"self.image.matches('{IMAGE_PINNED_PATTERN}')",
            message="image must name a tag or a digest (e.g. ghcr.io/org/trainer:1.0): an untagged image means :latest",
            field_path=".image",
            check=lambda s: re.search(IMAGE_PINNED_PATTERN, s.image) is not None,
        ),
        Rule(
            cel="!has(self.metrics) || self.metrics.port != " + str(RDZV_PORT),
            message=f"metrics.port must differ from {RDZV_PORT}, the rendezvous port of the trainer pods",
            field_path=".metrics.port",
            check=lambda s: s.metrics.port != RDZV_PORT,
        ),
        Rule(
            cel=(
                "!has(self.fsdp) || !self.fsdp.cpuOffload || (has(self.resources) ? self.resources.gpusPerNode : 8) > 0"
            ),
            message="fsdp.cpuOffload needs GPUs: without them the parameters already live in CPU memory",
            field_path=".fsdp.cpuOffload",
            check=lambda s: not s.fsdp.cpu_offload or s.resources.gpus_per_node > 0,
        ),
        Rule(
            cel=(
                "!has(self.fsdp) || self.fsdp.shardingStrategy != 'hybrid'"
                " || (has(self.resources) && self.resources.nodes >= 2)"
            ),
            message="hybrid sharding needs at least 2 nodes",
            field_path=".fsdp.shardingStrategy",
            check=lambda s: s.fsdp.sharding_strategy != "hybrid" or s.resources.nodes >= 2,
        ),
        Rule(
            cel=(
                "!has(self.elastic) || ((has(self.resources) ? self.resources.nodes : 1) >= self.elastic.minNodes"
                " && (has(self.resources) ? self.resources.nodes : 1) <= self.elastic.maxNodes)"
            ),
            message="resources.nodes must lie between elastic.minNodes and elastic.maxNodes",
            field_path=".resources.nodes",
            check=lambda s: s.elastic is None or s.elastic.min_nodes <= s.resources.nodes <= s.elastic.max_nodes,
        ),
        SEQ_LEN_RULE,
        *COMMAND_RULES,
        *BACKEND_RULES,
        Rule(
            cel=(
                "!has(self.pod) || !has(self.pod.volumeMounts) || self.pod.volumeMounts.all(m, !["
                + ", ".join(f"'{d}'" for d in POD_MOUNTS)
                + f", {_CKPT_CEL}].exists(p, p == m.mountPath || p.startsWith(m.mountPath + '/')) && !["
                + ", ".join(f"'{d}'" for d in NO_NESTING_MOUNTS)
                + f", {_CKPT_CEL}].exists(p, m.mountPath.startsWith(p + '/')))"
            ),
            message=(
                "pod.volumeMounts: a mountPath must not be one of the pod's own mounts ("
                + ", ".join(POD_MOUNTS)
                + ", checkpoint.dir) nor a parent of one, nor lie inside "
                + ", ".join(NO_NESTING_MOUNTS)
                + " or checkpoint.dir"
            ),
            field_path=".pod.volumeMounts",
            check=lambda s: not any(_mounts_clash(m.mount_path, s.checkpoint.dir) for m in s.pod.volume_mounts),
        ),
        Rule(
            cel="!has(self.resources) || self.resources.efaPerNode == 0 || self.resources.gpusPerNode > 0",
            message="EFA needs GPU nodes: set resources.gpusPerNode",
            field_path=".resources.efaPerNode",
            check=lambda s: s.resources.efa_per_node == 0 or s.resources.gpus_per_node > 0,
        ),
    )

    def seq_len(self) -> int:
        assert self.model is not None and self.training is not None, "a job of the built-in trainer"
        return effective_seq_len(self.training, self.model)

    @property
    def runs_own_script(self) -> bool:
        """Whether the pods run the user's command instead of the built-in trainer."""
        return self.command is not None

    def procs_per_node(self) -> int:
        return max(1, self.resources.gpus_per_node)

    def world_size(self) -> int:
        return self.resources.nodes * self.procs_per_node()


# Changing these on a live job would silently invalidate its checkpoints, its
# data position or its pods' placement, so the API server refuses the update
# (a `self == oldSelf` rule on the field) and check_update() mirrors it.
IMMUTABLE_FIELDS: dict[type[ApiModel], tuple[str, tuple[str, ...]]] = {
    FSDPTrainingSpec: (
        "spec",
        ("backend", "model", "data", "fsdp", "resources", "peft", "pod", "command", "args", "scheduling"),
    ),
    TrainingSpec: ("spec.training", ("seqLen", "microBatchSize", "gradAccumSteps", "precision", "seed")),
    CheckpointSpec: ("spec.checkpoint", ("dir", "claimName")),
}


# A TrainJob's spec.trainer and activeDeadlineSeconds are immutable (Trainer
# v2.3.0, "self == oldSelf" on both): with backend trainjob the spec fields
# rendered there (metrics: the FSDP_METRICS_PORT variable) cannot change either.
# One rule on spec, as it needs the backend.
TRAINJOB_FROZEN = ("image", "env", "serviceAccountName", "runPolicy", "metrics")


def _unchanged_cel(field: str) -> str:
    return f"(has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field}))"


TRAINJOB_FROZEN_RULE = TransitionRule(
    cel=f"!has(oldSelf.backend) || oldSelf.backend != '{TRAINJOB.name}' || ("
    + " && ".join(_unchanged_cel(f) for f in TRAINJOB_FROZEN)
    + ")",
    message=(
        f"with backend: trainjob, {', '.join(TRAINJOB_FROZEN)} cannot change on an existing job (a TrainJob's "
        "trainer and deadline are immutable): delete and recreate the FSDPTraining (checkpoints on the PVC are kept)"
    ),
)


def immutable_rule(owner: type[BaseModel], field: str) -> TransitionRule | None:
    prefix, fields = IMMUTABLE_FIELDS.get(owner, ("", ()))  # type: ignore[arg-type]
    return immutable(f"{prefix}.{field}") if field in fields else None


def check_update(old: FSDPTrainingSpec, new: FSDPTrainingSpec) -> list[str]:
    """The API server's transition rules, in Python: ``path: message`` per change."""
    errors = []
    for owner, (prefix, fields) in IMMUTABLE_FIELDS.items():
        sub = prefix.removeprefix("spec").lstrip(".")
        o = getattr(old, sub) if sub else old
        n = getattr(new, sub) if sub else new
        for field in fields:
            attr = next(k for k, f in owner.model_fields.items() if (f.alias or k) == field)
            if getattr(o, attr) != getattr(n, attr):
                rule = immutable(f"{prefix}.{field}")
                errors.append(f"{prefix}.{field}: {rule.message}")
    if old.backend == TRAINJOB.name:
        by_alias = {(f.alias or k): k for k, f in FSDPTrainingSpec.model_fields.items()}
        if any(getattr(old, by_alias[f]) != getattr(new, by_alias[f]) for f in TRAINJOB_FROZEN):
            errors.append(f"spec: {TRAINJOB_FROZEN_RULE.message}")
    return errors


class ObjectMeta(BaseModel):
    """The subset of metav1.ObjectMeta the API checks; the rest passes through."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    generate_name: str | None = Field(None, alias="generateName")
    namespace: str | None = None
    uid: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        # PydanticCustomError, not ValueError: no "Value error, " prefix, so the
        # message is exactly the one the API server's root CEL rule gives.
        if not re.match(DNS_LABEL, v):
            raise PydanticCustomError("fsdp_rule", NAME_PATTERN_MESSAGE)
        if len(v) > MAX_NAME_LENGTH:
            raise PydanticCustomError("fsdp_rule", NAME_LENGTH_MESSAGE)
        return v


# JobSet names a TrainJob's pods <name>-node-0-<index>-<5 random characters>, and
# its webhook refuses a JobSet whose longest pod name exceeds 63 characters.
TRAINJOB_MAX_NAME_LENGTH = 63 - len("-node-0-") - len(str(MAX_NODES - 1)) - len("-abcde")


NAME_PATTERN_MESSAGE = (
    "name must be a DNS label (lowercase letters, digits and '-', starting with a letter) "
    "because pods and services are named after it"
)
NAME_LENGTH_MESSAGE = (
    f"name must be at most {MAX_NAME_LENGTH} characters so that <name>-worker-<index> stays a valid DNS label"
)
TRAINJOB_NAME_LENGTH_MESSAGE = (
    f"name must be at most {TRAINJOB_MAX_NAME_LENGTH} characters with backend: trainjob, so that JobSet's pod "
    "names <name>-node-0-<index>-<random> stay valid DNS labels"
)
ROOT_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": f"!has(self.metadata.name) || self.metadata.name.matches('{DNS_LABEL}')",
        "message": NAME_PATTERN_MESSAGE,
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": f"!has(self.metadata.name) || size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        "message": NAME_LENGTH_MESSAGE,
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": (
            f"!has(self.metadata.name) || !has(self.spec.backend) || self.spec.backend != '{TRAINJOB.name}' "
            f"|| size(self.metadata.name) <= {TRAINJOB_MAX_NAME_LENGTH}"
        ),
        "message": TRAINJOB_NAME_LENGTH_MESSAGE,
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
)


class FSDPTraining(BaseModel):
    """An FSDPTraining resource as read from YAML or from the API server."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Literal["training.fsdp.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["FSDPTraining"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: FSDPTrainingSpec

    @model_validator(mode="after")
    def _trainjob_name(self) -> FSDPTraining:
        name = self.metadata.name
        if name and self.spec.backend == TRAINJOB.name and len(name) > TRAINJOB_MAX_NAME_LENGTH:
            raise PydanticCustomError("fsdp_rule", TRAINJOB_NAME_LENGTH_MESSAGE, {"field_path": ".metadata.name"})
        return self

    @property
    def name(self) -> str:
        assert self.metadata.name, "metadata.name is required"
        return self.metadata.name
