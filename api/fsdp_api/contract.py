"""The names every side shares: written here once, imported everywhere else.

The renderer writes them into pods, the trainer reads them from its
environment and exports them as metrics, the operator reads them back from
the trainer's endpoint, and the bundle's dashboard and alerts query them
(tests check the bundle against :func:`exposed_series`). A rename is one edit
here; a name typed anywhere else is a bug.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Final, Literal

# --- our API group -----------------------------------------------------------

GROUP = "training.fsdp.dev"
VERSION = "v1alpha1"
# Final and spelled out, not f"{GROUP}/{VERSION}": type checkers then read both as the Literals that
# FSDPTraining's apiVersion and kind declare.
API_VERSION: Final = "training.fsdp.dev/v1alpha1"
assert f"{GROUP}/{VERSION}" == API_VERSION
KIND: Final = "FSDPTraining"
PLURAL = "fsdptrainings"

# --- Kubeflow training operator v1 (pkg/apis/kubeflow.org/v1/pytorch_types.go) -

KUBEFLOW_GROUP = "kubeflow.org"
KUBEFLOW_VERSION = "v1"
PYTORCHJOB_API_VERSION = f"{KUBEFLOW_GROUP}/{KUBEFLOW_VERSION}"
PYTORCHJOB_KIND = "PyTorchJob"
PYTORCHJOB_PLURAL = "pytorchjobs"
# The webhook requires a container with this name, and the controller reads
# the rendezvous/master port from the container port with this name.
PYTORCHJOB_CONTAINER = "pytorch"
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
# Our jobs have one replica type (see operator/fsdp_operator/backends/pytorchjob.py for why no Master).
WORKER_REPLICA = "Worker"
# Labels the training operator sets on every replica pod.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"

# --- Kubeflow Trainer v2 (github.com/kubeflow/trainer/v2 v2.3.0, pkg/apis/trainer/v1alpha1) -

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
TRAINJOB_API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
TRAINJOB_KIND = "TrainJob"
TRAINJOB_PLURAL = "trainjobs"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"
# The ClusterTrainingRuntime the bundle ships and every TrainJob of ours references.
TRAINJOB_RUNTIME = "fsdp-torchrun"
# Trainer v2's fixed names (pkg/constants/constants.go): the trainer's replicated
# job and container are both "node", and the runtime marks that replicated job
# as the trainer step with the ancestor label.
TRAINJOB_NODE = "node"
TRAINJOB_ANCESTOR_LABEL = f"{TRAINER_GROUP}/trainjob-ancestor-step"
TRAINJOB_ANCESTOR_TRAINER = "trainer"
# Owner of our entry in a TrainJob's spec.runtimePatches (a domain-prefixed path).
TRAINJOB_PATCH_MANAGER = f"{GROUP}/fsdp-operator"
# Labels JobSet and the Job controller set on every pod of a TrainJob.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOB_COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# The Job controller sets this variable in each container of an Indexed Job's pods
# (JobSet's, so a TrainJob's): the pod's index, 0 for node 0.
JOB_COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"


@dataclass(frozen=True)
class JobBackend:
    """One kind of job an FSDPTraining can run as (spec.backend), and how its pods are found."""

    name: str  # the spec.backend value
    group: str
    version: str
    kind: str
    plural: str
    container: str  # the trainer container's name
    job_label: str  # pod label: the job's name
    index_label: str  # pod label: the pod's index (0 hosts the rendezvous; torchrun picks which holds node rank 0)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


PYTORCHJOB = JobBackend(
    "pytorchjob",
    KUBEFLOW_GROUP,
    KUBEFLOW_VERSION,
    PYTORCHJOB_KIND,
    PYTORCHJOB_PLURAL,
    PYTORCHJOB_CONTAINER,
    JOB_NAME_LABEL,
    REPLICA_INDEX_LABEL,
)
TRAINJOB = JobBackend(
    "trainjob",
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOB_KIND,
    TRAINJOB_PLURAL,
    TRAINJOB_NODE,
    JOBSET_NAME_LABEL,
    JOB_COMPLETION_INDEX_LABEL,
)
BACKENDS: dict[str, JobBackend] = {b.name: b for b in (PYTORCHJOB, TRAINJOB)}
JOB_KINDS: dict[str, JobBackend] = {b.kind: b for b in BACKENDS.values()}
TRAINER_CONTAINERS = frozenset(b.container for b in BACKENDS.values())

# --- Kueue (sigs.k8s.io/kueue v0.17.0, pkg/controller/constants/constants.go) ------

KUEUE_GROUP = "kueue.x-k8s.io"
# On a job: the LocalQueue (in the job's namespace) that admits it.
KUEUE_QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
# On a job: the WorkloadPriorityClass that orders and preempts its Workload.
KUEUE_PRIORITY_LABEL = f"{KUEUE_GROUP}/priority-class"
# Kueue's Workload of a job, owned by the job (v1beta2 is v0.17.0's storage version).
KUEUE_VERSION = "v1beta2"
WORKLOAD_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"
# On a queued job that Kueue's webhook let through unsuspended (its integration for the
# kind is off): the operator suspended it, so it does not run outside its queue.
KUEUE_HOLD_ANNOTATION = f"{GROUP}/held-for-kueue"
# The Admitted reason of such a training (controller/queueing.py).
NOT_MANAGED_BY_KUEUE = "NotManagedByKueue"
# On a pod template: Kueue's topology-aware scheduling places all the PodSet's pods in one
# domain of this node label (required) or as close to one as it can (preferred)
# (apis/kueue/v1beta2/topology_types.go, v0.17.0).
KUEUE_REQUIRED_TOPOLOGY_ANNOTATION = f"{KUEUE_GROUP}/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY_ANNOTATION = f"{KUEUE_GROUP}/podset-preferred-topology"
# Short names of spec.scheduling.topology.level. EKS labels each node with its place in
# the AWS network, layer 1 the broadest; layer 4 exists only on instance types with four
# layers (docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html).
EKS_NETWORK_LAYER_LABEL = "topology.k8s.aws/network-node-layer-{}"
# The node label whose every value is one node.
HOSTNAME_LABEL = "kubernetes.io/hostname"
TOPOLOGY_LEVELS: dict[str, str] = {
    **{f"network-layer-{n}": EKS_NETWORK_LAYER_LABEL.format(n) for n in (1, 2, 3, 4)},
    "zone": "topology.kubernetes.io/zone",
    "hostname": HOSTNAME_LABEL,
}

# --- suspect nodes (spec.health) ---------------------------------------------------
# The taint that keeps trainings off a node the operator excluded (onSuspectNode: exclude),
# with NoSchedule: running pods of others stay. Training pods never tolerate it (pod.tolerations
# with operator Exists and no key would, docs/operator.md).
EXCLUDED_NODE_TAINT = f"{GROUP}/excluded"
# The same key as a label ("true") on the node: the operator finds the excluded nodes with one small LIST.
EXCLUDED_NODE_LABEL = EXCLUDED_NODE_TAINT
# On the node: when the operator lifts the taint (RFC 3339), and which training excluded it and why.
EXCLUDED_UNTIL_ANNOTATION = f"{GROUP}/excluded-until"
EXCLUDED_BY_ANNOTATION = f"{GROUP}/excluded-by"

# --- Prometheus operator ---------------------------------------------------------

MONITORING_API_VERSION = "monitoring.coreos.com/v1"
PODMONITOR_KIND = "PodMonitor"
PODMONITOR_PLURAL = "podmonitors"

# --- NetworkPolicy around a job's pods ---------------------------------------------

NETWORKPOLICY_API_VERSION = "networking.k8s.io/v1"
NETWORKPOLICY_KIND = "NetworkPolicy"
NETWORKPOLICY_PLURAL = "networkpolicies"
# The control plane labels every namespace with its own name (immutable; the
# NamespaceDefaultLabelName feature, GA in Kubernetes 1.22): a NetworkPolicy can
# name namespaces only through a label, and this one cannot be forged.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# --- the trainer's process contract -------------------------------------------------

# What torchrun starts (``-m``) and how it is told where its config is.
TRAINER_MODULE = "fsdp_trainer"
CONFIG_FLAG = "--config"
# Before torchrun, the container runs ``python -m fsdp_trainer check``: a bad
# config ends there with CONFIG_ERROR_EXIT_CODE and only its error lines (the
# container's termination message), instead of a traceback from every rank.
CHECK_COMMAND = "check"
CONFIG_ERROR_EXIT_CODE = 2
# The line before a config error's ``field: message`` lines (each indented two spaces).
CONFIG_ERROR_HEADER = "invalid trainer configuration:"
# A rank whose step outlives spec.stall.trainerStepTimeoutSeconds writes all
# threads' stacks to <checkpoint dir>/STALLS_DIR/ and exits with this code.
STALL_EXIT_CODE = 3
STALLS_DIR = "stalls"
# What a launcher passes on to the training it runs: the container runtime's
# SIGTERM, a terminal's SIGINT (Ctrl-C) and SIGHUP (closed). The pods'
# supervising check and ``fsdp-operator run-local`` forward the same ones.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def signal_exit_code(signum: int) -> int:
    """What a process a signal stopped exits with: 128 + its number (the shell's convention; Kubernetes too)."""
    return 128 + signum


# A training that saved the checkpoint of its step and stopped on SIGTERM exits
# 143: terminated, not finished, so the job never counts as succeeded.
STOPPED_EXIT_CODE = signal_exit_code(signal.SIGTERM)

# The job's ConfigMap is mounted at CONFIG_DIR; its one key is the trainer config.
CONFIG_DIR = "/etc/fsdp"
CONFIG_KEY = "train.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
# The root filesystem is read-only: caches go to an emptyDir on HOME.
HOME_DIR = "/home/trainer"
HF_HOME = f"{HOME_DIR}/.cache/huggingface"
TMP_DIR = "/tmp"
SHM_DIR = "/dev/shm"
# Everything the trainer pod mounts besides the checkpoint volume: the
# checkpoint directory may be none of these, nor a parent of one.
POD_MOUNTS = (CONFIG_DIR, SHM_DIR, TMP_DIR, HOME_DIR)
# torchrun's own default c10d port, so a job reads like the PyTorch docs.
RDZV_PORT = 29400
# The trainer's metrics port unless spec.metrics.port says otherwise (the
# ClusterTrainingRuntime of backend: trainjob declares this one).
METRICS_PORT = 9402
# A checkpoint directory counts only once this file exists in it (written last).
CHECKPOINT_COMPLETE_MARKER = "COMPLETE"
CHECKPOINT_DIR_PREFIX = "step-"
# TensorBoard's event files, under checkpoint.dir (spec.tracking.tensorboard).
TENSORBOARD_SUBDIR = "tensorboard"
# The MLflow run a training logs to, kept under checkpoint.dir so every process of
# the training continues it (spec.tracking.mlflow).
MLFLOW_RUN_FILE = "mlflow-run.json"
# spec.tracking.wandb: the run's id, kept the same way, and the folder W&B writes its
# run files to (offline, the whole run until `wandb sync`).
WANDB_RUN_FILE = "wandb-run.json"
WANDB_SUBDIR = "wandb"

# Environment variables: set by the renderer (pods) or the local launcher,
# read by the trainer.
ENV_JOB_NAME = "FSDP_JOB_NAME"
ENV_JOB_NAMESPACE = "FSDP_JOB_NAMESPACE"
ENV_CONFIG = "FSDP_CONFIG"
# Where checkpoints go (checkpoint.dir, the checkpoint volume): the built-in
# trainer reads its config instead; a script of your own (spec.command) reads this.
ENV_CHECKPOINT_DIR = "FSDP_CHECKPOINT_DIR"
ENV_METRICS_PORT = "FSDP_METRICS_PORT"
# Local runs: serve metrics on loopback only, and keep the per-rank files in a
# private directory instead of the shared temp dir.
ENV_METRICS_ADDR = "FSDP_METRICS_ADDR"
ENV_METRICS_DIR = "FSDP_METRICS_DIR"
# Keep serving the final figures this long after a completed run (the
# operator's last read and Prometheus' last scrape get the end state).
ENV_METRICS_LINGER_SECONDS = "FSDP_METRICS_LINGER_SECONDS"
# Dense peak TFLOP/s of the device when the trainer's table does not know it.
ENV_PEAK_TFLOPS = "FSDP_PEAK_TFLOPS"
# Fault injection for the fault tests (never set in production).
ENV_TRAINER_FAULT = "FSDP_TRAINER_FAULT"
# torchrun's variables the renderer sets: its SIGTERM save window, and a
# rendezvous store per round (render/env.py says why).
ENV_SHUTDOWN_TIMEOUT = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
ENV_SEPARATE_RDZV_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# The pod's own address (downward API, status.podIP): where node 0 hosts the
# rendezvous when its rendezvous name is not its hostname (fsdp_trainer/check.py).
ENV_POD_IP = "FSDP_POD_IP"
# The FSDPTraining's metadata.uid and spec.image, which trackers tag the run with.
# Set only where the operator renders what it applies: an offline render has no
# uid, and the overlay's `images:` knob rewrites the image after the render.
ENV_TRAINING_UID = "FSDP_TRAINING_UID"
ENV_TRAINING_IMAGE = "FSDP_TRAINING_IMAGE"
# Kubeflow Trainer v2.3's TrainJobStatus plugin (alpha gate TrainJobStatus) gives a
# TrainJob's trainer containers its status server's URL and the paths of its CA and of
# a projected token (pkg/runtime/framework/plugins/trainjobstatus); rank 0 posts the
# progress there, which the server writes to TrainJob.status.trainerStatus.
ENV_KUBEFLOW_STATUS_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_KUBEFLOW_STATUS_CA = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_KUBEFLOW_STATUS_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
# W&B's own variable for its API key (wandb/env.py), from spec.tracking.wandb.apiKeySecret.
ENV_WANDB_API_KEY = "WANDB_API_KEY"
# What spec.env may not set: each variable the operator derives, and the
# field it derives it from (a user value would silently replace it).
OPERATOR_ENV: dict[str, str] = {
    ENV_JOB_NAME: "metadata.name",
    ENV_JOB_NAMESPACE: "metadata.namespace",
    ENV_CONFIG: "the spec's trainer sections",
    ENV_CHECKPOINT_DIR: "checkpoint.dir",
    ENV_METRICS_PORT: "metrics.port",
    ENV_SHUTDOWN_TIMEOUT: "pod.terminationGracePeriodSeconds",
    ENV_SEPARATE_RDZV_STORE: "always 1, or a restarted pod cannot rendezvous",
    ENV_POD_IP: "the pod's status.podIP",
    ENV_TRAINING_UID: "the FSDPTraining's metadata.uid",
    ENV_TRAINING_IMAGE: "image",
}

# --- the trainer's metrics ---------------------------------------------------------

# Every trainer series carries these labels; GPU series add ``gpu``.
LABEL_JOB_NAME = "job_name"
LABEL_NODE_RANK = "node_rank"
LABEL_LOCAL_RANK = "local_rank"
LABEL_GPU = "gpu"
LABEL_MODEL = "model"
LABEL_SHARDING_STRATEGY = "sharding_strategy"
LABEL_PRECISION = "precision"
LABEL_WORLD_SIZE = "world_size"
LABEL_LOGITS = "logits"  # the loss computation that ran: chunked or full (training.logits, or its fallback)
LABEL_TENSOR_PARALLEL = "tensor_parallel"  # parallelism.tensor: the ranks that split each layer
LABEL_CONTEXT_PARALLEL = "context_parallel"  # parallelism.context: the ranks that split each row
LABEL_EXPERT_PARALLEL = "expert_parallel"  # parallelism.expert: the ranks that split each layer's experts
LABEL_PIPELINE_PARALLEL = "pipeline_parallel"  # parallelism.pipeline: the stages the layers are split into
RANK_LABELS = (LABEL_JOB_NAME, LABEL_NODE_RANK, LABEL_LOCAL_RANK)
INFO_LABELS = (
    *RANK_LABELS,
    LABEL_MODEL,
    LABEL_SHARDING_STRATEGY,
    LABEL_PRECISION,
    LABEL_WORLD_SIZE,
    LABEL_LOGITS,
    LABEL_TENSOR_PARALLEL,
    LABEL_CONTEXT_PARALLEL,
    LABEL_EXPERT_PARALLEL,
    LABEL_PIPELINE_PARALLEL,
)
# The experiment tracker's name (a spec.tracking field) and the address of the run rank 0 logs to.
LABEL_TRACKER = "tracker"
LABEL_RUN_URL = "url"
TRACKER_RUN_LABELS = (*RANK_LABELS, LABEL_TRACKER, LABEL_RUN_URL)
GPU_LABELS = (*RANK_LABELS, LABEL_GPU)
# A mixture-of-experts layer's number in the model (its router's module path: model.layers.<layer>...).
LABEL_MOE_LAYER = "layer"
MOE_LAYER_LABELS = (*RANK_LABELS, LABEL_MOE_LAYER)


def rank_label_values(job_name: str, node_rank: int, local_rank: int) -> dict[str, str]:
    """The values of RANK_LABELS for one rank's series (the trainer's and a script's alike)."""
    return {LABEL_JOB_NAME: job_name, LABEL_NODE_RANK: str(node_rank), LABEL_LOCAL_RANK: str(local_rank)}


MetricType = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True)
class Metric:
    """One trainer metric: its name as created, type and help text."""

    name: str
    type: MetricType
    help: str
    gpu_only: bool = False

    def series(self) -> tuple[str, ...]:
        """The names it appears under in the text exposition."""
        if self.type == "counter":
            return (f"{self.name}_total",)
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


TRAINER_INFO = Metric("fsdp_trainer_info", "gauge", "Static facts about the job; always 1.")
STEP = Metric("fsdp_train_step", "gauge", "Last completed optimizer step.")
MAX_STEPS = Metric("fsdp_train_max_steps", "gauge", "Optimizer steps the job trains for.")
LOSS = Metric("fsdp_train_loss", "gauge", "Training loss of the last step, averaged over all ranks.")
LEARNING_RATE = Metric("fsdp_train_learning_rate", "gauge", "Learning rate of the last step.")
GRAD_NORM = Metric("fsdp_train_grad_norm", "gauge", "Global gradient norm of the last step, before clipping.")
TOKENS = Metric("fsdp_train_tokens", "counter", "Tokens processed by this rank.")
TRAINED_TOKENS = Metric(
    "fsdp_train_trained_tokens", "counter", "Tokens in the loss (not masked prompt or padding) of this rank."
)
TOKENS_PER_SECOND = Metric(
    "fsdp_train_tokens_per_second", "gauge", "Tokens per second of this rank (device), recent steps."
)
GLOBAL_TOKENS_PER_SECOND = Metric(
    "fsdp_train_global_tokens_per_second", "gauge", "Tokens per second of the whole job, recent steps."
)
TFLOPS = Metric("fsdp_train_tflops", "gauge", "Achieved model TFLOP/s per device, recent steps.")
MFU = Metric("fsdp_train_mfu_ratio", "gauge", "Model FLOPs utilisation (0..1); absent when the peak is unknown.")
MFU_FLOAT8 = Metric(
    "fsdp_train_mfu_float8_ratio",
    "gauge",
    "MFU against the device's dense float8 peak (precision float8 only); fsdp_train_mfu_ratio is against bf16.",
)
PEAK_TFLOPS = Metric(
    "fsdp_train_peak_tflops", "gauge", "Dense peak TFLOP/s of the device for the training dtype; 0 when unknown."
)
STEP_DURATION = Metric(
    "fsdp_train_step_duration_seconds", "histogram", "Wall time of one optimizer step, data loading included."
)
DATA_WAIT = Metric("fsdp_train_data_wait_seconds", "counter", "Time this rank waited for input batches.")
# The straggler signal: at each step's start every rank waits for the last one to arrive.
RANK_WAIT = Metric(
    "fsdp_train_rank_wait_seconds", "counter", "Time this rank waited at step starts for the last rank to arrive."
)
PEER_WAIT_STARTED = Metric(
    "fsdp_train_peer_wait_started_timestamp_seconds",
    "gauge",
    "Unix time this rank began to wait for the others at a step's start; 0 when it is not waiting.",
)
RANK_LATENESS = Metric(
    "fsdp_train_rank_lateness_seconds",
    "counter",
    "How much later than the first rank this rank arrived at step starts, summed over steps (the time its peers "
    "waited for it).",
)
MEMORY_PEAK = Metric(
    "fsdp_train_memory_peak_bytes", "gauge", "Peak memory: CUDA max allocated on GPU, process peak RSS on CPU."
)
MEMORY_RESERVED = Metric(
    "fsdp_train_memory_reserved_bytes", "gauge", "Reserved memory: CUDA max reserved on GPU, current RSS on CPU."
)
# training.objective dpo and simpo: means over the last step's pairs (docs/preference.md).
REWARD_CHOSEN = Metric(
    "fsdp_train_reward_chosen",
    "gauge",
    "Mean reward of the chosen answers, last step (dpo: beta x log-ratio to the reference; simpo: beta x mean "
    "log-prob).",
)
REWARD_REJECTED = Metric("fsdp_train_reward_rejected", "gauge", "Mean reward of the rejected answers, last step.")
REWARD_MARGIN = Metric("fsdp_train_reward_margin", "gauge", "Mean reward of chosen minus rejected, last step.")
PREFERENCE_ACCURACY = Metric(
    "fsdp_train_preference_accuracy_ratio",
    "gauge",
    "Share of the last step's pairs whose chosen answer got the higher reward (0..1).",
)
# A mixture-of-experts model: each MoE layer's expert load over every rank's tokens of the last step
# (label ``layer``; served by each node's local rank 0; docs/metrics.md, "Router health").
MOE_EXPERT_LOAD_MAX = Metric(
    "fsdp_moe_expert_load_max_ratio",
    "gauge",
    "Tokens of the layer's most-loaded expert over the mean per expert, last step (1: even).",
)
MOE_EXPERT_LOAD_MIN = Metric(
    "fsdp_moe_expert_load_min_ratio",
    "gauge",
    "Tokens of the layer's least-loaded expert over the mean per expert, last step (1: even; 0: one got none).",
)
MOE_EXPERTS_UNUSED = Metric(
    "fsdp_moe_experts_unused_ratio", "gauge", "Share of the layer's experts that got no token in the last step."
)
MOE_ROUTER_AUX_LOSS = Metric(
    "fsdp_moe_router_aux_loss",
    "gauge",
    "The layer router's load-balancing loss (Switch Transformer's, as transformers computes it), last step; "
    "top_k when even.",
)
MOE_LAYER_METRICS = (MOE_EXPERT_LOAD_MAX, MOE_EXPERT_LOAD_MIN, MOE_EXPERTS_UNUSED, MOE_ROUTER_AUX_LOSS)
# A layer whose router left more than this share of its experts without a token is collapsed:
# the FSDPTrainingRouterCollapsed alert's threshold and status.router.collapsed.
ROUTER_COLLAPSED_UNUSED_RATIO = 0.5
EVAL_LOSS = Metric("fsdp_train_eval_loss", "gauge", "Loss of the last validation run.")
EVAL_PERPLEXITY = Metric("fsdp_train_eval_perplexity", "gauge", "Perplexity (exp of loss) of the last validation.")
CHECKPOINT_SAVE_DURATION = Metric(
    "fsdp_checkpoint_save_duration_seconds", "histogram", "Time the train loop was blocked saving a checkpoint."
)
CHECKPOINT_LOAD_DURATION = Metric("fsdp_checkpoint_load_duration_seconds", "gauge", "Time the resume load took.")
CHECKPOINT_SKIPPED = Metric(
    "fsdp_checkpoint_skipped", "counter", "Checkpoints that could not be loaded at resume and were set aside."
)
CHECKPOINT_LAST_STEP = Metric("fsdp_checkpoint_last_step", "gauge", "Step of the newest checkpoint saved or loaded.")
CHECKPOINT_LAST_SAVE = Metric(
    "fsdp_checkpoint_last_save_timestamp_seconds", "gauge", "Unix time of the last checkpoint save."
)
CHECKPOINT_SIZE = Metric(
    "fsdp_checkpoint_size_bytes", "gauge", "Bytes on disk of the newest complete checkpoint (rank 0 only)."
)
CHECKPOINT_REMOTE_LAST_STEP = Metric(
    "fsdp_checkpoint_remote_last_step",
    "gauge",
    "Step of the newest checkpoint committed to checkpoint.remote (its manifest written; rank 0 only).",
)
CHECKPOINT_REMOTE_LAG = Metric(
    "fsdp_checkpoint_remote_lag_steps",
    "gauge",
    "Steps between the newest local checkpoint and the newest one committed to checkpoint.remote (rank 0 only).",
)
CHECKPOINT_UPLOAD_FAILURES = Metric(
    "fsdp_checkpoint_upload_failures", "counter", "Failed attempts to upload to checkpoint.remote (each is retried)."
)
CHECKPOINT_UPLOADED_BYTES = Metric(
    "fsdp_checkpoint_uploaded_bytes", "counter", "Bytes of checkpoint files this rank uploaded to checkpoint.remote."
)
MODEL_PARAMETERS = Metric("fsdp_model_parameters", "gauge", "Parameters of the model, tied ones once.")
MODEL_TRAINABLE_PARAMETERS = Metric(
    "fsdp_model_trainable_parameters", "gauge", "Parameters the optimizer updates (with LoRA: the adapters)."
)
LAST_STEP_TIMESTAMP = Metric(
    "fsdp_train_last_step_timestamp_seconds", "gauge", "Unix time the last optimizer step completed."
)
RESTART_COUNT = Metric("fsdp_train_restart_count", "gauge", "Worker-group restarts by torchrun so far.")
# A value, not an info label: the mode is known only after the first forward, and a
# multiprocess exposition keeps a label set it once wrote.
COMPILED = Metric(
    "fsdp_train_compiled",
    "gauge",
    "1: the decoder layers run compiled by inductor; 0: eager (training.compile off, or inductor failed).",
)
# training.precision float8: what converted, counted once at start (the log names each kept layer and why).
FLOAT8_LINEARS = Metric(
    "fsdp_train_float8_linear_layers",
    "gauge",
    "Linear layers whose matmuls run in float8 (training.precision float8; 0 otherwise).",
)
FLOAT8_KEPT_LINEARS = Metric(
    "fsdp_train_float8_kept_linear_layers",
    "gauge",
    "Linear layers float8 leaves in bf16: output head, routers, LoRA adapters, dimensions not divisible by 16.",
)
TRACKER_POINTS_DROPPED = Metric(
    "fsdp_tracker_points_dropped",
    "counter",
    "Points not logged to an experiment tracker (spec.tracking): its writer fell behind or failed.",
)
TRACKER_RUN = Metric(
    "fsdp_tracker_run_info",
    "gauge",
    "The experiment tracker run rank 0 logs to (labels tracker and url), once it is open; always 1.",
)
GPU_UTILIZATION = Metric("fsdp_gpu_utilization_ratio", "gauge", "GPU busy ratio (NVML), 0..1.", gpu_only=True)
GPU_MEMORY_USED = Metric("fsdp_gpu_memory_used_bytes", "gauge", "GPU memory in use (NVML).", gpu_only=True)
GPU_MEMORY_TOTAL = Metric("fsdp_gpu_memory_total_bytes", "gauge", "GPU memory size (NVML).", gpu_only=True)
GPU_POWER = Metric("fsdp_gpu_power_watts", "gauge", "GPU power draw (NVML).", gpu_only=True)
GPU_TEMPERATURE = Metric("fsdp_gpu_temperature_celsius", "gauge", "GPU temperature (NVML).", gpu_only=True)

TRAINER_METRICS: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))


def exposed_series(*, gpu: bool | None = None) -> frozenset[str]:
    """Series names in the trainer's exposition; ``gpu``: only GPU-only (True) or only the rest (False)."""
    return frozenset(name for m in TRAINER_METRICS if gpu is None or m.gpu_only == gpu for name in m.series())


# dcgm-exporter fields the bundle's dashboard and alerts read (its
# default-counters.csv, plus the profiling field for tensor-core activity
# from dcp-metrics-included.csv).
# The last XID a GPU reported (never resets): the alert and the operator read its changes.
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
DCGM_METRICS = frozenset(
    {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        DCGM_XID_ERRORS,
        "DCGM_FI_DEV_GPU_TEMP",
    }
)

# What the bundle's queries may name: every trainer series, and the subset
# that only a GPU node produces (a CPU test run cannot show those).
# The operator's own series the bundle's dashboard reads (controller/metrics.py has the rest):
# the nodes a training excluded (spec.health.onSuspectNode exclude), labelled like a trainer series.
OPERATOR_NODE_EXCLUSIONS = "fsdp_operator_node_exclusions"
OPERATOR_SERIES = frozenset({f"{OPERATOR_NODE_EXCLUSIONS}_total"})

GPU_SERIES = exposed_series(gpu=True) | DCGM_METRICS
ALL_SERIES = exposed_series() | DCGM_METRICS | OPERATOR_SERIES
