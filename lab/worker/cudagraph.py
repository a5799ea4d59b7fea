"""The padded decode path and its CUDA graphs (vLLM's FULL_DECODE_ONLY cudagraph mode).

    capture sizes: the `cudagraph_capture_sizes` knob, or (null) vLLM's default list on CUDA —
                   1, 2, 4, then multiples of 8 up to 256 and of 16 up to 512 — and none on a
                   CPU; only sizes <= max_num_seqs (and <= max_num_batched_tokens) are kept;
                   `enforce_eager=true`: none.
    a step runs padded when every request computes one token, B <= the largest size, and the
    runner made a PaddedDecode: sizes given, the attention backend declares UNIFORM_DECODE on
    this device (lab/attention/base.py), one TP rank, no fp8 KV cache (its scales are
    calibrated on the first real write, which a capture at startup would pre-empt).
    P = the smallest size >= B; rows B..P-1 are padding (lab/worker/inputs.py).

On CUDA, `capture()` runs once the KV cache exists (the worker calls it, and also in its memory
profile, to count the graphs in the KV budget): eager warm-ups at 1, max_num_reqs and every size
(so lazily sized state such as the split-KV workspace reaches its final shape before a graph
records its address; it never grows afterwards), then one graph per size, largest first, in
one memory pool. Each graph keeps its metadata (built once over the static buffers, which is
why a UNIFORM_DECODE backend's decode metadata must only view them) and its output. A step
fills the static buffers and replays the graph of its size. On a CPU nothing is captured: the
same static buffers are filled and the model runs eagerly on them, metadata built each step —
or, with `replay_metadata` (what tests set to check a backend's contract without a GPU), the
size's metadata built once and reused, exactly as a replay reads it.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lab.attention.base import AttentionBackend, CudaGraphSupport, build_step_metadata
from lab.worker.buffers import InputBuffers
from lab.worker.inputs import StepBatch, fill_padding, static_decode_inputs

log = logging.getLogger(__name__)


def default_capture_sizes(limit: int) -> list[int]:
    """vLLM's decode capture sizes up to `limit`: 1, 2, 4, 8, 16, ..., 256, 272, ..., 512."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, 513, 16)]
    return [s for s in sizes if s <= limit]


def resolve_capture_sizes(sizes: Sequence[int] | None, enforce_eager: bool,
                          device: torch.device, max_num_reqs: int,
                          max_num_tokens: int) -> tuple[int, ...]:
    """The decode batch sizes the runner pads to (module docstring), ascending; () = none."""
    if enforce_eager:
        return ()
    limit = min(max_num_reqs, max_num_tokens)
    if sizes is None:
        return tuple(default_capture_sizes(limit)) if device.type == "cuda" else ()
    kept = sorted({int(s) for s in sizes if 1 <= int(s) <= limit})
    if len(kept) < len(set(sizes)):
        log.info("cudagraph_capture_sizes: sizes above %d (max_num_seqs / "
                 "max_num_batched_tokens) dropped, kept %s", limit, kept)
    return tuple(kept)


def padding_applies(backend: AttentionBackend, device: torch.device, tp_size: int,
                    fp8_cache: bool) -> bool:
    """Whether decode batches may run padded (module docstring); logs why not."""
    why = ("the attention backend does not support it on this device"
           if backend.cudagraph_support(device) is not CudaGraphSupport.UNIFORM_DECODE
           else "tensor_parallel_size > 1" if tp_size > 1
           else "an fp8 KV cache calibrates its scales on the first write" if fp8_cache
           else None)
    if why is not None:
        log.info("decode batches run eagerly, unpadded: %s", why)
    return why is None


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor  # the graph's output [size, hidden]
    metadata: object  # kept alive: the graph reads its tensors


class PaddedDecode:
    """Runs padded uniform decode batches from the runner's static buffers: replaying a CUDA
    graph per capture size once `capture` has run, eagerly otherwise."""

    def __init__(self, sizes: Sequence[int], model: torch.nn.Module, backend: AttentionBackend,
                 bufs: InputBuffers, block_size: int, max_model_len: int,
                 device: torch.device, layer_groups: tuple[int, ...] = ()) -> None:
        """`layer_groups`: each layer's KV cache group (a hybrid cache; () for one group)."""
        self.sizes = sorted(sizes)
        if not self.sizes or self.sizes[-1] > bufs.max_num_reqs:
            raise ValueError(f"capture sizes {self.sizes} must be 1..{bufs.max_num_reqs}")
        self.model, self.backend, self.bufs = model, backend, bufs
        self.block_size, self.max_model_len, self.device = block_size, max_model_len, device
        self.layer_groups = layer_groups
        self.graphs: dict[int, _Graph] = {}
        self.replay_metadata = False  # eager runs reuse each size's first metadata (tests)
        self._metadata: dict[int, object] = {}

    def size_for(self, num_reqs: int) -> int | None:
        """The capture size a decode batch of num_reqs requests pads to (None: too large)."""
        i = bisect.bisect_left(self.sizes, num_reqs)
        return self.sizes[i] if i < len(self.sizes) else None

    @property
    def can_capture(self) -> bool:
        return self.device.type == "cuda"

    def run(self, batch: StepBatch, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """The hidden states [P, hidden] of a batch prepare_padded_decode filled."""
        graph = self.graphs.get(batch.padded_size)
        if graph is not None:
            graph.graph.replay()
            return graph.hidden
        metadata = (self.static_metadata(batch.padded_size) if self.replay_metadata
                    else build_step_metadata(self.backend, batch.attn_inputs))
        return self.model(batch.input_ids, batch.positions, kv_caches, metadata)

    def static_metadata(self, size: int) -> object:
        """The metadata of padded size `size`, built once over the static buffers."""
        if size not in self._metadata:
            self._metadata[size] = build_step_metadata(self.backend, static_decode_inputs(
                self.bufs, size, self.block_size, self.max_model_len, [1] * size,
                self.layer_groups))
        return self._metadata[size]

    @torch.inference_mode()
    def capture(self, kv_caches: list[torch.Tensor]) -> bool:
        """Capture one graph per size (CUDA only); False, with the graphs dropped and a
        warning, if a capture failed (the runner then runs eagerly)."""
        if not self.can_capture:
            return False
        warmups = sorted({1, self.bufs.max_num_reqs, *self.sizes}, reverse=True)
        for size in warmups:
            self._eager(size, kv_caches)
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()
        try:
            for size in reversed(self.sizes):
                self.graphs[size] = self._capture_one(size, kv_caches, pool)
        except Exception as e:  # noqa: BLE001 - any capture failure means: run eagerly
            log.warning("CUDA graph capture failed (%s: %s); running eagerly", type(e).__name__, e)
            self.graphs.clear()
            torch.cuda.synchronize(self.device)
            return False
        torch.cuda.synchronize(self.device)
        return True

    def _eager(self, size: int, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """One forward of an all-padding batch of `size` rows (a warm-up)."""
        fill_padding(self.bufs, size)
        metadata = self.static_metadata(size)
        return self.model(self.bufs.input_ids.gpu[:size], self.bufs.positions.gpu[:size],
                          kv_caches, metadata)

    def _capture_one(self, size: int, kv_caches: list[torch.Tensor], pool) -> _Graph:
        fill_padding(self.bufs, size)
        metadata = self.static_metadata(size)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            hidden = self.model(self.bufs.input_ids.gpu[:size], self.bufs.positions.gpu[:size],
                                kv_caches, metadata)
        return _Graph(graph, hidden, metadata)
