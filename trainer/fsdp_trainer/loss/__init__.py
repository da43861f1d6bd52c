"""The training loss: full logits or a chunked output head (``training.logits``)."""

from .chunked import LogitTransform, linear_cross_entropy_sum
from .head import ChunkedHead, FullLogits, OutputLoss, output_loss, token_loss_sum
from .model_call import ModelCall

__all__ = [
    "ChunkedHead",
    "FullLogits",
    "LogitTransform",
    "ModelCall",
    "OutputLoss",
    "linear_cross_entropy_sum",
    "output_loss",
    "token_loss_sum",
]
