"""The rules of pipeline parallelism (``parallelism.pipeline``) across sections.

Checked on the spec (so ``validate`` and the API server refuse the same
layouts) and again on the trainer's config. What needs the model's own config
(its layer count, whether its embeddings are tied, where its final norm is) is
checked by the trainer when it splits the model (``fsdp_trainer.parallel.pipeline``).
Each refusal is a combination this trainer does not run under a pipeline yet,
said so, rather than one that would train wrongly.
"""

from __future__ import annotations

from typing import Any

from ..presets import PRESETS
from ..rules import Rule

_NO_PP = "!has(self.parallelism) || !has(self.parallelism.pipeline) || self.parallelism.pipeline == 1"
_TIED_PRESETS = sorted(name for name, dims in PRESETS.items() if dims.tie_word_embeddings)


def _pp(spec: Any) -> int:
    return spec.parallelism.pipeline


def _training(field: str, default: str) -> str:
    return f"(has(self.training) && has(self.training.{field}) ? self.training.{field} : {default})"


_OBJECTIVE = _training("objective", "'lm'")
_LOGITS = _training("logits", "'full'")

PIPELINE_CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"{_NO_PP} || {_training('gradAccumSteps', '1')} >= self.parallelism.pipeline",
        message="parallelism.pipeline needs training.gradAccumSteps >= pipeline: the step's micro-batches are the "
        "pipeline's, and with fewer than one per stage some stage would never work while another does "
        "(4 x pipeline keeps the idle share under a fifth)",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.training.grad_accum_steps >= _pp(s),
    ),
    Rule(
        cel=f"{_NO_PP} || !has(self.parallelism.context) || self.parallelism.context == 1",
        message="parallelism.pipeline with parallelism.context > 1 is not supported yet: use one of the two",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.parallelism.context == 1,
    ),
    Rule(
        cel=f"{_NO_PP} || !has(self.parallelism.expert) || self.parallelism.expert == 1",
        message="parallelism.pipeline with parallelism.expert > 1 is not supported yet: use one of the two",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.parallelism.expert == 1,
    ),
    Rule(
        cel=f"{_NO_PP} || {_OBJECTIVE} == 'lm'",
        message="parallelism.pipeline trains training.objective lm only: the preference objectives compare each "
        "pair's sums over whole sequences on one rank, which the pipeline's last stage does not hold yet",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.training.objective == "lm",
    ),
    Rule(
        cel=f"{_NO_PP} || {_LOGITS} == 'full'",
        message="parallelism.pipeline computes the loss from the last stage's full logits: training.logits "
        "chunked is not supported with it yet",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.training.logits == "full",
    ),
    Rule(
        cel=f"{_NO_PP} || !has(self.training) || !has(self.training.samples)",
        message="parallelism.pipeline with training.samples is not supported yet: generating answers token by "
        "token would pass every token through every stage (generate from the exported model with fsdp-train "
        "generate)",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.training.samples is None,
    ),
    Rule(
        cel=f"{_NO_PP} || {_training('routerAuxLossCoef', '0.0')} == 0.0",
        message="parallelism.pipeline with training.routerAuxLossCoef is not supported yet: the routers of "
        "one model sit on different stages",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.training.router_aux_loss_coef == 0,
    ),
    Rule(
        cel=f"{_NO_PP} || !has(self.model) || !has(self.model.preset) || !({_TIED_PRESETS!r}.exists(p, p == "
        "self.model.preset))",
        message="parallelism.pipeline needs untied input and output embeddings: the presets "
        f"{', '.join(_TIED_PRESETS)} tie them (one weight on the first and the last stage); use "
        "llama3.1-8b or larger",
        field_path=".parallelism.pipeline",
        check=lambda s: _pp(s) == 1 or s.model.preset not in _TIED_PRESETS,
    ),
)
