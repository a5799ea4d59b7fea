"""BlockSwapper: the worker's CPU swap space and the copies a SchedulerOutput asks for.

Per layer a CPU tensor of `num_blocks` blocks in the device cache's layout (pinned on CUDA, so
the copies are DMA transfers). The scheduler decides which blocks move (lab/cache/swap.py); this
class only moves them, all swap-outs before all swap-ins, before the step's forward pass:

    swap out:  device cache --copy_blocks--> staging [n blocks] (device) --one D2H--> host
               --index_copy--> CPU swap tensor
    swap in:   CPU swap tensor --index_select--> host [n blocks] --one H2D--> staging (device)
               --copy_blocks--> device cache

`copy_blocks` is the kernels group's implementation (Triton on CUDA, the PyTorch reference on
CPU), so gathering scattered device blocks costs one launch per layer and direction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lab.attention.base import KVCacheSpec

CopyBlocks = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], None]


class BlockSwapper:
    """Moves whole KV blocks between the device caches and their CPU swap tensors."""

    def __init__(
        self, device_caches: list[torch.Tensor], kv_spec: KVCacheSpec, num_blocks: int,
        copy_blocks: CopyBlocks,
    ) -> None:
        self.device_caches: list[torch.Tensor] = []
        self.cpu_caches: list[torch.Tensor] = []
        self.specs: list[KVCacheSpec] = []  # each cache's layout
        self.spec = kv_spec
        self.copy_blocks = copy_blocks
        self.device = device_caches[0].device if device_caches else torch.device("cpu")
        self.pinned = self.device.type == "cuda"
        self._num_blocks = num_blocks
        self.add_caches(device_caches, kv_spec)

    def add_caches(self, device_caches: list[torch.Tensor], kv_spec: KVCacheSpec) -> None:
        """Swap these caches' blocks too (another layout in the same blocks: a draft model's
        KV, lab/speculative/model_proposer.py)."""
        for cache in device_caches:
            self.device_caches.append(cache)
            self.cpu_caches.append(torch.empty(kv_spec.layer_shape(self._num_blocks),
                                               dtype=kv_spec.dtype, device="cpu",
                                               pin_memory=self.pinned))
            self.specs.append(kv_spec)

    @property
    def num_blocks(self) -> int:
        return self.cpu_caches[0].shape[self.spec.block_dim] if self.cpu_caches else 0

    def apply(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Every swap-out (device, cpu), then every swap-in (cpu, device)."""
        if swap_out:
            self.swap_out(swap_out)
        if swap_in:
            self.swap_in(swap_in)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        from lab.kernels.copy_blocks import as_bits  # imports triton: only when swapping

        dev_ids, cpu_ids = self._ids(pairs)
        staging_ids = torch.arange(len(pairs), device=self.device)
        for dev_cache, cpu_cache, spec in zip(self.device_caches, self.cpu_caches, self.specs):
            dim = spec.block_dim
            staging = dev_cache.new_empty(spec.layer_shape(len(pairs)))
            self.copy_blocks(dev_cache, staging, dev_ids, staging_ids, dim)
            as_bits(cpu_cache).index_copy_(dim, cpu_ids, as_bits(staging.cpu()))

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        from lab.kernels.copy_blocks import as_bits

        cpu_ids, dev_ids = self._ids(pairs)
        staging_ids = torch.arange(len(pairs), device=self.device)
        for dev_cache, cpu_cache, spec in zip(self.device_caches, self.cpu_caches, self.specs):
            dim = spec.block_dim
            host = as_bits(cpu_cache).index_select(dim, cpu_ids).view(cpu_cache.dtype)
            if self.pinned:
                host = host.pin_memory()
            staging = host.to(self.device, non_blocking=self.pinned)
            self.copy_blocks(staging, dev_cache, staging_ids, dev_ids, dim)

    def _ids(self, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(first ids, second ids) as CPU int64 tensors (copy_blocks moves its ids itself)."""
        first, second = zip(*pairs)
        return torch.tensor(first, dtype=torch.long), torch.tensor(second, dtype=torch.long)
