"""The trainer's entry point for a warm launch: torchrun's ``--run-path`` runs this file in each forked rank.

The ranks are forked from a process that has already imported the trainer
(warm_launch.py), so ``fsdp_trainer.__main__`` is found in ``sys.modules``.
"""

import sys

from fsdp_trainer.__main__ import main

sys.exit(main())
