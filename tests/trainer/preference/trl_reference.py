"""TRL's own ``DPOTrainer``, run in-process on CPU, as the reference for our DPO loss.

Why: our trainer computes DPO on packed pairs with its own log-prob code, so a
test that only checks it against a formula written by us could share our
mistakes. TRL is the implementation people compare against, so the tests run
the very same optimisation there (same model, pairs, batches, optimizer and
reference) and compare the loss step by step.

What is pinned so that the two runs are the same optimisation (TRL 1.16, transformers 5.23):

- fp32 on CPU (TRL's configs default to bf16), no dropout, no gradient checkpointing (it changes no number here,
  only the speed), fixed seed;
- the batch of step k is exactly ``pairs[i] for i in steps[k]``, in that order: the dataset is laid out in step
  order and read by a ``SequentialSampler`` (the Trainer's default sampler shuffles);
- torch AdamW, betas (0.9, 0.95), eps 1e-8, no weight decay, constant learning rate without warm-up, gradient
  clipping at norm 1.0. ``optim="adamw_torch"``, not transformers' default ``adamw_torch_fused``: on CPU the
  single-tensor AdamW is bitwise the foreach one our trainer uses, the fused kernel differs in the last bits;
- no truncation (``max_length=None``), no padding-free batches, reference log-probs computed on the fly;
- reference: without PEFT, TRL reloads the initial model from ``model_dir`` (``config._name_or_path``) as a frozen
  copy; with PEFT, TRL adds a fresh adapter and the reference is the same model with the adapter disabled.

How TRL 1.16 computes a sequence's log-prob (``DPOTrainer._compute_loss`` and ``DataCollatorForPreference``): the
batch is ``[prompt + chosen for each pair] + [prompt + rejected for each pair]`` (2B rows), right-padded with the pad
id and attention mask 0. ``completion_mask`` is 0 on the prompt and padding, 1 on the chosen/rejected ids (eos
included); the labels are the input ids with -100 where the mask is 0, shifted by one inside the fused LM head. A
sequence's log-prob is the sum of log p(token) over its completion tokens (no length normalisation), the same for the
reference. The sigmoid loss is ``-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` per pair, averaged over the
B pairs of the step.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from datasets import Dataset
from torch.utils.data import Sampler, SequentialSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
from trl import DPOConfig, DPOTrainer

# TRL's per-step metrics that are copied into each ``TrlDpoStep``.
_METRICS = {
    "rewards_chosen": "rewards/chosen",
    "rewards_rejected": "rewards/rejected",
    "rewards_accuracies": "rewards/accuracies",
    "rewards_margins": "rewards/margins",
    "logps_chosen": "logps/chosen",
    "logps_rejected": "logps/rejected",
}


@dataclass(frozen=True)
class TrlDpoStep:
    """What TRL computed at one optimizer step, before that step's update (means over the step's pairs)."""

    loss: float
    rewards_chosen: float
    rewards_rejected: float
    rewards_accuracies: float
    rewards_margins: float
    logps_chosen: float
    logps_rejected: float


class _StepOrderDPOTrainer(DPOTrainer):
    """``DPOTrainer`` fed pre-tokenized rows in a fixed order, recording each step's exact loss and metrics."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded: list[TrlDpoStep] = []
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset: Dataset, *args: Any, **kwargs: Any) -> Dataset:
        # TRL 1.16's `_prepare_dataset` has no "already tokenized" check (only a comment in `evaluate` says it is
        # idempotent): a dataset with only prompt_ids/chosen_ids/rejected_ids would be sent through `extract_prompt`
        # and fail on the missing "chosen" text. The rows are already what its tokenization produces and what
        # `DataCollatorForPreference` reads, so they are used as they are (ids untouched: no eos added, no
        # re-tokenization that could merge tokens across the prompt/completion boundary).
        return dataset

    def _get_train_sampler(self, train_dataset: Dataset | None = None) -> Sampler[int]:
        # The rows are laid out in step order: read them in that order (the default sampler shuffles).
        return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.model.training:
            loss = result[0] if return_outputs else result
            # `_compute_loss` has just appended this step's metrics (the logged values are means over steps).
            metrics = self._metrics["train"]
            extra = {field: float(metrics[key][-1]) for field, key in _METRICS.items()}
            self.recorded.append(TrlDpoStep(loss=float(loss.detach().item()), **extra))
        return result


@contextlib.contextmanager
def _quiet_and_seed_preserving() -> Iterator[None]:
    """Keep the caller's RNG states and transformers' logging: TRL seeds every RNG, the run would log and warn."""
    py_state, np_state = random.getstate(), np.random.get_state()
    verbosity = transformers.logging.get_verbosity()
    progress_bars = transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" of the policy and the reference
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # TRL 1.16 reads `model.is_gradient_checkpointing` at every loss, deprecated in transformers 5.23.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if progress_bars:
            transformers.logging.enable_progress_bar()
        random.setstate(py_state)
        np.random.set_state(np_state)


def _lora_config(peft: dict[str, Any]) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=peft["rank"],
        lora_alpha=peft["alpha"],
        target_modules=list(peft["targets"]),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


@torch.no_grad()
def _load_lora_a(trainer: DPOTrainer, lora_a: dict[str, torch.Tensor]) -> None:
    """Replace PEFT's random lora_A init by the given one (B stays 0): both trainers start from the same adapters."""
    from peft.tuners.lora import LoraLayer

    model = trainer.model.get_base_model()
    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    if set(layers) != set(lora_a):
        raise ValueError(f"lora_A names {sorted(lora_a)} != adapted modules {sorted(layers)}")
    for name, layer in layers.items():
        layer.lora_A["default"].weight.copy_(lora_a[name])


def trl_dpo_run(
    model_dir: Path,
    tokenizer_dir: Path,
    pairs: list[dict[str, list[int]]],
    steps: list[list[int]],
    *,
    beta: float,
    learning_rate: float,
    workdir: Path,
    peft: dict[str, Any] | None = None,
    loss_type: str = "sigmoid",
    seed: int = 0,
) -> list[TrlDpoStep]:
    """Train ``model_dir`` with TRL's ``DPOTrainer`` for ``len(steps)`` steps; TRL's numbers at each step.

    ``pairs`` are pre-tokenized rows ``{"prompt_ids", "chosen_ids", "rejected_ids"}`` (answers already end with eos);
    step k trains on the pairs ``steps[k]`` (all steps the same size B), in that order. ``peft``:
    ``{"rank", "alpha", "targets"}`` trains a LoRA adapter (dropout 0) against the adapter-disabled base; an optional
    ``"lora_A": {module name: tensor}`` (names as in the unwrapped model, e.g. ``model.layers.0.self_attn.q_proj``)
    replaces PEFT's random init of A so that TRL starts from the same adapters as our trainer.
    """
    sizes = {len(batch) for batch in steps}
    if len(sizes) != 1:
        raise ValueError(f"every step needs the same number of pairs, got sizes {sorted(sizes)}")
    (batch_size,) = sizes
    keys = ("prompt_ids", "chosen_ids", "rejected_ids")
    rows = [{key: list(pairs[i][key]) for key in keys} for batch in steps for i in batch]

    args = DPOConfig(
        output_dir=str(workdir / "trl-dpo"),
        seed=seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        # Not `gradient_checkpointing` (TRL's default True): a deprecated alias in transformers 5.23 that warns.
        activation_checkpointing=False,
        disable_dropout=True,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=1,
        max_steps=len(steps),
        num_train_epochs=1,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=beta,
        loss_type=[loss_type],
        max_length=None,
        padding_free=False,
        precompute_ref_log_probs=False,
        dataloader_drop_last=False,
        dataloader_num_workers=0,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    with _quiet_and_seed_preserving():
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        # Loaded from the path (not built in memory): TRL reloads the reference from `config._name_or_path`.
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        trainer = _StepOrderDPOTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=_lora_config(peft) if peft is not None else None,
        )
        # With `disable_tqdm` the Trainer prints the final metrics dict instead of a progress bar.
        trainer.remove_callback(PrinterCallback)
        if peft is not None and "lora_A" in peft:
            _load_lora_a(trainer, peft["lora_A"])
        trainer.train()
    if len(trainer.recorded) != len(steps):
        raise RuntimeError(f"TRL ran {len(trainer.recorded)} steps, expected {len(steps)}")
    return trainer.recorded
