"""How many KV blocks a cache gets: an explicit count, or a memory budget (plain Python: the
real workers and the simulator size their caches with the same rules)."""

from __future__ import annotations

import os
from typing import Protocol

from lab.core.model_info import max_positions


class CacheSizing(Protocol):
    """How the number of KV blocks is chosen: an explicit count, or a memory budget (the knobs
    num_gpu_blocks, gpu_memory_utilization, cpu_kv_cache_gb and cpu_kv_cache_requests:
    EngineKnobs has them)."""

    num_gpu_blocks: int | None
    gpu_memory_utilization: float
    cpu_kv_cache_gb: float | None  # None: from memory (cpu_kv_bytes)
    cpu_kv_cache_requests: int | None  # None: max_num_seqs
    max_num_seqs: int


def available_memory_bytes() -> int:
    """Memory the OS can give this process now without swapping (Linux's MemAvailable; the
    physical total elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_kv_bytes(sizing: CacheSizing, hf_config, block_size: int, bytes_per_block: int,
                 available: int | None = None) -> int:
    """KV-cache bytes on a CPU: `cpu_kv_cache_gb` GiB; null, as vLLM-CPU sizes its cache from
    memory: room for `cpu_kv_cache_requests` requests (null: max_num_seqs) of the model's whole
    context (max_position_embeddings tokens each, + the null block), at most
    gpu_memory_utilization of the memory available now (`available`: that memory, None: the
    OS's MemAvailable; the weights are loaded already, so they are not in it). A cache larger
    than max_num_seqs full contexts would never be used; one of a single request's context is
    what `python run.py`'s demonstration asks for, so its workload preempts. The real CPU
    worker and the simulator (`executor=sim sim.device=cpu`) both size their cache with it."""
    if sizing.cpu_kv_cache_gb is not None:
        return int(sizing.cpu_kv_cache_gb * 2**30)
    requests = sizing.cpu_kv_cache_requests or sizing.max_num_seqs
    blocks = requests * -(-max_positions(hf_config) // block_size) + 1
    free = available_memory_bytes() if available is None else available
    return min(blocks * bytes_per_block, int(free * sizing.gpu_memory_utilization))
