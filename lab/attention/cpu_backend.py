"""`attention=cpu`: the torch backend with decode steps on a C++ paged-decode kernel (CPU).

    python run.py attention=cpu                     # fp32 or bf16 model on the CPU

Decode steps (one query token per request) whose q and cache share an fp32 or bf16 dtype on the
CPU run `lab.kernels.cpu_paged_decode.paged_decode`: one C++ call per layer that writes the
step's K / V rows into their slots and attends, reading each request's blocks in place through
the block table instead of gathering every cached block into a new tensor for SDPA (the torch
path's cost: experiments/results/2026-12-04-cpu-attention-ceiling.md).

Fresh prefills (every request of the step starts from nothing cached: its whole prompt is in
the step, so its keys are the step's own k / v) write the rows and attend with causal SDPA on
the step's k / v, one call for requests of one length (else one per request): no gather of the
cache, no padded copies, no mask, no attention=torch metadata (what that saves:
experiments/results/2026-12-05-cpu-prefill-compile.md).

Per-layer features (AttentionSpec): the decode kernel takes all three (a sliding window: it
reads only the window's keys, from max(0, seq_len - window); sinks; a soft cap); the fresh
prefill path takes a sliding window (SDPA with the window's band mask); a fresh prefill of a
layer with sinks or a soft cap, which SDPA cannot express, is attention=torch's.

Everything else (mixed steps and prefills after a prefix-cache hit, MLA, an fp8 cache, CUDA
tensors) is attention=torch's, which is also this backend's reference in the tests.

The kernel is C++, built (or loaded from this install's build directory) by `setup`, which
the Worker calls before the model loads, so before the engine reports ready; a C++ compiler is
needed. Where it cannot be built the backend says so once (a warning) and runs attention=torch's
decode path.
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.attention.base import AttentionInputs
from lab.attention.torch_backend import (
    TorchAttentionBackend,
    TorchAttentionMetadata,
    with_padding_rows,
    write_targets,
)
from lab.kernels import cpu_paged_decode as kernel

log = logging.getLogger(__name__)


@dataclass
class DeferredMetadata:
    """A step this backend attends itself (pure decode: the kernel reads `inputs` only; fresh
    prefill): attention=torch's metadata (masks, gather indices, write targets) is built on
    first use, by a layer the fast paths do not take (an MLA layer, an fp8 cache, a fresh
    prefill's layer with sinks or a soft cap)."""

    inputs: AttentionInputs
    backend: TorchAttentionBackend

    @functools.cached_property
    def torch(self) -> TorchAttentionMetadata:
        return TorchAttentionBackend.build_metadata(self.backend, self.inputs)

    @functools.cached_property
    def _targets(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        return write_targets(self.inputs.slot_mapping[:self.inputs.num_actual_tokens])

    # where the step's K / V rows go, once a step (TorchAttentionBackend.write_step_kv reads them)
    write_rows = property(lambda self: self._targets[0])
    write_slots = property(lambda self: self._targets[1])


def torch_metadata(metadata) -> TorchAttentionMetadata:
    """attention=torch's metadata of a step, built now if it was deferred."""
    return metadata.torch if isinstance(metadata, DeferredMetadata) else metadata


def is_fresh_prefill(inputs: AttentionInputs) -> bool:
    """Whether every request's tokens so far are all in this step (none cached before it)."""
    return not inputs.is_pure_decode and inputs.query_lens_cpu == inputs.seq_lens_cpu


class CPUAttentionBackend(TorchAttentionBackend):
    """attention=torch with its own decode (C++ kernel) and fresh-prefill paths (module
    docstring)."""

    name = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self.kernel_ok: bool | None = None  # whether the decode kernel runs: set by setup

    def setup(self, device: torch.device) -> None:
        """Build or load the decode kernel on a CPU; where it cannot be built, warn once and run
        attention=torch's decode path."""
        if torch.device(device).type != "cpu":
            self.kernel_ok = False
            return
        try:
            kernel.load()
            self.kernel_ok = True
        except kernel.CPUKernelUnavailable as e:
            log.warning("attention=cpu runs attention=torch's decode path: %s", e)
            self.kernel_ok = False

    def build_metadata(self, inputs: AttentionInputs):
        if inputs.is_pure_decode or is_fresh_prefill(inputs):
            return DeferredMetadata(inputs, self)
        return super().build_metadata(inputs)

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale, *, sliding_window=None,
                sinks=None, softcap=None):
        """The fast paths (module docstring): the decode kernel with every feature, the fresh
        prefill with a sliding window; the rest is attention=torch's."""
        features = dict(sliding_window=sliding_window, sinks=sinks, softcap=softcap)
        if isinstance(metadata, DeferredMetadata):
            a = metadata.inputs
            if a.is_pure_decode and kernel.supports(q, kv_cache) and self._decode_kernel():
                return kernel.paged_decode(q, k, v, kv_cache, a.slot_mapping, a.block_table,
                                           a.seq_lens, a.num_reqs, a.num_actual_tokens, scale,
                                           **features)
            if (not a.is_pure_decode and kv_cache.dtype == q.dtype and sinks is None
                    and softcap is None):
                self.write_step_kv(layer_idx, k, v, kv_cache, metadata)
                return fresh_prefill(q, k, v, a, scale, sliding_window)
        return super().forward(layer_idx, q, k, v, kv_cache, torch_metadata(metadata), scale,
                               **features)

    def forward_mla(self, layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, mla, scale):
        return super().forward_mla(layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache,
                                   torch_metadata(metadata), mla, scale)

    def _decode_kernel(self) -> bool:
        """Whether decode steps run the kernel (RuntimeError when `setup` did not run: a
        request never builds it)."""
        if self.kernel_ok is None:
            raise RuntimeError("attention=cpu: setup(device) was not called; the Worker calls "
                               "it before the model loads")
        return self.kernel_ok


def fresh_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs,
                  scale: float, window: int | None = None) -> torch.Tensor:
    """A fresh prefill step (is_fresh_prefill): causal attention of each request's queries over
    its own k / v (the last `window` keys of each query's with a sliding window) -> [T, H, D]
    (padding tokens beyond num_actual_tokens are zero rows)."""
    n = inputs.num_actual_tokens
    lens = inputs.query_lens_cpu
    if len(set(lens)) == 1:  # one call: [B, H, L, D]
        b, length = len(lens), lens[0]
        out = _causal(*(x[:n].view(b, length, *x.shape[1:]) for x in (q, k, v)), scale, window)
        out = out.reshape(n, *out.shape[2:])
    else:
        bounds = [0, *itertools.accumulate(lens)]
        out = torch.cat([_causal(q[None, s:e], k[None, s:e], v[None, s:e], scale, window)[0]
                         for s, e in itertools.pairwise(bounds)])
    return with_padding_rows(out, q.shape[0])


@functools.lru_cache(maxsize=16)
def band_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """[L, L] True where query i sees key j: j <= i and i - j < window. Made once per (length,
    window) and shared by every sliding layer of a step (and by later steps of that length)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril().triu(1 - window)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            window: int | None = None) -> torch.Tensor:
    """q [B, L, H, D] over k / v [B, L, Hkv, D], causal (query i sees keys j <= i, and
    i - j < window with a window shorter than L) -> [B, L, H, D]."""
    length = q.shape[1]
    mask = None
    if window is not None and window < length:  # the causal band of the window
        mask = band_mask(length, window, q.device)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        is_causal=mask is None, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)
