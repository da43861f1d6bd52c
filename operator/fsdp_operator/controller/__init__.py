"""The kopf operator: FSDPTraining → ConfigMap + PyTorchJob + PodMonitor, and their status.

Entry point: :func:`fsdp_operator.controller.main.run_operator` (``fsdp-operator run``).
"""
