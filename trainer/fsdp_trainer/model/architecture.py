"""Any Hugging Face causal LM: its config, the meta-device model, and the units FSDP shards.

The architecture comes from one of three places (``model.preset``,
``model.architecture``, ``model.pretrained``) but always ends as a
transformers ``PretrainedConfig`` that ``AutoModelForCausalLM`` builds. No
architecture is special-cased by name: the units that activation
checkpointing and ``fully_shard`` wrap are the model's own
``_no_split_modules`` classes (the blocks transformers never splits across
devices, which is also what Accelerate's FSDP auto-wrap uses), or, for a
model that declares none, its longest list of repeated blocks.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from fsdp_api.spec import ModelOverrides
from fsdp_api.trainer_config import TrainerConfig
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from ..errors import ConfigError, load_failure
from .hub import local_path, snapshot
from .layer_values import layer_values
from .llama import llama_config
from .param_names import base_name, unique_parameters

log = logging.getLogger(__name__)

# Files a config-only reference needs: never weights.
CONFIG_PATTERNS = ["config.json", "generation_config.json", "tokenizer*", "*.model", "*.tiktoken", "special_tokens*"]
# Every file a pretrained model needs (safetensors only: never pickled weights).
PRETRAINED_PATTERNS = ["*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken", "*.jinja"]
# ModelOverrides field -> the standard transformers attribute (each config's
# attribute_map translates it, e.g. GPT-2's n_embd).
OVERRIDE_ATTRIBUTES = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_seq_len": "max_position_embeddings",
}
# Preferred attention kernels, best first; an architecture that lacks SDPA gets eager.
ATTENTION = ("sdpa", "eager")


def model_dir(cfg: TrainerConfig) -> tuple[Path, str] | None:
    """The local directory behind architecture/pretrained (a hub snapshot for a hub id) and its field."""
    spec = cfg.model
    if spec.pretrained:
        ref, field, patterns = spec.pretrained, "model.pretrained", PRETRAINED_PATTERNS
    elif spec.architecture:
        ref, field, patterns = spec.architecture, "model.architecture", CONFIG_PATTERNS
    else:
        return None
    path = local_path(ref)
    if path is None:
        try:
            path = snapshot(ref, patterns)
        except Exception as e:  # the hub client raises many kinds; all mean "cannot get it"
            raise ConfigError([f"{field}: cannot fetch {ref} from the Hugging Face hub: {e}"]) from None
    if not (path / "config.json").is_file():
        raise ConfigError([f"{field}: {ref} has no config.json (expected a Hugging Face model directory)"])
    return path, field


def _apply_overrides(config: PretrainedConfig, overrides: ModelOverrides | None, field: str) -> list[str]:
    errors = []
    for key, value in (overrides.model_dump() if overrides else {}).items():
        if value is None:
            continue
        attr = OVERRIDE_ATTRIBUTES[key]
        yaml_key = ModelOverrides.model_fields[key].alias or key
        # An attribute the architecture does not have would be set and then
        # ignored by the model: refuse it instead of training something else.
        if not hasattr(config, attr):
            errors.append(f"model.config.{yaml_key}: {type(config).__name__} has no {attr} to override ({field})")
            continue
        setattr(config, attr, value)
    return errors


def encoder_as_decoder(config: PretrainedConfig) -> str | None:
    """The causal-LM class of an encoder (BERT, RoBERTa, ELECTRA…) that is not configured as a decoder.

    transformers maps encoders to a causal-LM head (``BertLMHeadModel``) that
    attends both ways unless ``config.is_decoder``: every position would see
    its own label. Such a class reads ``is_decoder`` in its constructor (to warn
    or refuse); decoder halves of encoder-decoders (BART's, Marian's) set it
    themselves. Decided from the class, not a list of names.
    """
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if not name or getattr(config, "is_decoder", False):
        return None
    try:
        source = inspect.getsource(getattr(transformers, name).__init__)
    except (AttributeError, OSError, TypeError):
        return None
    return name if "is_decoder" in source and "is_decoder = True" not in source else None


def check_causal_lm(config: PretrainedConfig, where: str) -> None:
    if getattr(config, "is_encoder_decoder", False) or config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            [
                f"{where}: {type(config).__name__} (model_type {config.model_type!r}) is not a decoder-only "
                "causal LM that transformers' AutoModelForCausalLM can build"
            ]
        )
    if (head := encoder_as_decoder(config)) is not None:
        raise ConfigError(
            [
                f"{where}: {config.model_type!r} is an encoder: its causal-LM head ({head}) attends in both "
                "directions (is_decoder is false), so each position would see the token it learns to predict; "
                "the trainer trains decoder-only models"
            ]
        )


def model_config(cfg: TrainerConfig, path: Path | None, tokens: dict[str, int | None]) -> PretrainedConfig:
    """The transformers config of the model to train (preset, or config.json plus overrides)."""
    spec = cfg.model
    if path is None:
        return llama_config(spec, **tokens)
    field = "model.pretrained" if spec.pretrained else "model.architecture"
    try:
        # Custom modelling code from a repository is never run: without an explicit False,
        # transformers asks on the terminal whether to run it.
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError([f"{field}: cannot read the model config in {path}: {load_failure(e)}"]) from None
    check_causal_lm(config, field)
    errors = _apply_overrides(config, spec.config, field)
    pairs = zip(layer_values(config, "num_attention_heads"), layer_values(config, "num_key_value_heads"), strict=True)
    for heads, kv in sorted({(h, k) for h, k in pairs if h and k and h % k}):
        errors.append(f"model.config.numHeads: {heads} heads are not divisible by {kv} key/value heads")
    if errors:
        raise ConfigError(errors)
    config.use_cache = False
    return config


def max_positions(config: PretrainedConfig) -> int | None:
    """The longest sequence the architecture is configured for (None: not bounded by a table).

    XLNet says -1 (relative positions, no table): unbounded, not "at most -1".
    """
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value and int(value) > 0 else None


def build_meta_model(config: PretrainedConfig) -> PreTrainedModel:
    """The model with shapes but no storage, in fp32 (FSDP's policy casts for compute)."""
    for attention in ATTENTION:
        try:
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(
                    config, attn_implementation=attention, dtype=torch.float32, trust_remote_code=False
                )
        except ValueError as e:
            if attention == ATTENTION[-1] or "does not support" not in str(e):
                raise
            log.info("%s does not support %s attention; using the next kernel", type(config).__name__, attention)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Unit:
    """A decoder block: ``parent[index]`` is the module to wrap and shard."""

    parent: nn.ModuleList
    index: int

    @property
    def module(self) -> nn.Module:
        return self.parent[self.index]

    def replace(self, module: nn.Module) -> None:
        self.parent[self.index] = module


def _no_split_classes(model: nn.Module) -> set[str]:
    names: set[str] = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or ())
    return names


def _class_names(module: nn.Module) -> set[str]:
    """The block's class names, through wrappers (checkpointing) and FSDP's dynamic subclass."""
    inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(module, "_orig_mod", None)
    return {cls.__name__ for cls in type(inner if inner is not None else module).__mro__}


def _repeated_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The longest ModuleList of blocks of one class (modules with submodules, not bare layers).

    For models that declare no ``_no_split_modules`` (BioGPT, Blenderbot in
    transformers 5): their decoder layers are exactly such a list. Any split
    into units is correct for FSDP and activation checkpointing; the blocks
    are the efficient one.
    """
    best: nn.ModuleList | None = None
    for parent in model.modules():
        if not isinstance(parent, nn.ModuleList) or len(parent) == 0:
            continue
        if len({type(child) for child in parent}) != 1 or not any(True for _ in parent[0].children()):
            continue
        if best is None or len(parent) > len(best):
            best = parent
    return best


def decoder_units(model: nn.Module) -> list[Unit]:
    """The model's repeated blocks, in order; a clear error when it has none."""
    classes = _no_split_classes(model)
    units = [
        Unit(parent, i)
        for parent in model.modules()
        if isinstance(parent, nn.ModuleList)
        for i, child in enumerate(parent)
        if _class_names(child) & classes
    ]
    if units:
        return units
    if not classes and (blocks := _repeated_blocks(model)) is not None:
        return [Unit(blocks, i) for i in range(len(blocks))]
    raise ConfigError(
        [
            f"model: cannot find the decoder layers of {type(model).__name__}: no _no_split_modules class "
            f"(declared: {sorted(classes) or 'none'}) and no list of repeated blocks in a ModuleList, so FSDP "
            "has no unit to shard"
        ]
    )


def embeddings_tied(model: PreTrainedModel) -> bool:
    """Whether transformers ties this model's output head to its input embedding.

    The config's ``tie_word_embeddings`` is not enough: it defaults to true, and
    models that declare no tie (BigBird-Pegasus, CPM-Ant) keep a head of their
    own despite it. transformers' own mapping of tied parameters decides.
    """
    head = model.get_output_embeddings()
    if head is None:
        return False
    declared = getattr(model, "all_tied_weights_keys", None)
    if declared is None:  # not built by transformers' post_init: only the config can tell
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return bool(getattr(text, "tie_word_embeddings", False))
    return not declared.keys().isdisjoint(head_weight_names(model))


def head_weight_names(model: PreTrainedModel) -> set[str]:
    """The Hugging Face name(s) of the output head's weight (LoRA wrappers stripped)."""
    head = model.get_output_embeddings()
    return {f"{base_name(name)}.weight" for name, module in model.named_modules() if module is head}


def _is_tied(model: PreTrainedModel) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def materialize(model: PreTrainedModel, device: torch.device | str) -> None:
    """Allocate (uninitialised) storage for the meta model's shards, keeping tied weights tied.

    ``to_empty`` on a plain module swaps in new Parameter objects, which
    unties the output head from the embedding; FSDP2 keeps the shared
    parameter as one. Re-tie the plain case, before init so both names get one tensor.
    """
    model.to_empty(device=device)
    if embeddings_tied(model) and not _is_tied(model):
        if isinstance(model.get_output_embeddings().weight, torch.distributed.tensor.DTensor):
            raise RuntimeError("FSDP untied the output head from the input embedding")
        model.get_output_embeddings().weight = model.get_input_embeddings().weight


def check_tied(model: PreTrainedModel) -> None:
    """Tied embeddings must still share one parameter after materialisation."""
    if embeddings_tied(model) and not _is_tied(model):
        raise RuntimeError("the output head is no longer tied to the input embedding after materialisation")


def count_parameters(model: nn.Module) -> int:
    """Parameters of the full (unsharded) model, tied ones once."""
    return sum(p.numel() for _, p in unique_parameters(model))
