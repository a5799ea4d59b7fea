"""Paged decode attention on the CPU, in C++ (`cpu_paged_decode.cpp`), beside its reference.

No Triton here: the CPU has no compiled Triton (only the interpreter), and the torch backend's
decode path copies every cached block of every request (a gather) before SDPA reads it again.
This kernel reads K and V in place through the block table, once. It is what `attention=cpu`
(lab/attention/cpu_backend.py) runs for decode steps; experiments/results/
2026-12-04-cpu-attention-ceiling.md measured what decode attention costs lab and what a kernel
could give.

Build: torch's cpp_extension compiles the source at first use (~25 s on 2 cores) with
`CFLAGS` and caches it (TORCH_EXTENSIONS_DIR). `-fopenmp` is what makes `at::parallel_for` run
on torch's OpenMP pool (without it the header-only loop runs serially; the extension's libgomp
is torch's, one runtime per process); `-ffast-math` lets the fp32 reductions and the exp
vectorize (glibc's libmvec: `-lmvec`); the scores are finite, so its no-NaN/inf assumption
holds. The extension's name carries a hash of the source, the compiler flags, torch's version
and this CPU's flags, so a changed source or another machine builds its own copy instead of
loading a binary made for other instructions. Without a C++ compiler `load()` raises
`CPUKernelUnavailable` and the backend falls back to the torch path (with one warning).

    paged_decode(q, k, v, kv_cache, slots, block_table, seq_lens, num_reqs, num_tokens, scale)
      -> out [T, H, D]
      q [T, H, D], k / v [T, Hkv, D] (each token's heads contiguous); kv_cache
      [2, num_blocks, BS, Hkv, D]; slots [T] int64 (< 0: not written); block_table
      [>= num_reqs, max_blocks] int32; seq_lens [>= num_reqs] int32; fp32 or bf16, one dtype.
      The first num_tokens rows of k / v are written to their slots, then query b < num_reqs
      (request b's one token) attends to its seq_lens[b] keys; rows num_reqs.. are zero.
      Head dim 64 or 128 with a group of 1, 2, 4 or 8 query heads per KV head runs AVX-512
      intrinsics where the CPU has them (q, accumulators and rows in registers; each block's
      rows prefetched two blocks ahead, a row at a time); other shapes and CPUs run portable
      loops (`portable=True` forces them).

`paged_decode_ref` is the same contract in PyTorch (the reference KV write, then each
request's keys gathered and a softmax in fp32).
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

import torch

from lab.kernels.kv_cache_write import write_kv_cache_ref

SOURCE = Path(__file__).with_name("cpu_paged_decode.cpp")
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]
LDFLAGS = ["-fopenmp", "-lmvec"]  # OpenMP (torch's libgomp at run time), glibc's vector math
DTYPES = (torch.float32, torch.bfloat16)


class CPUKernelUnavailable(RuntimeError):
    """The C++ kernel could not be built or loaded here (no compiler, no glibc libmvec, ...)."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def extension_name() -> str:
    """lab_cpu_paged_decode_<hash of source, flags, torch version and the CPU's flags>."""
    key = "\n".join([SOURCE.read_text(), *CFLAGS, *LDFLAGS, torch.__version__, _cpu_flags()])
    return f"lab_cpu_paged_decode_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@functools.cache
def load():
    """The compiled extension, built on first use (then cached on disk and in this process)."""
    return build()


def build():
    """Build (or load from the disk cache) the extension; CPUKernelUnavailable when it cannot
    be built here."""
    try:
        from torch.utils.cpp_extension import load as cpp_load

        return cpp_load(extension_name(), [str(SOURCE)], extra_cflags=CFLAGS,
                        extra_ldflags=LDFLAGS, verbose=False)
    except Exception as e:  # no compiler / ninja: OSError, RuntimeError, CalledProcessError
        raise CPUKernelUnavailable(f"the CPU paged-decode kernel could not be built: {e}") from e


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel takes this step's tensors: CPU, fp32 or bf16, one dtype."""
    return (q.device.type == "cpu" and kv_cache.device.type == "cpu"
            and q.dtype in DTYPES and kv_cache.dtype == q.dtype)


def paged_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                 slots: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 num_reqs: int, num_tokens: int, scale: float, portable: bool = False
                 ) -> torch.Tensor:
    """The kernel (module docstring); raises CPUKernelUnavailable when it cannot be built.
    `portable` runs the plain C++ loops even where an AVX-512 task is compiled in (tests)."""
    return load().paged_decode(q, k, v, kv_cache, slots, block_table, seq_lens, num_reqs,
                               num_tokens, scale, portable)


def paged_decode_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                     slots: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     num_reqs: int, num_tokens: int, scale: float) -> torch.Tensor:
    """PyTorch reference of `paged_decode` (same contract)."""
    write_kv_cache_ref(k[:num_tokens], v[:num_tokens], kv_cache[0], kv_cache[1],
                       slots[:num_tokens])
    _, _, bs, hkv, d = kv_cache.shape
    out = torch.zeros_like(q)
    g = q.shape[1] // hkv
    for b, length in enumerate(seq_lens[:num_reqs].tolist()):
        blocks = block_table[b, : -(-length // bs)].long()
        keys = kv_cache[0, blocks].reshape(-1, hkv, d)[:length].float()  # [L, Hkv, D]
        vals = kv_cache[1, blocks].reshape(-1, hkv, d)[:length].float()
        qb = q[b].float().view(hkv, g, d)
        p = (torch.einsum("kgd,lkd->kgl", qb, keys) * scale).softmax(-1)
        out[b] = torch.einsum("kgl,lkd->kgd", p, vals).reshape(-1, d).to(q.dtype)
    return out
