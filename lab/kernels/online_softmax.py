"""The FlashAttention online-softmax step shared by the attention kernels (jit helpers, no
kernel of their own): paged_prefill, paged_decode and mla_decode fold each tile of keys with it,
and the first two soft-cap their scores with `soft_cap`.

State per query row: m (running max of the scores, log2 units), l (running sum of exp2), acc
(running sum of exp2-weighted values). A tile of scores s [M, N] (scale and log2(e) folded in,
-inf where masked) and its values v [N, D] update them as

    m' = max(m, max_j s_j);  alpha = 2^(m - m');  p_j = 2^(s_j - m')
    l' = l·alpha + sum_j p_j;  acc' = acc·alpha + p @ v

Rows must have seen at least one finite score by then, or start from a finite m (a sink's logit,
or a floor far below any score where a sliding window can mask a row's whole first tile), so m'
is finite and no NaN arises.

Attention sinks (gpt-oss) join the softmax as one more column with no value: a row starting at
m = sink (log2 units), l = 1, acc = 0 counts exp2(sink - m) in its denominator and nothing in its
numerator, exactly once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def soft_cap(s, cap):
    """cap * tanh(s / cap), elementwise (Gemma-2's logit soft cap). Triton has no tanh: from
    t = exp2(-2 log2(e) |x|) in (0, 1], tanh(|x|) = (1 - t) / (1 + t), which never overflows,
    then the sign. The map commutes with a scale c > 0 (c·cap·tanh(s/cap) = cap'·tanh(c·s/cap')
    with cap' = c·cap), so the kernels apply it to log2-unit scores with cap·log2(e)."""
    x = s / cap
    t = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 log2(e)
    th = (1.0 - t) / (1.0 + t)
    return cap * tl.where(x < 0.0, -th, th)


@triton.jit
def online_softmax_step(s, v, acc, m_i, l_i, DOT_PRECISION: tl.constexpr):
    """Fold scores s [M, N] and values v [N, D] into (acc [M, D], m_i [M], l_i [M])."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
