"""Meters for one benchmark process: memory (CPU resident set, CUDA allocator), NVML energy (FLOPs: utils.flops)."""

from __future__ import annotations

import os

import torch


def rss_bytes(pid: int | str = "self") -> int:
    """Current resident set of a process (Linux /proc), 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakMemory:
    """Peak memory of the code run inside ``with`` above the memory in use when it started.

    CUDA: torch.cuda.max_memory_allocated. CPU: the kernel's resident high-water mark (VmHWM, reset
    through /proc/self/clear_refs) minus the resident set at entry, i.e. what the work itself added.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0
        self.peak = 0  # bytes above baseline
        self.total = 0  # bytes including baseline

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # reset VmHWM to the current RSS
            except OSError:
                pass
            self.baseline = rss_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.total = torch.cuda.max_memory_allocated(self.device)
        else:
            self.total = max(_hwm_bytes(), rss_bytes())
        self.peak = max(0, self.total - self.baseline)


class EnergyMeter:
    """Cumulative GPU energy (joules) through nvidia-ml-py; ``reason`` says why it is unavailable."""

    def __init__(self, device: torch.device) -> None:
        self.handle = None
        self.reason = None
        if device.type != "cuda":
            self.reason = "energy counter needs a CUDA device"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                index = int(visible.split(",")[index])
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self._nvml = pynvml
        except Exception as err:  # noqa: BLE001 - any NVML failure just disables the meter
            self.handle = None
            self.reason = f"nvidia-ml-py energy counter unavailable: {type(err).__name__}: {err}"

    def joules(self) -> float | None:
        """Energy counter reading in joules, or None when unavailable."""
        if self.handle is None:
            return None
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
