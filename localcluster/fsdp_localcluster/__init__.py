"""A whole Kubernetes cluster on one machine, for tests, the demo and benchmarks."""
