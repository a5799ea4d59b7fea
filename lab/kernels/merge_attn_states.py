"""Merge partial attention results by their log-sum-exp (stage 2 of split-KV decoding).

Split s of a row attended to a disjoint slice of the keys and produced a normalised output o_s and
lse_s = log Σ_{j in slice s} exp(score_j). The full-row result is

    m   = max_s lse_s
    w_s = exp(lse_s - m)                      (0 for an empty split, lse_s = -inf)
    out = Σ_s w_s · o_s / Σ_s w_s
    lse = m + log Σ_s w_s

A row whose splits are all empty gets out = 0 and lse = -inf (never NaN). The kernel runs one
program per (request, head) row and reads partials only where lse_s > -inf, so the partial buffer
may hold stale data for empty splits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_attn_states_kernel(
    po_ptr, plse_ptr, out_ptr, lse_ptr,
    S,
    po_sb, po_sh, po_ss, po_sd,
    pl_sb, pl_sh, pl_ss,
    o_sb, o_sh, o_sd,
    l_sb, l_sh,
    BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, STORE_LSE: tl.constexpr,
):
    """One program per (b, h): LSE-weighted sum of the S partial outputs of that row."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse_s = tl.load(plse_ptr + b * pl_sb + h * pl_sh + offs_s * pl_ss,
                    mask=offs_s < S, other=float("-inf"))
    valid = lse_s > float("-inf")
    m = tl.max(lse_s, axis=0)
    m_safe = tl.where(m > float("-inf"), m, 0.0)
    w = tl.where(valid, tl.exp(lse_s - m_safe), 0.0)
    denom = tl.sum(w, axis=0)
    o_mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)
    o_ptrs = po_ptr + b * po_sb + h * po_sh + offs_s[:, None] * po_ss + offs_d[None, :] * po_sd
    o_s = tl.load(o_ptrs, mask=o_mask, other=0.0)
    acc = tl.sum(w[:, None] * o_s, axis=0)
    has_any = denom > 0.0
    acc = acc / tl.where(has_any, denom, 1.0)
    tl.store(out_ptr + b * o_sb + h * o_sh + offs_d * o_sd,
             acc.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if STORE_LSE:
        lse = tl.where(has_any, m_safe + tl.log(tl.where(has_any, denom, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * l_sb + h * l_sh, lse)


def merge_attn_states(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
) -> None:
    """Merge [B, H, S, D] fp32 partials weighted by their [B, H, S] LSEs into out [B, H, D].

    Writes lse [B, H] (fp32, natural log) when given. Any strides are accepted.
    """
    b, h, s, d = partial_out.shape
    assert partial_lse.shape == (b, h, s), (partial_lse.shape, partial_out.shape)
    assert out.shape == (b, h, d), (out.shape, partial_out.shape)
    if b == 0 or h == 0:
        return
    lse_arg = lse if lse is not None else partial_lse  # dummy pointer when not stored
    l_sb, l_sh = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    block_d = triton.next_power_of_2(d)
    _merge_attn_states_kernel[(b, h)](
        partial_out, partial_lse, out, lse_arg,
        s,
        *partial_out.stride(), *partial_lse.stride(), *out.stride(), l_sb, l_sh,
        BLOCK_S=triton.next_power_of_2(s), HEAD_DIM=d, BLOCK_D=block_d, STORE_LSE=lse is not None,
        num_warps=4 if block_d >= 256 else 2,
    )


def merge_attn_states_ref(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch reference of `merge_attn_states`; also returns the merged lse [B, H] (fp32)."""
    plse = partial_lse.float()
    m = plse.amax(dim=-1)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    valid = plse > float("-inf")
    w = torch.where(valid, torch.exp(plse - m_safe[..., None]), torch.zeros_like(plse))
    denom = w.sum(dim=-1)
    po = torch.where(valid[..., None], partial_out.float(), torch.zeros((), dtype=torch.float32))
    merged = (w[..., None] * po).sum(dim=-2) / torch.where(denom > 0, denom, 1.0)[..., None]
    merged_lse = torch.where(
        denom > 0, m_safe + torch.log(torch.where(denom > 0, denom, 1.0)), float("-inf")
    )
    out.copy_(merged.to(out.dtype))
    if lse is not None:
        lse.copy_(merged_lse)
    return merged_lse
