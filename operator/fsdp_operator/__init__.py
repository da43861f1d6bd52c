"""fsdp-operator: FSDPTraining custom resources rendered into Kubeflow PyTorchJobs.

Importing this package never imports torch: the operator image has none.
"""

__version__ = "0.1.0"
