"""`attention=cpu`: the torch backend with decode steps on a C++ paged-decode kernel (CPU).

    python run.py attention=cpu                     # fp32 or bf16 model on the CPU

Decode steps (one query token per request) whose q and cache share an fp32 or bf16 dtype on the
CPU run `lab.kernels.cpu_paged_decode.paged_decode`: one C++ call per layer that writes the
step's K / V rows into their slots and attends, reading each request's blocks in place through
the block table instead of gathering every cached block into a new tensor for SDPA (the torch
path's cost: experiments/results/2026-12-04-cpu-attention-ceiling.md). Everything else (prefill
and mixed steps, MLA, an fp8 cache, CUDA tensors) is attention=torch's, which is also this
backend's reference in the tests.

The kernel is C++ built at first use (a C++ compiler is needed; ~25 s once per machine, then
cached). Where it cannot be built the backend says so once (a warning) and runs attention=torch's
decode path.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from lab.attention.base import AttentionInputs
from lab.attention.torch_backend import TorchAttentionBackend, TorchAttentionMetadata
from lab.kernels import cpu_paged_decode as kernel

log = logging.getLogger(__name__)


@dataclass
class DecodeMetadata:
    """A pure-decode step's metadata: the kernel reads `inputs` only, so attention=torch's
    metadata (masks, gather indices, write targets: ~80 us a step on bench_llama) is built on
    first use, by a layer the kernel does not take (an MLA layer, an fp8 cache)."""

    inputs: AttentionInputs
    backend: TorchAttentionBackend

    @functools.cached_property
    def torch(self) -> TorchAttentionMetadata:
        return TorchAttentionBackend.build_metadata(self.backend, self.inputs)


def torch_metadata(metadata) -> TorchAttentionMetadata:
    """attention=torch's metadata of a step, built now if it was deferred."""
    return metadata.torch if isinstance(metadata, DecodeMetadata) else metadata


class CPUAttentionBackend(TorchAttentionBackend):
    """attention=torch whose decode steps run the CPU paged-decode kernel (module docstring)."""

    name = "cpu"

    def build_metadata(self, inputs: AttentionInputs):
        if inputs.is_pure_decode:
            return DecodeMetadata(inputs, self)
        return super().build_metadata(inputs)

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        if isinstance(metadata, DecodeMetadata) and kernel.supports(q, kv_cache) and self.kernel_ok:
            a = metadata.inputs
            return kernel.paged_decode(q, k, v, kv_cache, a.slot_mapping, a.block_table,
                                       a.seq_lens, a.num_reqs, a.num_actual_tokens, scale)
        return super().forward(layer_idx, q, k, v, kv_cache, torch_metadata(metadata), scale)

    def forward_mla(self, layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, mla, scale):
        return super().forward_mla(layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache,
                                   torch_metadata(metadata), mla, scale)

    @functools.cached_property
    def kernel_ok(self) -> bool:
        """Whether the kernel is built here (tried at the first decode step; a failure is logged
        once and remembered)."""
        try:
            kernel.load()
            return True
        except kernel.CPUKernelUnavailable as e:
            log.warning("attention=cpu runs attention=torch's decode path: %s", e)
            return False
