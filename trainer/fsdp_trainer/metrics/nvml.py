"""GPU utilisation, memory, power and temperature of this rank's GPU, via NVML.

On a CPU run, or where the NVML library is missing (a container without the
driver mounted), ``GpuSampler.open`` returns None and the ``fsdp_gpu_*``
metrics are simply never created: no error, no zero-valued series that would
look like an idle GPU on a dashboard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSample:
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    temperature_celsius: float


class GpuSampler:
    """Reads one GPU's counters; ``gpu`` is NVML's (physical) index, as dcgm-exporter labels it."""

    def __init__(self, nvml: Any, handle: Any, gpu: int, name: str) -> None:
        self._nvml = nvml
        self._handle = handle
        self.gpu = gpu
        self.name = name

    @classmethod
    def open(cls, device: torch.device) -> GpuSampler | None:
        if device.type != "cuda":
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = cls._handle_for(pynvml, device)
            gpu = int(pynvml.nvmlDeviceGetIndex(handle))
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception as e:  # NVML missing or too old: metrics are optional, training is not.
            log.warning("NVML unavailable, fsdp_gpu_* metrics disabled: %s", e)
            return None
        return cls(pynvml, handle, gpu, name if isinstance(name, str) else name.decode())

    @staticmethod
    def _handle_for(pynvml: Any, device: torch.device) -> Any:
        # CUDA indices are renumbered by CUDA_VISIBLE_DEVICES (one GPU per
        # container often shows up as cuda:0); the UUID names the physical GPU.
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except pynvml.NVMLError:
                pass
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> GpuSample | None:
        nvml = self._nvml
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(self._handle)
            power_mw = nvml.nvmlDeviceGetPowerUsage(self._handle)
            temp = nvml.nvmlDeviceGetTemperature(self._handle, nvml.NVML_TEMPERATURE_GPU)
        except nvml.NVMLError as e:
            log.debug("NVML sample failed: %s", e)
            return None
        return GpuSample(
            utilization_ratio=util.gpu / 100.0,
            memory_used_bytes=int(mem.used),
            memory_total_bytes=int(mem.total),
            power_watts=power_mw / 1000.0,
            temperature_celsius=float(temp),
        )

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown failed: %s", e)
