"""Paged decode attention on the CPU, in C++ (`cpu_paged_decode.cpp`), beside its reference.

No Triton here: the CPU has no compiled Triton (only the interpreter), and the torch backend's
decode path copies every cached block of every request (a gather) before SDPA reads it again.
This kernel reads K and V in place through the block table, once. It is what `attention=cpu`
(lab/attention/cpu_backend.py) runs for decode steps; experiments/results/
2026-12-04-cpu-attention-ceiling.md measured what decode attention costs lab and what a kernel
could give.

Build: `lab.kernels.cpu_ext` (its docstring has the flags, the directory and the lock), from
attention=cpu's setup, before the engine is ready. Without a C++ compiler `load()` raises
`CPUKernelUnavailable` and the backend runs the torch path (with one warning).

    paged_decode(q, k, v, kv_cache, slots, block_table, seq_lens, num_reqs, num_tokens, scale,
                 sliding_window=None, sinks=None, softcap=None) -> out [T, H, D]
      q [T, H, D], k / v [T, Hkv, D] (each token's heads contiguous); kv_cache
      [2, num_blocks, BS, Hkv, D]; slots [T] int64 (< 0: not written); block_table
      [>= num_reqs, max_blocks] int32; seq_lens [>= num_reqs] int32; fp32 or bf16, one dtype.
      The first num_tokens rows of k / v are written to their slots, then query b < num_reqs
      (request b's one token) attends to its seq_lens[b] keys; rows num_reqs.. are zero.
      A layer's features (AttentionSpec): with `sliding_window` W the query reads only its
      last W keys (from max(0, L - W): blocks below are never read, nor their block-table
      entries); `sinks` [H] adds one logit per query head to the softmax's denominator;
      `softcap` maps each scaled score s to softcap * tanh(s / softcap) before the softmax.
      Head dim 64 or 128 with a group of 1, 2, 4 or 8 query heads per KV head runs AVX-512
      intrinsics where the CPU has them (q, accumulators and rows in registers; each block's
      rows prefetched a block ahead, a row at a time); other shapes and CPUs run portable
      loops (`portable=True` forces them). A task takes a request's KV heads all together (its
      blocks read as whole stretches), or spans of them where requests are fewer than four per
      thread.

`paged_decode_ref` is the same contract in PyTorch (the reference KV write, then each
request's keys gathered and a softmax in fp32).
"""

from __future__ import annotations

import torch

from lab.kernels.cpu_ext import CPUExtension, CPUKernelUnavailable
from lab.kernels.kv_cache_write import write_kv_cache_ref

__all__ = ["CPUKernelUnavailable", "applies", "build", "extension_name", "load",
           "paged_decode", "paged_decode_ref", "supports"]

EXTENSION = CPUExtension("cpu_paged_decode")
DTYPES = (torch.float32, torch.bfloat16)


def extension_name() -> str:
    """lab_cpu_paged_decode_<hash of source, flags, torch version and the CPU's flags>."""
    return EXTENSION.name()


def applies() -> bool:
    """Whether the kernel can run on this machine at all (any CPU: portable loops without
    AVX-512)."""
    return True


def load():
    """The compiled extension: loaded in this process already, else built (or loaded from the
    disk cache) now; attention=cpu's setup calls it before the engine is ready."""
    return EXTENSION.load()


def build():
    """Build (or load from the disk cache) the extension; CPUKernelUnavailable when it cannot
    be built here."""
    return EXTENSION.build()


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel takes this step's tensors: CPU, fp32 or bf16, one dtype."""
    return (q.device.type == "cpu" and kv_cache.device.type == "cpu"
            and q.dtype in DTYPES and kv_cache.dtype == q.dtype)


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                 slots: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 num_reqs: int, num_tokens: int, scale: float, portable: bool = False, *,
                 sliding_window: int | None = None, sinks: torch.Tensor | None = None,
                 softcap: float | None = None) -> torch.Tensor:
    """The kernel (module docstring); the extension must be loaded already (`load()`: it never
    builds here). `portable` runs the plain C++ loops even where an AVX-512 task is compiled in
    (tests)."""
    if sinks is not None:
        sinks = sinks.float().contiguous()
    return EXTENSION.loaded().paged_decode(q, k, v, kv_cache, slots, block_table, seq_lens,
                                           num_reqs, num_tokens, scale, portable,
                                           sliding_window or 0, sinks, softcap or 0.0)


def paged_decode_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                     slots: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     num_reqs: int, num_tokens: int, scale: float, *,
                     sliding_window: int | None = None, sinks: torch.Tensor | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """PyTorch reference of `paged_decode` (same contract)."""
    write_kv_cache_ref(k[:num_tokens], v[:num_tokens], kv_cache[0], kv_cache[1],
                       slots[:num_tokens])
    _, _, bs, hkv, d = kv_cache.shape
    out = torch.zeros_like(q)
    g = q.shape[1] // hkv
    for b, length in enumerate(seq_lens[:num_reqs].tolist()):
        if length <= 0:
            continue
        lo = max(0, length - sliding_window) if sliding_window else 0
        pos = torch.arange(lo, length)
        blocks = block_table[b].long()[pos // bs]
        keys = kv_cache[0, blocks, pos % bs].float()  # [L, Hkv, D]
        vals = kv_cache[1, blocks, pos % bs].float()
        qb = q[b].float().view(hkv, g, d)
        scores = torch.einsum("kgd,lkd->kgl", qb, keys) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if sinks is not None:  # one more column per head, dropped after the softmax
            scores = torch.cat((scores, sinks.float().view(hkv, g, 1)), -1)
        p = scores.softmax(-1)[..., :len(pos)]
        out[b] = torch.einsum("kgl,lkd->kgd", p, vals).reshape(-1, d).to(q.dtype)
    return out
