# Every set-up step lives here, so a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
EXAMPLE ?= examples/fsdptraining-tiny.yaml

.PHONY: setup wheels system-deps tools images prepare run test test-unit test-fast lint crd manifests bench bench-gpu demo-cluster clean

# Python environment: every package (API, operator, trainer, local cluster) with all extras,
# installed from the wheelhouse (one download for the venv and both images; tools/wheelhouse.sh).
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml bench/torchtitan-requirements.txt | wheels
	@tools/timed.sh venv env PYTHON=$(PYTHON) bash tools/install-venv.sh
	@touch $@

wheels:
	@tools/timed.sh wheelhouse env PYTHON=$(PYTHON) bash tools/wheelhouse.sh

# Debian packages the tests use as real components (Prometheus, promtool; buildah, podman,
# runc and debootstrap for the images).
system-deps:
	@tools/timed.sh system-deps bash tools/install-system-deps.sh

# Every binary the tests run, built from Go modules once and cached in ~/.cache/fsdp-k8s,
# two Go builds at a time (tools/build-binaries.sh --jobs), and the older Karpenter CRDs the
# bundle is checked against (from the Go module proxy too).
GO_TOOLS := etcd kube-apiserver kubectl helm kube-scheduler kube-controller-manager kubelet training-operator \
	kueue trainer-controller-manager jobset versitygw
GO_JOBS ?= 2
tools:
	@tools/timed.sh go-binaries bash tools/build-binaries.sh --jobs $(GO_JOBS) $(GO_TOOLS)
	@tools/timed.sh karpenter-crds bash tools/fetch-karpenter-crds.sh

# Both Dockerfile targets, built here with buildah on a local Debian base (docs/images.md);
# a no-op while their inputs are unchanged. The image tests and the whole-cluster tests run them.
images: system-deps wheels
	@tools/timed.sh images bash tools/build-images.sh trainer operator

# The embedded default: a real FSDP2 training job on the CPU (2 ranks, gloo), no cluster, no GPU, no internet.
run: setup
	$(BIN)/fsdp-operator run-local -f $(EXAMPLE)

# Every set-up step of the suite, overlapped (make -j: the Go builds beside the wheel
# download, the venv and the image builds), each timed into runs/setup-times.tsv and
# summed up at the end, so a slow step shows in the CI log (docs/e2e.md, "Set-up").
SETUP_JOBS ?= 4
prepare:
	@tools/timed.sh --reset
	@bash tools/check-disk.sh
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) setup system-deps tools images
	@tools/timed.sh --summary

# The whole test suite, against the real components, on two pytest workers (one per 4 cores on
# bigger machines; one on a single core). The whole-cluster tests and the image tests each stay one
# unit of work, largest first, the rest spread (tests/conftest.py, SERIAL_GROUPS): the e2e worker
# mostly waits for pods, stalls and queues, and the other fills those waits.
# runs/junit.xml feeds `python tools/test_times.py`: where the time goes (docs/e2e.md keeps the table).
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; n = os.cpu_count() or 1; print(min(n, max(2, n // 4)))')
test: prepare
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -n $(PYTEST_WORKERS) --junitxml=runs/junit.xml

# The unit tier: the tests that need no Go binary, no image and no cluster (tests/conftest.py,
# the `integration` marker) and are not marked slow, on the venv alone. A test in it that runs
# over a few seconds fails (tests/slow_guard.py): mark it slow.
test-unit: setup
	FSDP_UNIT_TIER=1 $(BIN)/pytest -n $(PYTEST_WORKERS) -m 'not slow and not integration' -p tests.slow_guard

# Everything but the whole-cluster end-to-end tests.
test-fast: prepare
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m 'not e2e'

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

# Regenerate the committed CRD, Trainer v2 runtime and API reference from the Python sources.
crd: setup
	$(BIN)/fsdp-operator crd > kustomize/crd/training.fsdp.dev_fsdptrainings.yaml
	$(BIN)/fsdp-operator runtime > kustomize/components/trainjob/clustertrainingruntime.yaml
	$(BIN)/fsdp-operator docs > docs/api-reference.md

# Regenerate kustomize/overlays/fsdp/generated from its FSDPTraining (a test checks for drift).
manifests: setup
	$(BIN)/python tools/generate_manifests.py

bench: setup tools
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/operator_latency.py
	$(BIN)/python bench/trainer_throughput.py
	$(BIN)/python bench/trainer_throughput.py --accelerate
	$(BIN)/python bench/trainer_throughput.py --logits
	$(BIN)/python bench/lora_vs_full.py
	$(BIN)/python bench/dpo_vs_sft.py
	$(BIN)/python bench/s3_upload.py
	$(BIN)/python bench/pipeline_schedules.py

# On a GPU machine: llama3.2-1b tokens/s, MFU and peak memory (docs/benchmarks.md).
# ARGS=--quick: the subset that fits one 8-minute device lease; ARGS=--dry-run: the same
# path on the CPU, tiny preset on 2 gloo ranks (tests/bench/test_gpu_dry_run.py runs it).
ARGS ?=
bench-gpu: setup
	$(BIN)/python bench/trainer_throughput.py --gpu $(ARGS)

# The whole flow on your laptop: etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
# the Kubeflow training operator and Karpenter-shaped nodes running pods as local processes;
# the operator from kustomize/default; the example FSDPTraining to Succeeded; teardown.
DEMO_STEPS ?= 30
demo-cluster: setup system-deps tools
	$(BIN)/python tools/demo_cluster.py -f $(EXAMPLE) --steps $(DEMO_STEPS)

clean:
	rm -rf $(VENV) runs .pytest_cache
