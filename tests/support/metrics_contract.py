"""The trainer's metric names from the shared contract, and which ones a CPU run can produce.

Dashboards and alerts may only read these (plus dcgm-exporter's DCGM_*), so a
typo in a query fails a test instead of drawing an empty panel in production.
"""

from __future__ import annotations

# Every series of these carries job_name, node_rank and local_rank.
TRAINER_METRICS = frozenset(
    {
        "fsdp_trainer_info",
        "fsdp_train_step",
        "fsdp_train_max_steps",
        "fsdp_train_loss",
        "fsdp_train_learning_rate",
        "fsdp_train_grad_norm",
        "fsdp_train_tokens_total",
        "fsdp_train_tokens_per_second",
        "fsdp_train_global_tokens_per_second",
        "fsdp_train_tflops",
        "fsdp_train_mfu_ratio",
        "fsdp_train_peak_tflops",
        "fsdp_train_step_duration_seconds_bucket",
        "fsdp_train_step_duration_seconds_sum",
        "fsdp_train_step_duration_seconds_count",
        "fsdp_train_data_wait_seconds_total",
        "fsdp_train_memory_peak_bytes",
        "fsdp_train_memory_reserved_bytes",
        "fsdp_train_eval_loss",
        "fsdp_train_eval_perplexity",
        "fsdp_checkpoint_save_duration_seconds_bucket",
        "fsdp_checkpoint_save_duration_seconds_sum",
        "fsdp_checkpoint_save_duration_seconds_count",
        "fsdp_checkpoint_load_duration_seconds",
        "fsdp_checkpoint_last_step",
        "fsdp_checkpoint_last_save_timestamp_seconds",
        "fsdp_train_last_step_timestamp_seconds",
        "fsdp_train_restart_count",
    }
)

# NVML metrics: exported by the trainer only when a GPU is present.
NVML_METRICS = frozenset(
    {
        "fsdp_gpu_utilization_ratio",
        "fsdp_gpu_memory_used_bytes",
        "fsdp_gpu_memory_total_bytes",
        "fsdp_gpu_power_watts",
        "fsdp_gpu_temperature_celsius",
    }
)

# dcgm-exporter fields the bundle reads (default-counters.csv, plus the DCP
# profiling field for tensor-core activity from dcp-metrics-included.csv).
DCGM_METRICS = frozenset(
    {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_GPU_TEMP",
    }
)

GPU_ONLY = NVML_METRICS | DCGM_METRICS
KNOWN = TRAINER_METRICS | GPU_ONLY
