"""Rules across the spec's sections: what one section's value allows in another.

Each rule sits on ``FSDPTrainingSpec`` (the CEL sees the whole spec); the
rules of one backend are in ``backend_rules``, those of spec.command (your own
script replaces the built-in trainer) and the sequence length are here.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from ..contract import ENV_WANDB_API_KEY, POD_MOUNTS, RDZV_PORT
from ..instance_types import FLOAT8_INSTANCE_TYPES, INSTANCE_TYPES
from ..rules import Rule, cel_literal, wire_name
from .backend_rules import BACKEND_RULES
from .checkpoint import CheckpointSpec
from .data import DataSpec
from .expert_rules import EXPERT_CONFIG_RULES, EXPERT_SPEC_RULES
from .fsdp import FSDPSpec
from .kernel_rules import CONTEXT_CONFIG_RULES, KERNEL_SPEC_RULES
from .model import ModelSpec, preset_cel
from .parallelism import ParallelismSpec
from .pipeline_rules import PIPELINE_CONFIG_RULES
from .stall import StallSpec
from .tracking import TrackingSpec
from .training import PREFERENCE_OBJECTIVES, TrainingSpec
from .values import IMAGE_PINNED_PATTERN
from .volumes import NO_NESTING_MOUNTS, mounts_clash

_NOT_FLOAT8 = "!has(self.training) || !has(self.training.precision) || self.training.precision != 'float8'"
_FLOAT8_CEL = "[" + ", ".join(f"'{t}'" for t in FLOAT8_INSTANCE_TYPES) + "]"
# The types whose GPU is known and has no float8 tensor cores; any other type not listed as
# float8 is one whose GPU the table does not know (g6e, p6-b200...), which may well have them.
_NO_FLOAT8_TYPES = tuple(
    name for name, t in INSTANCE_TYPES.items() if name not in FLOAT8_INSTANCE_TYPES and t.gpu_model.startswith("NVIDIA")
)
_NO_FLOAT8_CEL = "[" + ", ".join(f"'{t}'" for t in _NO_FLOAT8_TYPES) + "]"

_FLOAT8_PREFIX = "training.precision float8 needs GPUs with float8 tensor cores"
_FLOAT8_CHOICES = f"list resources.instanceTypes, each one of {', '.join(FLOAT8_INSTANCE_TYPES)} (H100, H200)"
_FLOAT8_TYPES_MESSAGE = f"{_FLOAT8_PREFIX}: {_FLOAT8_CHOICES}; A100 (p4d) and A10G (g5) have none"


def _float8_types(resources: Any) -> bool:
    types = resources.instance_types
    return bool(types) and all(t in FLOAT8_INSTANCE_TYPES for t in types)


def _float8_types_detail(types: list[str] | None) -> str:
    """The message naming the first listed type without float8 tensor cores, as the CEL messageExpression does.

    One, not all: the API server's cost estimate refuses a join over the list.
    """
    others = [t for t in types or () if t not in FLOAT8_INSTANCE_TYPES]
    if not others:
        return _FLOAT8_TYPES_MESSAGE
    why = _HAS_NONE if others[0] in _NO_FLOAT8_TYPES else _UNKNOWN
    return f"{_FLOAT8_PREFIX} and {others[0]}{why}: {_FLOAT8_CHOICES}"


_HAS_NONE = " has none"
# Not "has none": an L4 or L40S (compute capability 8.9) or a B200 has them; the operator lists
# only the types whose GPU it checked against AWS's pages (fsdp_api.instance_types).
_UNKNOWN = " is not a type whose GPU the operator knows (it lists only the ones checked against AWS documentation)"


# --- sequence length ----------------------------------------------------------

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
        " || self.training.seqLen <= " + preset_cel("maxSeqLen").replace("self.", "self.model.")
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


# --- preference tuning ----------------------------------------------------------------

# The objective and the data format go together; checked on the spec and on the trainer's config alike.
PREFERENCE_RULES: tuple[Rule, ...] = (
    Rule(
        cel=(
            "!has(self.training) || !has(self.training.objective) || !(self.training.objective in "
            + str(list(PREFERENCE_OBJECTIVES))
            + ") || (has(self.data) && has(self.data.format) && self.data.format == 'preference')"
        ),
        message="dpo and simpo train on pairs: set data.format: preference",
        field_path=".training.objective",
        check=lambda s: s.training is None or not s.training.trains_preferences or s.data.format == "preference",
    ),
    Rule(
        cel=(
            "!has(self.data) || !has(self.data.format) || self.data.format != 'preference' || (has(self.training)"
            " && has(self.training.objective) && self.training.objective in " + str(list(PREFERENCE_OBJECTIVES)) + ")"
        ),
        message="preference rows hold pairs to compare: set training.objective dpo or simpo",
        field_path=".data.format",
        check=lambda s: s.data.format != "preference" or (s.training is not None and s.training.trains_preferences),
    ),
)


# --- your own training script (spec.command) -------------------------------------


def _left_alone(section: str, owner: type[BaseModel], attrs: tuple[str, ...]) -> Rule:
    """With spec.command, ``section``'s ``attrs`` (settings only the built-in trainer reads) keep their defaults.

    The CRD defaults these sections, so the API server cannot tell "unset"
    from "set to the default": comparing with the defaults is what both sides
    can check, and a value the script would silently ignore is refused.
    """
    fields = [(attr, wire_name(owner, attr), owner.model_fields[attr].default) for attr in attrs]
    terms = [
        f"!has(self.{section}.{wire})"
        if default is None
        else f"(!has(self.{section}.{wire}) || self.{section}.{wire} == {cel_literal(default)})"
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


def _unset_with_command(section: str) -> Rule:
    return Rule(
        cel=f"!has(self.command) || !has(self.{section})",
        message=_replaced_message([section]),
        field_path=f".{section}",
        check=lambda s: s.command is None or getattr(s, section) is None,
    )


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
    *(_unset_with_command(section) for section in ("model", "training", "peft")),
    _left_alone("data", DataSpec, _all_fields(DataSpec)),
    _left_alone("fsdp", FSDPSpec, _all_fields(FSDPSpec)),
    _left_alone("parallelism", ParallelismSpec, _all_fields(ParallelismSpec)),
    _left_alone(
        "checkpoint",
        CheckpointSpec,
        (
            "interval_steps",
            "keep_last",
            "resume",
            "async_save",
            "remote",
            "remote_keep_last",
            "remote_wait_seconds",
        ),
    ),
    _left_alone("stall", StallSpec, ("trainer_step_timeout_seconds",)),
    _left_alone("tracking", TrackingSpec, _all_fields(TrackingSpec)),
)


# --- tensor and context parallelism ------------------------------------------------------------

_NO_TP = "!has(self.parallelism) || self.parallelism.tensor == 1"
_GPUS_CEL = "(has(self.resources) ? self.resources.gpusPerNode : 8)"


def _tp(spec: Any) -> int:
    return spec.parallelism.tensor


def _splits_model(spec: Any) -> bool:
    dims = spec.model.dims() if spec.model is not None else None
    t = _tp(spec)
    return dims is None or all(n % t == 0 for n in (dims.num_heads, dims.num_key_value_heads, dims.intermediate_size))


# Checked on the spec and again on the trainer's config (run-local has no resources section:
# there the launch's processes per node are checked by the parallel plan).
TENSOR_CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        cel=(
            f"{_NO_TP} || !has(self.model) || !has(self.model.preset) || ("
            + " && ".join(
                preset_cel(f).replace("self.", "self.model.") + " % self.parallelism.tensor == 0"
                for f in ("numHeads", "numKeyValueHeads", "intermediateSize")
            )
            + ")"
        ),
        message="parallelism.tensor must divide the model's numHeads, numKeyValueHeads and intermediateSize: "
        "each tensor-parallel rank computes whole attention heads and an equal slice of the MLP",
        field_path=".parallelism.tensor",
        check=lambda s: _tp(s) == 1 or _splits_model(s),
    ),
    Rule(
        cel=f"{_NO_TP} || !has(self.peft)",
        message="peft (LoRA) with parallelism.tensor > 1 is not supported: LoRA wraps the very projections the "
        "tensor-parallel plan splits, and its adapters would need their own split; LoRA's small memory "
        "footprint rarely needs more than data parallelism",
        field_path=".parallelism.tensor",
        check=lambda s: _tp(s) == 1 or s.peft is None,
    ),
    Rule(
        cel=f"{_NO_TP} || {_NOT_FLOAT8}",
        message="training.precision float8 with parallelism.tensor > 1 is not supported yet: the float8 layers "
        "need torchao's float8 tensor-parallel styles, which this trainer does not apply; use bf16",
        field_path=".parallelism.tensor",
        check=lambda s: _tp(s) == 1 or s.training is None or s.training.precision != "float8",
    ),
    Rule(
        cel=f"{_NO_TP} || !has(self.fsdp) || !self.fsdp.cpuOffload",
        message="fsdp.cpuOffload with parallelism.tensor > 1 is not supported: offloading keeps the shards in "
        "host memory, tensor parallelism splits the layers' compute over GPUs; choose one",
        field_path=".parallelism.tensor",
        check=lambda s: _tp(s) == 1 or not s.fsdp.cpu_offload,
    ),
)


def _cp(spec: Any) -> int:
    return spec.parallelism.context


_WORLD_CEL = f"((has(self.resources) ? self.resources.nodes : 1) * ({_GPUS_CEL} > 0 ? {_GPUS_CEL} : 1))"

PARALLELISM_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"{_NO_TP} || ({_GPUS_CEL} > 0 && {_GPUS_CEL} % self.parallelism.tensor == 0)",
        message="parallelism.tensor must divide resources.gpusPerNode: a tensor-parallel group is GPUs of one "
        "node, since it all-reduces activations twice per decoder block, too often for EFA between nodes "
        "(a CPU-only job runs one process per node)",
        field_path=".parallelism.tensor",
        check=lambda s: _tp(s) == 1 or (s.resources.gpus_per_node > 0 and s.resources.gpus_per_node % _tp(s) == 0),
    ),
    *TENSOR_CONFIG_RULES,
    *CONTEXT_CONFIG_RULES,
    *EXPERT_CONFIG_RULES,
    *EXPERT_SPEC_RULES,
    *PIPELINE_CONFIG_RULES,
    Rule(
        cel=(
            f"!has(self.parallelism) || {_WORLD_CEL} % (self.parallelism.tensor * self.parallelism.context * "
            "(has(self.parallelism.pipeline) ? self.parallelism.pipeline : 1)) == 0"
        ),
        message="resources.nodes x gpusPerNode must be a multiple of parallelism.tensor x context x pipeline: "
        "the ranks they leave are the data-parallel ones",
        field_path=".parallelism",
        check=lambda s: s.world_size() % (_tp(s) * _cp(s) * s.parallelism.pipeline) == 0,
    ),
)


# --- the whole spec ------------------------------------------------------------

_CKPT_CEL = (
    "(has(self.checkpoint) && has(self.checkpoint.dir) ? self.checkpoint.dir : "
    f"'{CheckpointSpec.model_fields['dir'].default}')"
)

# FSDPTrainingSpec's rules, in the order the CRD lists them.
SPEC_RULES: tuple[Rule, ...] = (
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
        cel=("!has(self.fsdp) || !self.fsdp.cpuOffload || (has(self.resources) ? self.resources.gpusPerNode : 8) > 0"),
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
    Rule(
        cel=(
            "!has(self.tracking) || !has(self.tracking.wandb) || !has(self.tracking.wandb.apiKeySecret)"
            f" || !has(self.env) || !self.env.exists(e, e.name == '{ENV_WANDB_API_KEY}')"
        ),
        message=f"env sets {ENV_WANDB_API_KEY}, which tracking.wandb.apiKeySecret already gives: keep one of them",
        field_path=".env",
        check=lambda s: (
            s.tracking.wandb is None
            or s.tracking.wandb.api_key_secret is None
            or all(e.name != ENV_WANDB_API_KEY for e in s.env)
        ),
    ),
    SEQ_LEN_RULE,
    *PREFERENCE_RULES,
    *COMMAND_RULES,
    *PARALLELISM_RULES,
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
        check=lambda s: not any(mounts_clash(m.mount_path, s.checkpoint.dir) for m in s.pod.volume_mounts),
    ),
    *KERNEL_SPEC_RULES,
    Rule(
        cel=f"{_NOT_FLOAT8} || !has(self.resources) || self.resources.gpusPerNode > 0",
        message="training.precision float8 needs GPUs with float8 tensor cores; a CPU-only job "
        "(resources.gpusPerNode: 0) cannot run it",
        field_path=".training.precision",
        check=lambda s: s.training is None or s.training.precision != "float8" or s.resources.gpus_per_node > 0,
    ),
    Rule(
        cel=(
            f"{_NOT_FLOAT8} || (has(self.resources) && has(self.resources.instanceTypes)"
            f" && self.resources.instanceTypes.size() > 0 && self.resources.instanceTypes.all(t, t in {_FLOAT8_CEL}))"
        ),
        message=_FLOAT8_TYPES_MESSAGE,
        field_path=".training.precision",
        check=lambda s: s.training is None or s.training.precision != "float8" or _float8_types(s.resources),
        detail=lambda s: _float8_types_detail(s.resources.instance_types),
        message_expression=(
            "has(self.resources) && has(self.resources.instanceTypes)"
            f" && self.resources.instanceTypes.exists(t, !(t in {_FLOAT8_CEL}))"
            f" ? '{_FLOAT8_PREFIX} and ' + self.resources.instanceTypes.filter(t, !(t in {_FLOAT8_CEL}))[0]"
            f" + (self.resources.instanceTypes.filter(t, !(t in {_FLOAT8_CEL}))[0] in {_NO_FLOAT8_CEL}"
            f" ? '{_HAS_NONE}' : '{_UNKNOWN}') + ': {_FLOAT8_CHOICES}' : '{_FLOAT8_TYPES_MESSAGE}'"
        ),
    ),
    Rule(
        cel=(
            "!has(self.scheduling) || !has(self.scheduling.topology) || (has(self.resources)"
            " && has(self.resources.instanceTypes) && self.resources.instanceTypes.size() > 0)"
        ),
        message="scheduling.topology needs resources.instanceTypes: Kueue fits pods into a domain by their "
        "requests alone, and only the requests derived from the instance type keep it from counting two "
        "pods onto one node, which the pods' one-per-node rule then refuses",
        field_path=".scheduling.topology",
        check=lambda s: s.scheduling.topology is None or bool(s.resources.instance_types),
    ),
    Rule(
        cel=(
            "!has(self.health) || self.health.onSuspectNode != 'exclude'"
            " || (has(self.checkpoint) && (has(self.checkpoint.claimName) || has(self.checkpoint.remote)))"
        ),
        message="health.onSuspectNode exclude needs checkpoint.claimName or checkpoint.remote: excluding a node "
        "restarts the pods from the last checkpoint, which an emptyDir loses with them",
        field_path=".health.onSuspectNode",
        check=lambda s: (
            s.health.on_suspect_node != "exclude"
            or s.checkpoint.claim_name is not None
            or s.checkpoint.remote is not None
        ),
    ),
    Rule(
        cel="!has(self.resources) || self.resources.efaPerNode == 0 || self.resources.gpusPerNode > 0",
        message="EFA needs GPU nodes: set resources.gpusPerNode",
        field_path=".resources.efaPerNode",
        check=lambda s: s.resources.efa_per_node == 0 or s.resources.gpus_per_node > 0,
    ),
)
