"""How much device memory the KV cache gets: a profile run and vLLM's budget.

    kv_cache_bytes = gpu_memory_utilization * total
                     - resident          (torch memory before the profile run: weights, buffers)
                     - peak_activations  (what the profile forward added at its peak)
                     - graphs            (the decode CUDA graphs: Worker._graph_memory captures
                                          them once in a throw-away runner and measures used())
                     - outside_torch     (the CUDA context, other processes on the device)

The worker runs one dummy step of `max_num_batched_tokens` tokens (the largest step the
scheduler will ever send) between `reset_peak()` and `peak_allocated()` of a `DeviceMemory`.
`CudaMemory` reads torch.cuda's allocator statistics; tests give the worker a fake one, so the
budget and the profile run are exercised on a CPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch


class DeviceMemory(ABC):
    """What the profile reads from a device's allocator (bytes)."""

    @abstractmethod
    def total(self) -> int:
        """The device's memory."""

    @abstractmethod
    def allocated(self) -> int:
        """Held by torch tensors now."""

    @abstractmethod
    def reset_peak(self) -> None:
        """Start a new peak measurement."""

    @abstractmethod
    def peak_allocated(self) -> int:
        """The most held by torch tensors since `reset_peak`."""

    @abstractmethod
    def outside_torch(self) -> int:
        """Used on the device but not by torch's allocator (context, other processes)."""

    def synchronize(self) -> None:
        """Wait for the device's queued work (what a peak must include); nothing by default."""
        return None

    def used(self) -> int:
        """The device's memory in use now, by anyone (torch's cached free blocks released
        first): what capturing CUDA graphs adds to it is their cost."""
        return self.allocated() + self.outside_torch()


class CudaMemory(DeviceMemory):
    """torch.cuda's allocator statistics for one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def total(self) -> int:
        return torch.cuda.mem_get_info(self.device)[1]

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def outside_torch(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return max(total - free - torch.cuda.memory_reserved(self.device), 0)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def used(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free


@dataclass(frozen=True)
class MemoryProfile:
    """The terms of the KV budget (bytes), measured by `profile_memory`."""

    total: int
    resident: int
    peak_activations: int
    outside_torch: int
    graphs: int = 0

    def kv_cache_bytes(self, utilization: float) -> int:
        return int(self.total * utilization - self.resident - self.peak_activations
                   - self.graphs - self.outside_torch)

    def describe(self, utilization: float) -> str:
        gib = 2**30
        return (f"{utilization} x {self.total / gib:.2f} GiB - resident {self.resident / gib:.2f}"
                f" - activations {self.peak_activations / gib:.2f} - graphs "
                f"{self.graphs / gib:.2f} - outside torch {self.outside_torch / gib:.2f} GiB")


def profile_memory(memory: DeviceMemory, run_forward: Callable[[], None],
                   graphs: int = 0) -> MemoryProfile:
    """Run the profile forward between a peak reset and its reading; the budget's terms."""
    memory.synchronize()
    resident = memory.allocated()
    memory.reset_peak()
    run_forward()
    memory.synchronize()
    peak = max(memory.peak_allocated() - resident, 0)
    return MemoryProfile(memory.total(), resident, peak, memory.outside_torch(), graphs)
