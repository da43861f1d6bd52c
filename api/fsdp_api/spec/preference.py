"""training.preference: the settings of the preference objectives (training.objective dpo and simpo)."""

from __future__ import annotations

from pydantic import Field

from ..base import ApiModel

# beta scales the gradient of the sigmoid loss; 1e-300 is 0 in float32 (the step trains nothing)
# and anything near 1e-8 is swamped by AdamW's epsilon. TRL's examples go down to 0.01.
BETA_FLOOR = 0.001


class PreferenceSpec(ApiModel):
    """Strength of the preference losses; the defaults are TRL's (DPOConfig.beta, CPOConfig.simpo_gamma)."""

    beta: float = Field(
        default=0.1,
        ge=BETA_FLOOR,
        le=1000,
        description=(
            "dpo: how far the policy may move from the reference (higher: closer to it); simpo: the scale of the "
            "length-normalised log-probability reward. TRL's default, 0.1. At least 0.001: the loss's gradient "
            "scales with beta, and below that it vanishes into float rounding and Adam's epsilon."
        ),
    )
    gamma: float = Field(
        default=0.5,
        ge=0,
        le=1000,
        description=(
            "simpo only: the target reward margin between chosen and rejected answers (TRL's simpo_gamma, 0.5); "
            "the loss is -log sigmoid(beta * (mean log-prob chosen - mean log-prob rejected) - gamma)."
        ),
    )
