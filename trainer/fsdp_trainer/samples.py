"""``training.samples``: the model's greedy answers to a few prompts, at each validation and at the end.

Every rank decodes every prompt on the sharded model itself, so no rank
gathers a whole copy: FSDP all-gathers each layer per forward, and tensor
parallelism splits it, as in training. The ranks must make the same number
of forwards, so decoding is greedy (the same token on every rank: they hold
the same weights and the same prompt) and each prompt runs for exactly
``maxNewTokens`` forwards; the completion is cut at the first end-of-sequence
token afterwards. Without a KV cache each forward reads the whole sequence
(``logits_to_keep=1``: the head only for the last position), which keeps the
model's own forward, the one training runs, for any architecture.

Decoding runs outside the context-parallel layout (whole rows, like the
validation forward) and eagerly (compiled layers would compile every new
length).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from fsdp_api.spec.samples import SamplesSpec
from torch import nn
from transformers import PreTrainedTokenizerBase

from .errors import ConfigError
from .parallel.parallelize import compute_context, reshard

log = logging.getLogger(__name__)

FIELD = "training.samples"


@dataclass(frozen=True)
class Sample:
    prompt: str
    completion: str


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, chat: str, field: str = f"{FIELD}.chat") -> list[int]:
    """The prompt's token ids: a user turn and the generation prompt under a chat template, else the text."""
    if chat == "on" and not tokenizer.chat_template:
        raise ConfigError([f"{field} on: the model's tokenizer has no chat template"])
    if chat != "off" and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)
    return list(tokenizer(prompt)["input_ids"])


class Samples:
    """The prompts, tokenized once at start (a chat: on without a template, or a prompt that with its answer
    would pass the model's longest sequence, stops the run there in one line)."""

    def __init__(
        self,
        spec: SamplesSpec,
        tokenizer: PreTrainedTokenizerBase,
        precision: str,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        self.spec, self.tokenizer, self.precision, self.device = spec, tokenizer, precision, device
        self.inputs = [prompt_ids(tokenizer, prompt, spec.chat) for prompt in spec.prompts]
        too_long = [
            f"{FIELD}.prompts[{i}]: {len(ids)} tokens and maxNewTokens {spec.max_new_tokens} pass the model's "
            f"maximum sequence length {max_positions} (max_position_embeddings): shorten it or lower maxNewTokens"
            for i, ids in enumerate(self.inputs)
            if max_positions is not None and len(ids) + spec.max_new_tokens > max_positions
        ]
        if too_long:
            raise ConfigError(too_long)
        self.stop = {t for t in (tokenizer.eos_token_id,) if t is not None}
        self._keep_one = True  # logits_to_keep=1, where the model's forward takes it

    def answer(self, model: nn.Module, before_forward: Callable[[], None] = lambda: None) -> list[Sample]:
        """Every prompt's completion (collective: every rank runs the same forwards).

        ``before_forward`` runs before each of them: the trainer re-arms its step watchdog there, so a
        long set of samples is never taken for a hang while no single forward is slower than a step.
        """
        was_training = model.training
        model.eval()
        try:
            eager = torch.compiler.set_stance("force_eager")
            with torch.no_grad(), eager, compute_context(model, self.precision, self.device):
                completions = [self._greedy(model, ids, before_forward) for ids in self.inputs]
        finally:
            reshard(model)
            model.train(was_training)
        return [Sample(p, c) for p, c in zip(self.spec.prompts, completions, strict=True)]

    def _greedy(self, model: nn.Module, ids: list[int], before_forward: Callable[[], None]) -> str:
        sequence = torch.tensor([ids], device=self.device)
        new: list[int] = []
        for _ in range(self.spec.max_new_tokens):
            before_forward()
            logits = self._logits(model, sequence)
            token = int(logits[0, -1].float().argmax())
            new.append(token)
            sequence = torch.cat([sequence, torch.tensor([[token]], device=self.device)], dim=1)
        for i, token in enumerate(new):
            if token in self.stop:
                new = new[:i]
                break
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text

    def _logits(self, model: nn.Module, sequence: torch.Tensor) -> torch.Tensor:
        if self._keep_one:
            try:
                return model(input_ids=sequence, logits_to_keep=1).logits
            except TypeError:  # an older forward without it: every position's logits, the last one used
                self._keep_one = False
        return model(input_ids=sequence).logits
