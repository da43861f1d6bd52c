"""Everything before the step loop: the checks before the process group exists, then the sharded model.

``prepare`` resolves and checks the model, tokenizer and data on the meta
device (no process group, no memory), so a bad config fails on every rank with
the same lines before any rendezvous; ``build_model`` shards, materialises and
initialises it (collective), and ``build_reference`` the frozen copy a dpo
objective compares with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_api.trainer_config import TrainerConfig
from torch.distributed.device_mesh import DeviceMesh
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .config import check_config
from .data.tokenizer import check_vocabulary, load_tokenizer
from .errors import ConfigError, first_line
from .loss.router_aux import router_aux_errors
from .model.architecture import (
    build_meta_model,
    check_tied,
    decoder_units,
    materialize,
    max_positions,
    model_config,
    model_dir,
)
from .model.experts import FIELD as EXPERTS_FIELD
from .model.experts import check_experts, request_experts
from .model.init import init_weights, reset_buffers
from .model.kernels import KernelReport, apply_kernels
from .model.lora import apply_lora, init_adapters
from .model.pretrained import LoadPlan, check_pretrained, load_pretrained
from .parallel.compile import CompileReport, compile_report
from .parallel.context_parallel import context_parallel_errors
from .parallel.distributed import WorldInfo, world_from_env
from .parallel.expert_parallel import expert_parallel_errors
from .parallel.float8 import Float8Report, float8_plan
from .parallel.parallelize import parallelize
from .parallel.pipeline import Stage, StageForward, pipeline_errors, stage_model, stage_of
from .parallel.plan import ExpertMesh, ParallelPlan, build_expert_mesh, build_mesh
from .parallel.tensor_parallel import tensor_parallel_errors
from .remote_inputs import localize


@dataclass
class Prepared:
    """Everything checked before the process group exists."""

    cfg: TrainerConfig
    world: WorldInfo
    plan: ParallelPlan
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel  # on the meta device: shapes only
    seq_len: int
    pretrained: LoadPlan | None
    adapted: list[str]  # LoRA's target modules (spec.peft); empty: every weight trains
    compile: CompileReport  # training.compile's decision for this device; filled in by the first step
    kernels: KernelReport  # training.kernels: what was patched in, or why nothing was
    float8: Float8Report = field(default_factory=Float8Report)  # filled in when float8 converts the model
    mesh: DeviceMesh | None = None  # the device mesh, once built (the dpo reference is sharded on the same one)
    expert_mesh: ExpertMesh | None = None  # with parallelism.expert: the experts' view of the same ranks
    stage: Stage | None = None  # with parallelism.pipeline: the stage this rank runs


def prepare(cfg: TrainerConfig, world: WorldInfo | None = None) -> Prepared:
    """Resolve and check the model, tokenizer and data; ConfigError (exit 2) on anything wrong.

    The model is built on the meta device here (seconds, no memory), so an
    architecture transformers cannot build, a block FSDP cannot find or a
    checkpoint that does not match fails before any process group exists.
    """
    world = world or world_from_env()
    plan = ParallelPlan.of(cfg.fsdp, cfg.parallelism, world.world_size, world.local_world_size)
    cfg = localize(cfg)  # model.pretrained and data.path on S3: checked and read as their local copies
    check_config(cfg, plan, world.device.type)
    found = model_dir(cfg)
    path = found[0] if found else None
    tokenizer = load_tokenizer(cfg, path)
    tokens = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = model_config(cfg, path, tokens)
    check_vocabulary(tokenizer, config.get_text_config().vocab_size, cfg, path)
    limit = max_positions(config)
    seq_len = cfg.seq_len(limit)
    if limit is not None and seq_len > limit:
        raise ConfigError(
            [
                f"training.seqLen: {seq_len} exceeds the model's maximum sequence length {limit} "
                "(max_position_embeddings)"
            ]
        )
    request_experts(config, cfg.model.experts_implementation)
    try:
        model = build_meta_model(config)
    except (ValueError, TypeError, AttributeError) as e:
        if cfg.model.experts_implementation is not None and "experts implementation" in str(e):
            raise ConfigError([f"{EXPERTS_FIELD}: {first_line(e)}"]) from None
        raise ConfigError([f"model: transformers cannot build {type(config).__name__} as configured: {e}"]) from None
    check_experts(model, cfg.model.experts_implementation)
    if errors := router_aux_errors(model, cfg.training.router_aux_loss_coef):
        raise ConfigError(errors)
    decoder_units(model)
    if errors := (
        tensor_parallel_errors(model, plan.tp)
        + context_parallel_errors(model, plan.cp, seq_len)
        + expert_parallel_errors(model, plan.ep)
        + pipeline_errors(model, plan.pp)
    ):
        raise ConfigError(errors)
    if cfg.training.precision == "float8" and not (float8 := float8_plan(model)).converted:
        raise ConfigError(
            [
                f"training.precision: float8: no Linear layer of {type(model).__name__}'s decoder blocks can run in "
                f"float8 ({float8.summary()}); use bf16"
            ]
        )
    # Before LoRA wraps the linears: the patched gated MLPs call their projections, adapted or not.
    kernels = apply_kernels(cfg.training.kernels, model, world.device.type, plan.tp)
    adapted = apply_lora(model, cfg.peft) if cfg.peft is not None else []
    pretrained = check_pretrained(model, path) if cfg.model.pretrained and path is not None else None
    compiled = compile_report(cfg, world.device)
    prepared = Prepared(cfg, world, plan, tokenizer, model, seq_len, pretrained, adapted, compiled, kernels)
    if plan.pp > 1:
        prepared.stage = stage_of(model, plan.pp_rank(world.rank), plan.pp)
    return prepared


def build_model(p: Prepared, *, resuming: bool = False) -> PreTrainedModel:
    """The sharded, initialised model (collective: every rank calls it).

    When a checkpoint will be loaded anyway, pretrained weights are not read
    (for a large model that is minutes of I/O); the quick random init still
    runs so no parameter is ever garbage. With LoRA the checkpoint holds only
    the adapters, so the pretrained base is always read.
    """
    cfg, world, plan = p.cfg, p.world, p.plan
    # Under pipelining this rank's stage of the model (p.model stays whole: shapes, counts, FLOPs).
    model = p.model if p.stage is None else stage_model(p.model, p.stage)
    parallelize(model, cfg, plan, _mesh(p), world.device, p.compile, p.float8, p.expert_mesh)
    _initialise(model, p, pretrained=p.pretrained is not None and (not resuming or bool(p.adapted)))
    if p.adapted:
        init_adapters(model, cfg.training.seed, world.device)
    check_tied(model)
    model.train()
    if p.stage is not None:
        StageForward(model, p.stage).install()
    return model


def _mesh(p: Prepared) -> DeviceMesh | None:
    if p.mesh is None and p.plan.uses_fsdp:
        p.mesh = build_mesh(p.world, p.plan)
        p.expert_mesh = build_expert_mesh(p.world, p.plan)
    return p.mesh


def _initialise(model: PreTrainedModel, p: Prepared, *, pretrained: bool) -> None:
    materialize(model, "cpu" if p.plan.fsdp.cpu_offload else p.world.device)
    if pretrained:
        assert p.pretrained is not None
        reset_buffers(model)
        load_pretrained(model, p.pretrained, p.world.device)
    else:
        init_weights(model, p.cfg.training.seed, p.world.device)


def build_reference(p: Prepared, meta: PreTrainedModel) -> PreTrainedModel:
    """dpo without LoRA: the frozen reference, sharded like the policy (collective).

    It is the policy as it started: the pretrained weights, or the seeded
    init (the same on every world size), rebuilt at every start and never
    checkpointed. No gradients, no optimizer state, no activation
    checkpointing or compile (nothing is kept for a backward).
    """
    cfg = p.cfg.model_copy(update={"training": p.cfg.training.model_copy(update={"activation_checkpointing": "none"})})
    for param in meta.parameters():
        param.requires_grad_(False)
    parallelize(meta, cfg, p.plan, _mesh(p), p.world.device, None, expert_mesh=p.expert_mesh)
    _initialise(meta, p, pretrained=p.pretrained is not None)
    check_tied(meta)
    meta.eval()
    return meta
