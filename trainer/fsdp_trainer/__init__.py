"""fsdp-trainer: a PyTorch FSDP2 trainer for Llama models, launched by torchrun.

Importing this package never imports torch, so the operator image can install
it (for the shared config models and the console script) without torch. The
modules that need torch import it themselves.
"""

import logging

__version__ = "0.1.0"

# transformers imports torchao (our float8 backend) with PreTrainedModel, and
# torchao registers enums with torch's pytree, which torch logs as deprecated on
# every process's stderr: two lines of noise before any error a user must read.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
