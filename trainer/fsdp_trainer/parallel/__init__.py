"""Data parallelism: where this process sits, the device mesh, and FSDP2 on the model.

- ``plan.py``: the torch device mesh built from ``fsdp_api.parallel_plan``'s
  ``ParallelPlan``, the torch-free and only reading of ``fsdp.shardingStrategy``
  (mesh, shard groups, resharding, whether FSDP is used, the data-parallel
  coordinates).
- ``distributed.py``: ``WorldInfo`` from torchrun/Kubeflow variables and the
  process group.
- ``parallelize.py``: activation checkpointing, ``torch.compile``,
  ``fully_shard`` and prefetch, applied to the meta model.

Importing the package imports nothing heavy: the config checks use the API's
plan without torch.
"""
