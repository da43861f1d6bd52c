"""Test helpers that are not part of the local cluster: ``trainer_run`` (a trainer under torchrun with its metrics)."""
