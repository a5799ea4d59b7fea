"""How many KV blocks a cache gets: an explicit count, or a memory budget (plain Python: the
real workers and the simulator size their caches with the same rules)."""

from __future__ import annotations

from typing import Protocol

from lab.core.model_info import max_positions

CPU_AUTO_KV_CAP_GB = 1.0  # cpu_kv_cache_gb=null never takes more than this


class CacheSizing(Protocol):
    """How the number of KV blocks is chosen: an explicit count, or a memory budget (the knobs
    num_gpu_blocks, gpu_memory_utilization and cpu_kv_cache_gb: EngineKnobs has them)."""

    num_gpu_blocks: int | None
    gpu_memory_utilization: float
    cpu_kv_cache_gb: float | None  # None: room for one request of the model's context


def cpu_kv_bytes(
    cpu_kv_cache_gb: float | None, hf_config, block_size: int, bytes_per_block: int,
) -> int:
    """KV-cache bytes on a CPU: `cpu_kv_cache_gb` GiB; null: the smallest cache that admits any
    request the model takes (max_position_embeddings tokens + the null block), at most
    CPU_AUTO_KV_CAP_GB. The embedded tiny models (2048 positions) get 129 blocks of 16 tokens,
    so the default workload, whose requests together want more, preempts. The real CPU worker
    and the simulator (`executor=sim sim.device=cpu`) both size their cache with it."""
    if cpu_kv_cache_gb is not None:
        return int(cpu_kv_cache_gb * 2**30)
    blocks = -(-max_positions(hf_config) // block_size) + 1
    return min(blocks * bytes_per_block, int(CPU_AUTO_KV_CAP_GB * 2**30))
