"""Data parallelism: where this process sits, the device mesh, and FSDP2 on the model.

- ``plan.py``: ``ParallelPlan``, the one reading of ``fsdp.shardingStrategy``
  (mesh, shard groups, resharding, whether FSDP is used; torch-free).
- ``distributed.py``: ``WorldInfo`` from torchrun/Kubeflow variables, the
  process group, the device mesh built from the plan.
- ``parallelize.py``: activation checkpointing, ``torch.compile``,
  ``fully_shard`` and prefetch, applied to the meta model.

Importing the package imports nothing heavy: the config checks use ``plan``
without torch.
"""
