"""The kopf operator: an FSDPTraining's objects applied (the renderer's: the ConfigMap, the backend's job,
the PodMonitor, the NetworkPolicy), and its status: the job's state, rank 0's progress, stalls, Kueue's
Workload and the health of its nodes.

Entry point: :func:`fsdp_operator.controller.main.run_operator` (``fsdp-operator run``).
"""
