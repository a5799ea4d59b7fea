"""The FlashAttention online-softmax step shared by the attention kernels (a jit helper, no
kernel of its own): paged_prefill, paged_decode and mla_decode fold each tile of keys with it.

State per query row: m (running max of the scores, log2 units), l (running sum of exp2), acc
(running sum of exp2-weighted values). A tile of scores s [M, N] (scale and log2(e) folded in,
-inf where masked) and its values v [N, D] update them as

    m' = max(m, max_j s_j);  alpha = 2^(m - m');  p_j = 2^(s_j - m')
    l' = l·alpha + sum_j p_j;  acc' = acc·alpha + p @ v

Rows must have seen at least one finite score by then (every caller's first tile guarantees it),
so m' is finite and no NaN arises.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def online_softmax_step(s, v, acc, m_i, l_i, DOT_PRECISION: tl.constexpr):
    """Fold scores s [M, N] and values v [N, D] into (acc [M, D], m_i [M], l_i [M])."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
