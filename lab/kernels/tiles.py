"""Tile scheduling shared by the GEMM kernels (no kernel of its own).

GROUP_M swizzle: programs walk the output tile grid in super-rows of GROUP_M tile rows, column
by column inside a super-row, so consecutive programs reuse the same B (weight) tiles and a few
A tiles from L2 instead of streaming a whole row of B per tile row:

    pid:   0  GROUP_M  ..          tile rows 0..GROUP_M-1, column 0, then column 1, ...
           1  ...
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """(tile row, tile column) of program `pid` over a num_m x num_n tile grid."""
    per_group = GROUP_M * num_n
    first_m = pid // per_group * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size
    return pid_m, pid_n


@triton.jit
def load_k_step(a_ptrs, b_ptrs, k_left, offs_k, EVEN_K: tl.constexpr):
    """One K step of a GEMM: the A [BLOCK_M, BLOCK_K] and B^T [BLOCK_K, BLOCK_N] tiles, with the
    columns / rows at or past `k_left` (the K remaining) read as zero unless EVEN_K."""
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        k_ok = offs_k < k_left
        a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
    return a, b
