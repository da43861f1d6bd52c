"""training.preference: the settings of the preference objectives (training.objective dpo and simpo)."""

from __future__ import annotations

from pydantic import Field

from ..base import ApiModel


class PreferenceSpec(ApiModel):
    """Strength of the preference losses; the defaults are TRL's (DPOConfig.beta, CPOConfig.simpo_gamma)."""

    beta: float = Field(
        0.1,
        gt=0,
        le=1000,
        description=(
            "dpo: how far the policy may move from the reference (higher: closer to it); simpo: the scale of the "
            "length-normalised log-probability reward. TRL's default, 0.1."
        ),
    )
    gamma: float = Field(
        0.5,
        ge=0,
        le=1000,
        description=(
            "simpo only: the target reward margin between chosen and rejected answers (TRL's simpo_gamma, 0.5); "
            "the loss is -log sigmoid(beta * (mean log-prob chosen - mean log-prob rejected) - gamma)."
        ),
    )
