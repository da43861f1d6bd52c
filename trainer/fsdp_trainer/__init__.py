"""fsdp-trainer: a PyTorch FSDP2 trainer for Llama models, launched by torchrun.

Importing this package never imports torch, so the operator image can install
it (for the shared config models and the console script) without torch. The
modules that need torch import it themselves.
"""

__version__ = "0.1.0"
