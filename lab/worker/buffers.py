"""Host/device buffer pairs the model runner fills every step (vLLM's CpuGpuBuffer).

A `CpuGpuBuffer` is a host tensor with a numpy view (numpy writes it without a Python loop) and
its device twin, both allocated once. On CUDA the host tensor is pinned and `to_device(n)`
copies its first n entries with `non_blocking=True`; on a CPU the twin *is* the host tensor
(no copy; `share=False` keeps two tensors there, which is how tests run the copy path without
a GPU). The device tensors persist across steps, so the padded decode path
(lab/worker/cudagraph.py) uses their first rows as the static buffers of its CUDA graphs.

A non-blocking copy reads the pinned memory after the call returns, so the host side must not
be written again before the copy ran: the runner records a `CopyFence` after a step's copies
and waits on it before it writes the host buffers of the next step (a no-op on the CPU; on
CUDA it only waits when a step did not end with a synchronizing read already).
"""

from __future__ import annotations

import numpy as np
import torch


class CpuGpuBuffer:
    """A host tensor (pinned on CUDA), its numpy view `np`, and its device twin `gpu`."""

    def __init__(self, *shape: int, dtype: torch.dtype, device: torch.device,
                 pin: bool = False, share: bool | None = None, fill: float | int = 0) -> None:
        """`share`: use the host tensor as the device one (default: on a CPU device)."""
        self.cpu = torch.full(shape, fill, dtype=dtype, pin_memory=pin)
        self.np: np.ndarray = self.cpu.numpy()
        share = device.type == "cpu" if share is None else share
        self.gpu = self.cpu if share else torch.full(shape, fill, dtype=dtype, device=device)

    def to_device(self, n: int) -> torch.Tensor:
        """The first n entries (dim 0) on the device: copied from the host without blocking,
        or, for a shared buffer, a view of the host tensor."""
        if self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class CopyFence:
    """Waits, before host buffers are rewritten, for the non-blocking copies that read them."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event() if device.type == "cuda" else None
        self.pending = False

    def record(self) -> None:
        """After a step's copies were issued."""
        if self.event is not None:
            self.event.record()
            self.pending = True

    def wait(self) -> None:
        """Before the host buffers are written again."""
        if self.pending:
            self.event.synchronize()
            self.pending = False


class InputBuffers:
    """The step's input tensors, allocated once (max_num_tokens tokens, max_num_reqs requests,
    max_blocks blocks per request):

        input_ids, positions, slot_mapping   [max_num_tokens]   int64
        query_start_loc                      [max_num_reqs + 1] int32
        seq_lens, num_computed               [max_num_reqs]     int32
        block_table (flat: rows of `width`)  [max_num_reqs * max_blocks] int32
        logits_indices                       [max_num_reqs]     int64

    With several KV cache groups (lab/cache/groups.py), `block_tables` and `slot_mappings` hold
    one buffer per group (group 0's are `block_table` and `slot_mapping`).
    """

    def __init__(self, max_num_reqs: int, max_num_tokens: int, max_blocks: int,
                 device: torch.device, pin: bool = False, share: bool | None = None,
                 num_groups: int = 1) -> None:
        def buf(n: int, dtype: torch.dtype) -> CpuGpuBuffer:
            return CpuGpuBuffer(n, dtype=dtype, device=device, pin=pin, share=share)

        self.max_num_reqs, self.max_num_tokens, self.max_blocks = (
            max_num_reqs, max_num_tokens, max_blocks)
        self.input_ids = buf(max_num_tokens, torch.int64)
        self.positions = buf(max_num_tokens, torch.int64)
        self.slot_mapping = buf(max_num_tokens, torch.int64)
        self.query_start_loc = buf(max_num_reqs + 1, torch.int32)
        self.seq_lens = buf(max_num_reqs, torch.int32)
        self.num_computed = buf(max_num_reqs, torch.int32)
        self.block_table = buf(max_num_reqs * max_blocks, torch.int32)
        self.block_tables = [self.block_table] + [buf(max_num_reqs * max_blocks, torch.int32)
                                                  for _ in range(num_groups - 1)]
        self.slot_mappings = [self.slot_mapping] + [buf(max_num_tokens, torch.int64)
                                                    for _ in range(num_groups - 1)]
        self.logits_indices = buf(max_num_reqs, torch.int64)
        self.fence = CopyFence(device)

    def check_fits(self, num_tokens: int, num_reqs: int) -> None:
        """Refuse a step larger than the buffers (the scheduler's budgets bound every step)."""
        if num_tokens > self.max_num_tokens or num_reqs > self.max_num_reqs:
            raise ValueError(
                f"a step of {num_tokens} tokens / {num_reqs} requests exceeds the model runner's "
                f"buffers ({self.max_num_tokens} tokens = max_num_batched_tokens, "
                f"{self.max_num_reqs} requests = max_num_seqs)")

    def table(self, num_reqs: int, width: int, group: int = 0) -> np.ndarray:
        """The host block table of this step (of a KV cache group): [num_reqs, width] over the
        flat buffer."""
        return self.block_tables[group].np[: num_reqs * width].reshape(num_reqs, width)

    def table_to_device(self, num_reqs: int, width: int, group: int = 0) -> torch.Tensor:
        return self.block_tables[group].to_device(num_reqs * width).view(num_reqs, width)
