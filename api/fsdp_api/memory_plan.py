"""A per-GPU memory plan of an FSDPTraining, before anything is launched.

Torch-free: the operator, ``fsdp-operator plan`` and ``validate --memory``
use it. The numbers model what the trainer does (``fsdp_trainer.parallel``,
``fsdp_trainer.optim``, ``fsdp_trainer.train``) for a Llama-shaped decoder:

- parameters: the fp32 master weights, sharded over the shard group
  (``parallel_plan.ParallelPlan.shard_size``: full/shard_grad_op: the
  data-parallel ranks; hybrid: the shard group; no_shard: none); with
  ``parallelism.tensor`` T each block's projections are split T ways first
  (norms, embedding and head stay whole on every tensor-parallel rank);
- gradients: fp32, sharded like the parameters at the optimizer step; with
  gradAccumSteps > 1 FSDP2 keeps whole (unsharded) gradients between the
  micro-batches, since the reduce-scatter only runs on the last one;
- optimizer: AdamW's two fp32 states per parameter, sharded;
- with LoRA (``spec.peft``) gradients and optimizer state exist only for
  the adapters (r x (in + out) per adapted projection), while the frozen
  base still takes its fp32 weights, its activations and its gathers;
- activations: the tensors autograd saves per decoder layer, by seqLen,
  microBatchSize and activationCheckpointing; the attention and MLP ones
  divided by the tensor-parallel degree (each rank computes its heads and
  its slice of the MLP), the norms' and the residual stream's not; with
  ``parallelism.context`` C a rank's own tokens (1/C of each row) plus the
  whole rows' keys and values its attention gathers and its boolean mask;
- logits: the output head's logits, their fp32 copy and log-softmax, or
  with ``training.logits: chunked`` one chunk of them and the gradients
  the chunked loss keeps for backward;
- communication: the unsharded parameters FSDP all-gathers (the root
  module's embedding and head stay gathered for the whole step, one or more
  decoder layers at a time besides, every layer with shard_grad_op); with
  ``training.precision: float8`` (``fsdp_trainer.parallel.float8``, torchao)
  the tensorwise recipe gathers the decoder blocks' projections as 1-byte
  float8; rowwise gathers them in bf16 like bf16 (activations stay bf16's:
  torchao saves the matmul's bf16 input; ``gathered_layer_bytes`` says what
  float8 leaves out);
- overhead: the CUDA context, NCCL and the caching allocator's slack;
- with ``training.objective: dpo`` and no LoRA, the frozen reference model's
  fp32 weights, sharded like the policy's (its no-grad forward runs first and
  frees what it gathered); with LoRA the reference is the base itself.

The peak is the larger of two moments: the start of backward (activations,
logits and gathered parameters all alive) and the optimizer step (whole
sharded gradients plus the optimizer's temporaries, activations freed).
docs/memory-plan.md has the formulas and how they were checked against
measured peaks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .instance_types import GIB, INSTANCE_TYPES, InstanceType
from .loss_chunks import loss_chunk_tokens
from .memory_suggest import suggest
from .model_files import local_model_dir
from .parallel_plan import ParallelPlan
from .precision import Float8Recipe, compute_dtype, float8_fits, gathers_in_float8
from .presets import HUB_MODEL_DIMS, HUB_MODEL_PRESETS, PRESETS, ModelDims
from .spec import FSDPTrainingSpec, ModelOverrides, PeftSpec, effective_seq_len

Device = Literal["cuda", "cpu"]

FP32 = 4
BF16 = 2
FP8 = 1
# The CUDA context, cuBLAS workspaces and NCCL's buffers live outside the
# tensors counted below, about 1 GiB per process on recent drivers.
CUDA_CONTEXT_BYTES = 1 * GIB
# The caching allocator rounds blocks up and cannot always reuse freed ones.
FRAGMENTATION = 0.10

# config.json keys of a decoder-only Hugging Face model (transformers' spellings).
_CONFIG_KEYS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions"),
}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


# --- model dimensions ----------------------------------------------------------


# Mixture-of-experts layouts the plan does not model yet: shared experts beside the routed ones, dense
# layers among the MoE ones, latent attention (DeepSeek's MLA).
_MOE_NOT_MODELLED = {
    "n_shared_experts": "shared experts",
    "shared_expert_intermediate_size": "shared experts",
    "first_k_dense_replace": "dense layers among the expert layers",
    "mlp_only_layers": "dense layers among the expert layers",
    "kv_lora_rank": "latent attention",
}


def _moe_dims(config: dict[str, Any]) -> tuple[dict[str, int], str | None]:
    """(num_experts, experts_per_token, the experts' width) of an MoE config.json; or why it is not modelled."""
    experts = next(config[k] for k in _MOE_KEYS if config.get(k))
    for key, what in _MOE_NOT_MODELLED.items():
        if config.get(key):
            return {}, f"mixture-of-experts models with {what} are not modelled ({key} in config.json)"
    if isinstance(config.get("decoder_sparse_step"), int) and config["decoder_sparse_step"] > 1:
        return {}, "mixture-of-experts models with dense layers among the expert layers are not modelled"
    per_token = config.get("num_experts_per_tok")
    if not isinstance(per_token, int) or per_token < 1:
        return {}, "config.json has no num_experts_per_tok"
    width = config.get("moe_intermediate_size") or config.get("intermediate_size")
    return {"num_experts": int(experts), "experts_per_token": per_token, "intermediate_size": int(width or 0)}, None


def dims_from_config(config: dict[str, Any]) -> tuple[ModelDims | None, str | None]:
    """The numbers of a config.json, or (None, why) when the plan does not model its layers."""
    moe: dict[str, int] = {}
    if any(config.get(k) for k in _MOE_KEYS):
        moe, why = _moe_dims(config)
        if why is not None:
            return None, why
    # ints; Any, since a type checker matches **values against every ModelDims field, the bool ones too.
    values: dict[str, Any] = {}
    for field, keys in _CONFIG_KEYS.items():
        value = next((config[k] for k in keys if isinstance(config.get(k), int)), None)
        if value is None:
            return None, f"config.json has no {keys[0]}"
        values[field] = value
    values.update(moe)
    if isinstance(config.get("head_dim"), int) and config["head_dim"] > 0:
        values["explicit_head_dim"] = config["head_dim"]
    if not values["intermediate_size"]:
        return None, "config.json has no intermediate_size"
    kv = config.get("num_key_value_heads")
    dims = ModelDims(
        num_key_value_heads=kv if isinstance(kv, int) and kv > 0 else values["num_heads"],
        # transformers' own default differs by architecture; untied counts the
        # head separately, which errs on the side of more memory.
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        **values,
    )
    return dims, None


def model_dims(spec: FSDPTrainingSpec) -> tuple[ModelDims | None, str | None]:
    """The model's numbers (preset plus overrides, or a local config.json); (None, why) if unknown.

    Nothing is downloaded: a hub id or a path only the pod can see is unknown here.
    """
    if spec.model is None:
        return None, "the model is your script's (spec.command): its memory cannot be estimated"
    dims = spec.model.dims()
    if dims is not None:
        return dims, None
    known = HUB_MODEL_PRESETS.get(spec.model.pretrained or "")
    if known is not None:
        return _with_overrides(PRESETS[known], spec.model.config), None
    if (listed := HUB_MODEL_DIMS.get(spec.model.pretrained or "")) is not None:
        return _with_overrides(listed, spec.model.config), None
    found = local_model_dir(spec)
    if found is None:
        ref = spec.model.pretrained or spec.model.architecture
        return None, f"the model's dimensions are unknown: {ref} is not a local directory (nothing is downloaded)"
    field, path = found
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        return None, f"the model's dimensions are unknown: {field}: cannot read config.json ({e})"
    dims, why = dims_from_config(config if isinstance(config, dict) else {})
    if dims is None:
        return None, f"the model's dimensions are unknown: {field}: {why}"
    return _with_overrides(dims, spec.model.config), None


def _with_overrides(dims: ModelDims, overrides: ModelOverrides | None) -> ModelDims:
    return dims if overrides is None else dims.with_overrides(**overrides.model_dump())


# --- the workload: everything the formulas read -------------------------------------


@dataclass(frozen=True)
class Workload:
    dims: ModelDims
    seq_len: int
    micro_batch: int
    grad_accum: int
    precision: str
    checkpointing: str
    reshard_after_forward: bool  # False: every layer stays gathered from forward to backward
    world_size: int
    shard_size: int  # ranks one parameter is split over (1: replicated)
    uses_fsdp: bool
    cpu_offload: bool
    prefetch: int
    device: Device
    adapter_params: int = 0  # LoRA's trainable parameters; 0: every weight trains
    logits: str = "full"  # training.logits: chunked or full
    reference_params: int = 0  # objective dpo without LoRA: the frozen reference copy's parameters
    tp: int = 1  # parallelism.tensor: each block's projections split over this many ranks
    cp: int = 1  # parallelism.context: each row split over this many ranks
    ep: int = 1  # parallelism.expert: each MoE layer's experts split over this many ranks
    pp: int = 1  # parallelism.pipeline: the layers split into this many stages
    pipeline_schedule: str = "1F1B"  # parallelism.pipelineSchedule
    packed: bool = False  # whole rows packed into sequences (DataSpec.packs_rows): attention needs a mask
    float8_recipe: Float8Recipe | None = None  # training.precision float8: tensorwise or rowwise; None otherwise

    @property
    def tokens(self) -> int:
        """Tokens one rank computes per micro-batch (its part of each row with context parallelism)."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def stage_layers(self) -> int:
        """Decoder layers of the largest pipeline stage (every layer without pipelining)."""
        return math.ceil(self.dims.num_layers / self.pp)

    @property
    def first_stage_in_flight(self) -> int:
        """Micro-batches whose activations the first stage holds at once: 1F1B's warm-up runs ``pp`` forwards
        before the first backward, GPipe every forward of the step."""
        if self.pp == 1:
            return 1
        return self.grad_accum if self.pipeline_schedule == "GPipe" else min(self.pp, self.grad_accum)

    @property
    def last_stage_in_flight(self) -> int:
        """The same on the last stage, which holds the logits too: 1F1B runs each backward right after its forward."""
        return self.grad_accum if self.pp > 1 and self.pipeline_schedule == "GPipe" else 1

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the compute dtype (FSDP's param_dtype, or autocast's)."""
        return BF16 if compute_dtype(self.precision) == "bf16" else FP32

    @property
    def rank_params(self) -> int:
        """The parameters of one tensor-parallel rank's slice of the model (all of them without TP)."""
        d = self.dims
        split = split_layer_params(d)
        return stage_root_params(self) + self.stage_layers * (layer_params(d) - split + math.ceil(split / self.tp))

    @property
    def trainable_params(self) -> int:
        """Parameters with gradients and optimizer state (this tensor-parallel rank's slice)."""
        return self.adapter_params or self.rank_params


def workload(spec: FSDPTrainingSpec, dims: ModelDims) -> Workload:
    plan = ParallelPlan.for_spec(spec)
    training = spec.builtin_training
    return Workload(
        dims=dims,
        seq_len=effective_seq_len(training, spec.builtin_model, dims.max_seq_len),
        micro_batch=training.micro_batch_size,
        grad_accum=training.grad_accum_steps,
        precision=training.precision,
        checkpointing=training.activation_checkpointing,
        reshard_after_forward=plan.reshard_after_forward,
        world_size=plan.world_size,
        shard_size=plan.shard_size,
        uses_fsdp=plan.uses_fsdp,
        cpu_offload=spec.fsdp.cpu_offload,
        prefetch=spec.fsdp.prefetch,
        device="cuda" if spec.resources.gpus_per_node > 0 else "cpu",
        adapter_params=lora_params(dims, spec.peft) if spec.peft is not None else 0,
        logits=training.logits,
        # dpo with LoRA uses the base with the adapters off as its reference: no copy.
        reference_params=dims.num_params() if training.needs_reference and spec.peft is None else 0,
        tp=plan.tp,
        cp=plan.cp,
        ep=plan.ep,
        pp=plan.pp,
        pipeline_schedule=spec.parallelism.pipeline_schedule,
        packed=spec.data.packs_rows,
        float8_recipe=training.effective_float8_recipe() if training.precision == "float8" else None,
    )


def lora_params(d: ModelDims, peft: PeftSpec) -> int:
    """LoRA's parameters on a Llama-shaped decoder: r x (in + out) per adapted projection.

    Unset targets adapt every projection (the trainer's default); listed ones
    count where their last name matches a Llama projection (an estimate: the
    trainer finds the real modules).
    """
    shapes = projection_shapes(d)
    names = set(shapes) if peft.target_modules is None else {t.rsplit(".", 1)[-1] for t in peft.target_modules}
    per_layer = sum(a + b for name, (a, b) in shapes.items() if name in names)
    return d.num_layers * peft.rank * per_layer


def projection_shapes(d: ModelDims) -> dict[str, tuple[int, int]]:
    """A Llama decoder layer's Linear projections: (in_features, out_features) by name.

    An MoE layer's experts are 3-D parameters, not Linear layers (LoRA and
    float8 leave them as they are), and its router is neither adapted nor
    converted: only the attention projections are listed.
    """
    h, i, kv, q = d.hidden_size, d.intermediate_size, d.num_key_value_heads * d.head_dim, d.attention_width
    attention = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if d.is_moe:
        return attention
    return {**attention, "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


# --- the formulas --------------------------------------------------------------------


def layer_params(d: ModelDims) -> int:
    kv = d.num_key_value_heads * d.head_dim
    return 2 * d.hidden_size * d.attention_width + 2 * d.hidden_size * kv + d.mlp_params() + 2 * d.hidden_size


def split_layer_params(d: ModelDims) -> int:
    """A layer's projections: what tensor parallelism splits (all but its two norms)."""
    return layer_params(d) - 2 * d.hidden_size


def expert_params(d: ModelDims) -> int:
    """One MoE layer's routed experts (gate, up and down of each); 0 for a dense layer."""
    return d.num_experts * 3 * d.hidden_size * d.intermediate_size if d.is_moe else 0


def experts_elsewhere(w: Workload) -> int:
    """Of one layer's expert parameters, those on the other expert-parallel ranks (this rank gathers 1/ep)."""
    experts = expert_params(w.dims)
    return experts - experts // w.ep


def rank_layer_params(w: Workload) -> int:
    """One layer's parameters as one rank computes with them: its tensor-parallel slice, its experts."""
    split = split_layer_params(w.dims)
    return layer_params(w.dims) - split + math.ceil(split / w.tp) - experts_elsewhere(w)


def all_to_all_bytes(w: Workload) -> int:
    """Expert parallelism's token exchange in one layer: every routed token's hidden state sent and received."""
    if w.ep == 1 or not w.dims.is_moe:
        return 0
    return 2 * w.tokens * w.dims.experts_per_token * w.dims.hidden_size * w.compute_bytes


def float8_shapes(d: ModelDims) -> list[tuple[int, int]]:
    """The projections of a layer the trainer converts to float8: both dimensions divisible by 16.

    Norms, embedding and head are never converted, so only a layer's projections can be.
    """
    return [(a, b) for a, b in projection_shapes(d).values() if float8_fits(a, b)]


def rank_float8_params(w: Workload) -> int:
    """One layer's float8 projection parameters on one tensor-parallel rank (0 unless precision float8)."""
    if w.float8_recipe is None:
        return 0
    return math.ceil(sum(a * b for a, b in float8_shapes(w.dims)) / w.tp)


def root_params(d: ModelDims) -> int:
    """Embedding, final norm and (untied) head: the root FSDP unit."""
    return d.num_params() - d.num_layers * layer_params(d)


def stage_root_params(w: Workload) -> int:
    """What a stage holds besides its layers: all of the root without pipelining; else the larger end's,
    the first stage's embedding or the last's final norm and (untied: pipelining refuses tied) head."""
    root = root_params(w.dims)
    if w.pp == 1:
        return root
    embedding = w.dims.vocab_size * w.dims.hidden_size
    return max(embedding, root - embedding)


def sharded(numel: int, w: Workload) -> int:
    return math.ceil(numel / w.shard_size)


def layer_activation_bytes(w: Workload) -> int:
    """Bytes autograd saves for one decoder layer (SDPA attention, SwiGLU MLP).

    ``precision: float8`` changes none of this in eager mode: torchao's
    float8 matmul saves its bf16 input for backward, not the input's float8
    cast (which it makes again in backward), and its weight as gathered,
    which the communication term holds.

    Per token: each RMSNorm keeps its fp32 input and its normalised output
    (bf16: an fp32 upcast of the input plus the bf16 output); attention keeps
    q, k, v after RoPE, its output and that output made contiguous for o_proj,
    plus an fp32 log-sum-exp per head; the MLP keeps gate, silu(gate), up and
    their product (4 x intermediate). With context parallelism a rank keeps
    these for its own tokens, plus the whole rows' keys and values that
    attention gathered (the other ranks' part of them).
    """
    d, c = w.dims, w.compute_bytes
    kv = d.num_key_value_heads * d.head_dim
    norms = 2 * d.hidden_size * (FP32 + c)
    attention = (3 * d.attention_width + 2 * kv) * c + d.num_heads * FP32
    mlp = moe_mlp_activation_bytes(d, c) if d.is_moe else 4 * d.intermediate_size * c
    gathered = (w.micro_batch * w.seq_len - w.tokens) * 2 * kv * c // w.tp
    return w.tokens * (norms + (attention + mlp) // w.tp) + gathered


def moe_mlp_activation_bytes(d: ModelDims, c: int) -> int:
    """Per token, what an MoE MLP saves: the router's fp32 probabilities, and for each of its experts the
    hidden state routed to it, the expert's gate, silu(gate), up and product (SwiGLU), and its output."""
    return d.num_experts * FP32 + d.experts_per_token * (2 * d.hidden_size + 4 * d.intermediate_size) * c


def op_kept_layer_bytes(w: Workload) -> int:
    """What ``activationCheckpointing: op`` keeps of one layer: its matmuls', attention's and collectives' outputs.

    Per token: the q, k, v, gate and up projections and the attention output
    (split by tensor parallelism) with attention's fp32 log-sum-exp per head;
    o_proj's and down_proj's outputs whole (under tensor parallelism each rank's
    partial sum, and the all-reduced sum beside it). Norms, RoPE, SiLU and the
    residual adds are recomputed.
    """
    d, c = w.dims, w.compute_bytes
    kv = d.num_key_value_heads * d.head_dim
    split = (2 * d.attention_width + 2 * kv) * c + d.num_heads * FP32
    whole = d.hidden_size * c
    if d.is_moe:
        # The router's logits, and per routed token its expert's gate/up and down outputs (grouped GEMMs).
        moe = d.num_experts * c + d.experts_per_token * (2 * d.intermediate_size + d.hidden_size) * c
        return w.tokens * (split + whole + moe)
    split += 2 * d.intermediate_size * c
    whole += d.hidden_size * c
    return w.tokens * (split // w.tp + whole * (2 if w.tp > 1 else 1))


def context_mask_bytes(w: Workload) -> int:
    """Context parallelism's mask of packed rows: additive, in the compute dtype, per local query and key.

    On GPUs a plain token stream needs none (each chunk attends causally up to its end).
    """
    if w.cp == 1 or (not w.packed and w.device == "cuda"):
        return 0
    return w.micro_batch * (w.seq_len // w.cp) * w.seq_len * w.compute_bytes


def activation_bytes(w: Workload) -> int:
    """Saved activations of all layers at the start of backward.

    A checkpointed layer keeps only its input; its activations come back one
    layer at a time during backward. selective wraps layers 0, 2, 4, ...; op
    wraps every layer and keeps its expensive outputs too (``op_kept_layer_bytes``).
    """
    d, layers = w.dims, w.stage_layers
    per_layer = layer_activation_bytes(w)
    checkpointed = {"none": 0, "op": layers, "selective": (layers + 1) // 2, "full": layers}[w.checkpointing]
    kept = (layers - checkpointed) * per_layer
    if w.checkpointing == "op":
        kept = layers * op_kept_layer_bytes(w)
    inputs = checkpointed * w.tokens * d.hidden_size * w.compute_bytes
    recompute = per_layer if checkpointed else 0
    # The final norm's input and output, as in a layer.
    final_norm = w.tokens * d.hidden_size * (FP32 + w.compute_bytes)
    return kept + inputs + recompute + final_norm + context_mask_bytes(w)


def logits_bytes(w: Workload) -> int:
    """The loss's share at the start of backward.

    Chunked (``fsdp_trainer.loss.chunked``): forward leaves the gradient of
    the hidden states (compute dtype) and an fp32 sum of the head's weight
    gradient, which is the head's gradient ``estimate`` counts anyway;
    while it runs, one chunk holds 12 bytes per token and vocabulary entry:
    in fp32 the logits, their log-softmax (the gradient, in place) and the
    gradient's copy; in bf16 the matmul's output and that copy take 2 bytes
    each. Full: 12 bytes per token and vocabulary entry of the whole
    micro-batch, below.
    """
    if w.logits == "chunked":
        d = w.dims
        chunk = min(loss_chunk_tokens(d.vocab_size), w.tokens) * d.vocab_size
        return w.tokens * d.hidden_size * w.compute_bytes + chunk * 3 * FP32
    return _full_logits_bytes(w)


def _full_logits_bytes(w: Workload) -> int:
    """The plain loss at the start of backward: 12 bytes per token and vocabulary entry.

    Forward keeps log-softmax's fp32 output (the logits and their fp32 copy
    are freed once the loss exists); its backward then holds that output,
    the incoming gradient and the gradient it computes, all fp32, next to
    every layer's activations. Forward's own peak (logits, fp32 copy,
    log-softmax: at most 10 bytes) is below that.
    """
    return w.tokens * w.dims.vocab_size * 3 * FP32


def _logits_note(w: Workload) -> str:
    if w.logits == "chunked":
        return f"vocab {w.dims.vocab_size}: chunks of {loss_chunk_tokens(w.dims.vocab_size)} tokens + head gradients"
    return f"vocab {w.dims.vocab_size}: log-softmax and its gradients (fp32)"


def communication_bytes(w: Workload) -> int:
    """Parameters gathered for compute at the start of backward.

    The root (embedding, head) is never resharded after forward; a decoder
    layer is gathered into a flat buffer and copied out, so two copies of the
    largest layer exist while it is gathered, plus ``prefetch`` more layers.
    shard_grad_op keeps every layer gathered from forward until backward.
    Without FSDP, bf16 autocast caches a bf16 copy of every weight instead
    (float8 is planned as bf16 there). Each layer's size is
    ``gathered_layer_bytes``.
    """
    d, c = w.dims, w.compute_bytes
    if not w.uses_fsdp:
        return d.num_params() * c if compute_dtype(w.precision) == "bf16" else 0
    layer = gathered_layer_bytes(w)
    gathered_layers = (1 + w.prefetch) * layer if w.reshard_after_forward else w.stage_layers * layer
    return stage_root_params(w) * c + gathered_layers + layer + all_to_all_bytes(w)


def float8_all_gather(w: Workload) -> bool:
    """Whether FSDP gathers the float8 projections as float8 (the trainer's rule); each converted
    weight then sends its 1-byte float8 data and one fp32 scale."""
    return w.float8_recipe is not None and gathers_in_float8(w.float8_recipe, w.uses_fsdp)


def gathered_layer_bytes(w: Workload) -> int:
    """One decoder layer as FSDP gathers it on this rank: its flat buffer, and again its copied-out parameters.

    Compute dtype throughout, except with the float8 all-gather: the
    converted projections take 1 byte per element in both (FSDP packs
    inputs of mixed dtypes into a byte buffer and copies each out in its
    own dtype); the norms stay in the compute dtype. The seven fp32 scales
    of a layer are left out.

    Not counted for either float8 recipe: the float8 copies torchao casts
    inside each matmul (rowwise: of the bf16 weight; both: of the input).
    Each lives only while its matmul runs, and backward casts again only
    inside a matmul's own backward, after the loss's larger buffers are
    freed: none is alive at the start of backward, where this plan's
    forward/backward peak is.
    """
    layer = rank_layer_params(w)
    if not float8_all_gather(w):
        return layer * w.compute_bytes
    f8 = rank_float8_params(w)
    return (layer - f8) * w.compute_bytes + f8 * FP8


def gradient_bytes(w: Workload) -> int:
    """fp32 gradients at their largest.

    Sharded at the optimizer step; with gradient accumulation FSDP2 keeps the
    whole gradient (in the fp32 reduce dtype) between micro-batches.
    """
    whole = w.trainable_params * FP32
    if w.uses_fsdp and w.grad_accum > 1:
        # Unsharded, but each rank's experts only (with parallelism.expert).
        return whole - (0 if w.adapter_params else w.dims.num_layers * experts_elsewhere(w) * FP32)
    return sharded(w.trainable_params, w) * FP32


def optimizer_bytes(w: Workload) -> int:
    return 2 * sharded(w.trainable_params, w) * FP32


def optimizer_temp_bytes(w: Workload) -> int:
    """The foreach AdamW (off CUDA) computes sqrt(exp_avg_sq) into a new tensor list; fused CUDA AdamW does not."""
    return 0 if w.device == "cuda" and not w.cpu_offload else sharded(w.trainable_params, w) * FP32


# --- the plan --------------------------------------------------------------------------


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    note: str


@dataclass(frozen=True)
class Estimate:
    """Per-device bytes of one workload; ``host`` is what cpuOffload keeps in CPU memory instead."""

    components: tuple[Component, ...]
    backward_peak: int
    step_peak: int
    overhead: int
    host: int

    @property
    def tensor_bytes(self) -> int:
        return max(self.backward_peak, self.step_peak)

    @property
    def total_bytes(self) -> int:
        return self.tensor_bytes + self.overhead

    @property
    def peak_phase(self) -> str:
        return "forward/backward" if self.backward_peak >= self.step_peak else "optimizer step"


def estimate(w: Workload) -> Estimate:
    n = w.rank_params + w.adapter_params
    params = sharded(n, w) * FP32
    grads, optim = gradient_bytes(w), optimizer_bytes(w)
    temp = optimizer_temp_bytes(w)
    acts, logits, comm = activation_bytes(w), logits_bytes(w), communication_bytes(w)
    if w.pp > 1:
        # The larger of the pipeline's ends: the first stage's micro-batches in flight, or the last's with logits.
        first, last = acts * w.first_stage_in_flight, (acts + logits) * w.last_stage_in_flight
        acts, logits = (first, 0) if first >= last else (acts * w.last_stage_in_flight, logits * w.last_stage_in_flight)
    # Before the last micro-batch's reduce-scatter the only gradient alive is
    # the one being accumulated (whole), or the head's, computed first.
    head = w.dims.vocab_size * w.dims.hidden_size * FP32 if not w.adapter_params else 0  # LoRA: a frozen head
    grads_in_backward = grads if w.uses_fsdp and w.grad_accum > 1 else head
    # The frozen reference: fp32 weights sharded like the policy's; its no-grad forward runs before the
    # policy's and frees its gathers and logits, so only the weights stay alive.
    reference = sharded(w.reference_params, w) * FP32
    offloaded = params + grads + optim + reference if w.cpu_offload else 0
    on_device = (params + reference, grads, optim) if not w.cpu_offload else (0, 0, 0)
    d_params, d_grads, d_optim = on_device
    if w.cpu_offload:
        temp, grads_in_backward = 0, layer_params(w.dims) * w.compute_bytes
    backward = d_params + d_optim + acts + logits + comm + grads_in_backward
    step = d_params + d_optim + d_grads + temp
    peak = max(backward, step)
    overhead = math.ceil(peak * FRAGMENTATION) + CUDA_CONTEXT_BYTES if w.device == "cuda" else 0
    where = "host" if w.cpu_offload else f"1/{w.shard_size} of each" if w.shard_size > 1 else "whole"
    components = (
        Component(
            "parameters",
            d_params,
            f"fp32 master weights, {where}"
            + ("; + the frozen dpo reference, sharded alike" if reference else "")
            + (_experts_note(w) if w.dims.is_moe else ""),
        ),
        Component(
            "gradients",
            d_grads,
            ("LoRA adapters only; " if w.adapter_params else "")
            + ("fp32; whole while accumulating" if w.grad_accum > 1 else "fp32, like the weights"),
        ),
        Component(
            "optimizer state",
            d_optim + temp,
            "AdamW exp_avg + exp_avg_sq (fp32)"
            + (f" of {w.adapter_params:,} adapter parameters" if w.adapter_params else "")
            + (", + foreach temp" if temp else ""),
        ),
        Component(
            "activations",
            acts,
            f"{w.micro_batch}x{w.seq_len} tokens"
            + (f" (1/{w.cp} of each row here)" if w.cp > 1 else "")
            + (_pipeline_note(w, logits == 0) if w.pp > 1 else "")
            + f", checkpointing {w.checkpointing}",
        ),
        Component("logits", logits, _logits_note(w)),
        Component("communication", comm, _comm_note(w)),
        Component("overhead", overhead, "CUDA context + allocator slack" if overhead else "none counted off GPU"),
    )
    return Estimate(components, backward, step, overhead, offloaded)


def _pipeline_note(w: Workload, first: bool) -> str:
    where = "first" if first else "last"
    n = w.first_stage_in_flight if first else w.last_stage_in_flight
    return f" x {n} in flight on the {where} of {w.pp} stages ({w.stage_layers} layers, {w.pipeline_schedule})"


def _experts_note(w: Workload) -> str:
    d = w.dims
    split = f", each layer's split over {w.ep} ranks" if w.ep > 1 else ""
    return (
        f"; {d.num_experts} experts{split}, {d.experts_per_token} per token: {d.num_params() / 1e9:.2f}B "
        f"parameters, {d.num_active_params() / 1e9:.2f}B active"
    )


def _comm_note(w: Workload) -> str:
    if not w.uses_fsdp:
        return "bf16 autocast weight copies" if compute_dtype(w.precision) == "bf16" else "none (one process, no FSDP)"
    gathered = f"{1 + w.prefetch} layer(s)" if w.reshard_after_forward else "all layers"
    note = f"gathered root + {gathered} + all-gather buffer"
    if all_to_all_bytes(w):
        note += f" (1/{w.ep} of the experts) + the experts' all-to-all"
    if float8_all_gather(w):
        return note + "; decoder projections gathered in float8 (tensorwise)"
    return note


@dataclass(frozen=True)
class MemoryPlan:
    """What ``plan_memory`` found: the estimate, the GPU it must fit, and what to change if it does not."""

    world_size: int
    estimate: Estimate | None
    unknown: str | None  # why there is no estimate (dims unknown)
    gpu: InstanceType | None  # the smallest GPU among resources.instanceTypes
    gpu_note: str  # why there is no GPU to fit against, or the types not in the table
    suggestion: str | None

    @property
    def total_bytes(self) -> int | None:
        return None if self.estimate is None else self.estimate.total_bytes

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu is None else self.gpu.gpu_memory_bytes

    @property
    def fits(self) -> bool | None:
        if self.total_bytes is None or self.gpu_memory_bytes is None:
            return None
        return self.total_bytes <= self.gpu_memory_bytes

    def summary(self) -> str:
        """One line: the estimate against the GPU, and the suggestion if it does not fit."""
        if self.estimate is None:
            return f"no memory estimate: {self.unknown}"
        total = f"{gib(self.estimate.total_bytes)} GiB per GPU"
        if self.gpu is None:
            return f"needs about {total} ({self.gpu_note})"
        against = f"{gib(self.gpu.gpu_memory_bytes)} GiB of {self.gpu.name} ({self.gpu.gpu_model})"
        if self.fits:
            return f"fits: about {total} of {against}"
        hint = f"; {self.suggestion}" if self.suggestion else ""
        return f"does not fit: about {total} needed, {against}{hint}"

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "worldSize": self.world_size,
            "components": []
            if est is None
            else [{"name": c.name, "bytes": c.bytes, "note": c.note} for c in est.components],
            "peakPhase": None if est is None else est.peak_phase,
            "tensorBytes": None if est is None else est.tensor_bytes,
            "totalBytes": self.total_bytes,
            "hostBytes": None if est is None else est.host,
            "instanceType": None if self.gpu is None else self.gpu.name,
            "gpuMemoryBytes": self.gpu_memory_bytes,
            "fits": self.fits,
            "suggestion": self.suggestion,
            "unknown": self.unknown,
            "note": self.gpu_note or None,
            "summary": self.summary(),
        }


def gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def smallest_gpu(spec: FSDPTrainingSpec) -> tuple[InstanceType | None, str]:
    """The instance type with the least memory per GPU, and a note on what could not be used."""
    if spec.resources.gpus_per_node == 0:
        return None, "CPU job (gpusPerNode 0): no GPU to fit against"
    names = spec.resources.instance_types
    if not names:
        return None, "no instance types given"
    known = [INSTANCE_TYPES[n] for n in names if n in INSTANCE_TYPES]
    unknown = [n for n in names if n not in INSTANCE_TYPES]
    note = f"not in the instance table: {', '.join(unknown)}" if unknown else ""
    if not known:
        return None, note
    return min(known, key=lambda t: t.gpu_memory_gib), note


def plan_memory(spec: FSDPTrainingSpec, dims: ModelDims | None = None) -> MemoryPlan:
    """The per-GPU memory plan of ``spec`` (``dims``: the model's numbers when already known)."""
    why = None
    if dims is None:
        dims, why = model_dims(spec)
    gpu, note = smallest_gpu(spec)
    if dims is None:
        return MemoryPlan(spec.world_size(), None, why, gpu, note, None)
    est = estimate(workload(spec, dims))
    fits = gpu is None or est.total_bytes <= gpu.gpu_memory_bytes
    capacity = gpu.gpu_memory_bytes if gpu is not None else 0
    suggestion = None if fits else suggest(spec, lambda s: estimate(workload(s, dims)).total_bytes <= capacity)
    return MemoryPlan(spec.world_size(), est, None, gpu, note, suggestion)
