"""SamplingRows: the persistent batch's sampling parameters as per-row arrays (vLLM's InputBatch
sampling tensors), and each step's SamplingMetadata read from them.

A RowStore (lab/worker/persistent_batch.py): row i holds the parameters of the request at
batch row i; the runner writes a row when it adds a request (`set_row`), the batch moves and
clears rows. Per row:

    temperature   float32  the request's; 1.0 for greedy rows (the sampler never divides by 0)
    top_k         int64    0 = off (-1 in SamplingParams is 0 here; at most 2**63 - 1)
    top_p         float32  1.0 = off          min_p  float32  0.0 = off
    greedy        bool
    num_logprobs  int64    NO_LOGPROBS: none asked; -1: the whole vocabulary; k: the top k
    generators    list     the request's generator (None: unseeded, or greedy)

`metadata(n, kept)` equals SamplingMetadata.from_params over rows 0..n-1 (tests check it after
any sequence of adds, removes, condenses and swaps). It is rebuilt only after a row changed:
the host arrays' first n entries (pinned on CUDA) copied once into device buffers, the batch
flags from numpy reductions; unchanged steps reuse it. Rows whose token this step does not keep
(a partial prefill) lose their generator for the step, so a seeded request's generator advances
only for the tokens it keeps.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from lab.core.sampling_params import SamplingParams
from lab.sampling.metadata import SamplingMetadata, top_k_value
from lab.worker.buffers import CpuGpuBuffer

NO_LOGPROBS = -2


class SamplingRows:
    """Per-row sampling parameters of the persistent batch (see the module docstring)."""

    def __init__(self, max_num_reqs: int, device: torch.device, pin: bool = False,
                 share: bool | None = None) -> None:
        def buf(dtype: torch.dtype, neutral: float | int | bool) -> CpuGpuBuffer:
            return CpuGpuBuffer(max_num_reqs, dtype=dtype, device=device, pin=pin, share=share,
                                fill=neutral)

        self.temperature = buf(torch.float32, 1.0)
        self.top_k = buf(torch.int64, 0)
        self.top_p = buf(torch.float32, 1.0)
        self.min_p = buf(torch.float32, 0.0)
        self.greedy = buf(torch.bool, False)
        self.num_logprobs = np.full(max_num_reqs, NO_LOGPROBS, dtype=np.int64)
        self.seeded = np.zeros(max_num_reqs, dtype=bool)
        self.generators: list[torch.Generator | None] = [None] * max_num_reqs
        self._arrays = (self.temperature.np, self.top_k.np, self.top_p.np, self.min_p.np,
                        self.greedy.np, self.num_logprobs, self.seeded)
        self._neutral = (1.0, 0, 1.0, 0.0, False, NO_LOGPROBS, False)
        self._cached: SamplingMetadata | None = None

    # -- RowStore ------------------------------------------------------------------------------
    def set_row(self, index: int, params: SamplingParams,
                generator: torch.Generator | None) -> None:
        """Write the parameters of the request added at `index`."""
        greedy = params.is_greedy
        self.temperature.np[index] = 1.0 if greedy else float(params.temperature)
        self.top_k.np[index] = top_k_value(params.top_k)
        self.top_p.np[index] = float(params.top_p)
        self.min_p.np[index] = float(params.min_p)
        self.greedy.np[index] = greedy
        self.num_logprobs[index] = NO_LOGPROBS if params.logprobs is None else params.logprobs
        gen = None if greedy else generator
        self.generators[index] = gen
        self.seeded[index] = gen is not None
        self._cached = None

    def move(self, src: int, dst: int) -> None:
        for a in self._arrays:
            a[dst] = a[src]
        self.generators[dst] = self.generators[src]
        self._cached = None

    def swap(self, a: int, b: int) -> None:
        for arr in self._arrays:
            arr[a], arr[b] = arr[b], arr[a]
        self.generators[a], self.generators[b] = self.generators[b], self.generators[a]
        self._cached = None

    def clear(self, index: int) -> None:
        for a, neutral in zip(self._arrays, self._neutral):
            a[index] = neutral
        self.generators[index] = None
        self._cached = None

    # -- the step's metadata -------------------------------------------------------------------
    def metadata(self, n: int, kept: np.ndarray | None = None) -> SamplingMetadata:
        """SamplingMetadata of rows 0..n-1; `kept` (bool [n]): rows whose token is kept this
        step (None: all); the others draw no noise from their generator."""
        meta = self._cached
        if meta is None or meta.batch_size != n:
            meta = self._cached = self._build(n)
        if kept is not None:
            drop = np.flatnonzero(self.seeded[:n] & ~kept)
            if drop.size:
                gens = list(meta.generators)
                for i in drop.tolist():
                    gens[i] = None
                meta = replace(meta, generators=gens)
        return meta

    def _build(self, n: int) -> SamplingMetadata:
        greedy, top_k = self.greedy.np[:n], self.top_k.np[:n]
        asked = self.num_logprobs[:n]
        asked = asked[asked != NO_LOGPROBS]
        return SamplingMetadata(
            temperature=self.temperature.to_device(n),
            top_k=self.top_k.to_device(n),
            top_p=self.top_p.to_device(n),
            min_p=self.min_p.to_device(n),
            is_greedy=self.greedy.to_device(n),
            all_greedy=bool(greedy.all()),
            all_random=not greedy.any(),
            no_top_k=not (top_k > 0).any(),
            no_top_p=bool((self.top_p.np[:n] >= 1.0).all()),
            no_min_p=bool((self.min_p.np[:n] <= 0.0).all()),
            generators=self.generators[:n],
            max_num_logprobs=(None if not asked.size else -1 if (asked == -1).any()
                              else int(asked.max())),
        )
