"""The rejection sampler of speculative decoding (Triton + PyTorch reference). The rule, the
noise and the flat layout are lab/sampling/rejection.py's docstring; `draw_noise` there draws
the `RejectionNoise` both implementations read, so they emit the same tokens.

The noise type and the output's placeholder live here, beside the op, because lab.kernels is a
leaf package (tests/test_layering.py): lab/sampling/rejection.py re-exports them.

The kernels follow vLLM V1's RejectionSampler: one program per request, two kernels launched
over the whole batch, each returning at once on the other kind's requests:

    greedy  for each target row j <= k: its argmax over vocab tiles; emitted while the drafts
            before it were accepted (an accepted draft is that argmax); k_acc = first j with
            argmax != d_j
    random  the acceptance tests u_j * q_j(d_j) <= p_{j-1}(d_j) (scalar loads, in fp64 as the
            reference's Python floats: the product of two fp32 is exact there), then one pass
            over row k_acc's vocab tiles racing the residual max(p - q, 0) (a point mass: p
            without d) and p itself against the request's exponentials, so the fallback to p
            when the residual is all zero costs no second pass; all accepted: the race of p_k

Bit-identical to the reference: the divisions are IEEE (`div_rn`, never the GPU's approximate
fp32 division) and the argmax keeps the first index of the largest value, as torch's. Greedy
rows may hold any finite scores (a NaN there is not treated as torch does).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import triton
import triton.language as tl

PLACEHOLDER = -1  # an output slot past a request's emitted tokens
_MAX_BLOCK = 1024  # vocab tile of the kernels' row passes


@dataclass
class RejectionNoise:
    """The randomness of one rejection-sampling call: `uniform` [D] (one per draft) and
    `exponential` [B, V] (one race per request: for its recovered or its bonus token)."""

    uniform: torch.Tensor
    exponential: torch.Tensor


# -- the reference --------------------------------------------------------------------------
def rejection_sample_ref(
    draft_token_ids: torch.Tensor, num_draft_tokens: list[int], target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None, is_greedy: torch.Tensor, noise: RejectionNoise,
) -> torch.Tensor:
    """The reference (lab/sampling/rejection.py's docstring): a loop over requests and their
    drafts, for clarity. `target_probs` [D + B, V] float32 (greedy rows: any scores, only their
    argmax is read); `draft_probs` [D, V] or None (point masses); `is_greedy` bool [B]. Returns
    int64 [B, max k + 1]."""
    num_reqs = len(num_draft_tokens)
    width = max(num_draft_tokens, default=0) + 1
    out = torch.full((num_reqs, width), PLACEHOLDER, dtype=torch.int64,
                     device=target_probs.device)
    drafts = draft_token_ids.tolist()
    greedy = is_greedy.tolist()
    d0 = row0 = 0
    for i, k in enumerate(num_draft_tokens):
        rows = target_probs[row0 : row0 + k + 1]
        q = None if draft_probs is None else draft_probs[d0 : d0 + k]
        tokens = (_greedy_tokens(rows, drafts[d0 : d0 + k]) if greedy[i] else
                  _random_tokens(rows, drafts[d0 : d0 + k], q, noise.uniform[d0 : d0 + k],
                                 noise.exponential[i]))
        out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        d0, row0 = d0 + k, row0 + k + 1
    return out


def _greedy_tokens(rows: torch.Tensor, drafts: list[int]) -> list[int]:
    best = rows.argmax(dim=-1).tolist()
    tokens = []
    for j, d in enumerate(drafts):
        if best[j] != d:
            return tokens + [best[j]]
        tokens.append(d)
    return tokens + [best[len(drafts)]]


def _random_tokens(rows: torch.Tensor, drafts: list[int], q: torch.Tensor | None,
                   uniform: torch.Tensor, race: torch.Tensor) -> list[int]:
    tokens = []
    for j, d in enumerate(drafts):
        p_d = float(rows[j, d])
        q_d = 1.0 if q is None else float(q[j, d])
        if float(uniform[j]) * q_d <= p_d:
            tokens.append(d)
            continue
        return tokens + [int((recovered_probs(rows[j], d, None if q is None else q[j])
                              / race).argmax())]
    return tokens + [int((rows[len(drafts)] / race).argmax())]


def recovered_probs(p: torch.Tensor, draft: int, q: torch.Tensor | None) -> torch.Tensor:
    """What a rejected draft's position draws from: max(p - q, 0) (unnormalised: a race does
    not need it), for a point mass p without the draft. If nothing is left (p <= q
    everywhere: the draft took all of p), p itself."""
    if q is None:
        residual = p.clone()
        residual[draft] = 0.0
    else:
        residual = (p - q).clamp_(min=0.0)
    return residual if bool((residual > 0).any()) else p


# -- the kernels ------------------------------------------------------------------------------
@triton.jit
def _fold_argmax(x, cols, best_val, best_idx):
    """Fold one tile into a running (max, its first index): a later tile wins only when its
    max is strictly larger, so ties keep the earliest index, as torch's argmax."""
    m = tl.max(x, axis=0)
    i = tl.min(tl.where(x == m, cols, 2147483647), axis=0)
    better = m > best_val
    return tl.where(better, m, best_val), tl.where(better, i, best_idx)


@triton.jit
def _row_argmax(row_ptr, V, BLOCK: tl.constexpr):
    """The first index of the largest of row_ptr[0:V], over BLOCK-wide tiles."""
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.full([], 0, tl.int32)
    for v0 in range(0, V, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < V, other=float("-inf"))
        best_val, best_idx = _fold_argmax(x, cols, best_val, best_idx)
    return best_idx


@triton.jit
def _greedy_kernel(out_ptr, draft_ptr, start_ptr, k_ptr, greedy_ptr, target_ptr,
                   stride_t, stride_o, V, BLOCK: tl.constexpr):
    """Request program_id(0), if greedy: out[j] = argmax of target row j while drafts 0..j-1
    matched their rows' argmax (so an accepted draft is written as that argmax)."""
    req = tl.program_id(0)
    if tl.load(greedy_ptr + req) == 0:
        return
    start = tl.load(start_ptr + req)
    k = tl.load(k_ptr + req)
    out_row = out_ptr + req.to(tl.int64) * stride_o
    num_accepted = k
    for j in range(0, k + 1):
        row = target_ptr + (start + req + j).to(tl.int64) * stride_t
        best = _row_argmax(row, V, BLOCK)
        tl.store(out_row + j, best.to(tl.int64), mask=j <= num_accepted)
        d = tl.load(draft_ptr + start + j, mask=j < k, other=-1)
        first_miss = (j < k) & (num_accepted == k) & (best != d)
        num_accepted = tl.where(first_miss, j, num_accepted)


@triton.jit
def _random_kernel(out_ptr, draft_ptr, start_ptr, k_ptr, greedy_ptr, target_ptr, q_ptr,
                   uniform_ptr, exp_ptr, stride_t, stride_q, stride_e, stride_o, V,
                   HAS_Q: tl.constexpr, BLOCK: tl.constexpr):
    """Request program_id(0), if not greedy: its accepted drafts, then the race at the first
    rejection (residual, or p where the residual is all zero) or the bonus race of p_k."""
    req = tl.program_id(0)
    if tl.load(greedy_ptr + req) != 0:
        return
    start = tl.load(start_ptr + req)
    k = tl.load(k_ptr + req)
    out_row = out_ptr + req.to(tl.int64) * stride_o
    num_accepted = k
    for j in range(0, k):
        d = tl.load(draft_ptr + start + j)
        p_d = tl.load(target_ptr + (start + req + j).to(tl.int64) * stride_t + d)
        q_d = 1.0
        if HAS_Q:
            q_d = tl.load(q_ptr + (start + j).to(tl.int64) * stride_q + d).to(tl.float64)
        u = tl.load(uniform_ptr + start + j).to(tl.float64)
        first_miss = (num_accepted == k) & (u * q_d > p_d.to(tl.float64))
        num_accepted = tl.where(first_miss, j, num_accepted)
        tl.store(out_row + j, d.to(tl.int64), mask=num_accepted == k)

    rejected = num_accepted < k
    row = target_ptr + (start + req + num_accepted).to(tl.int64) * stride_t
    q_row = q_ptr + (start + num_accepted).to(tl.int64) * stride_q
    e_row = exp_ptr + req.to(tl.int64) * stride_e
    d = tl.load(draft_ptr + start + num_accepted, mask=rejected, other=-1)
    q_cols = tl.where(rejected, V, 0)  # the bonus race reads no draft row
    res_val = tl.full([], float("-inf"), tl.float32)
    res_idx = tl.full([], 0, tl.int32)
    p_val = tl.full([], float("-inf"), tl.float32)
    p_idx = tl.full([], 0, tl.int32)
    any_left = tl.full([], 0, tl.int32)
    for v0 in range(0, V, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        mask = cols < V
        p = tl.load(row + cols, mask=mask, other=0.0)
        e = tl.load(e_row + cols, mask=mask, other=1.0)
        if HAS_Q:  # q = 0 for the bonus race: the residual is p
            q = tl.load(q_row + cols, mask=cols < q_cols, other=0.0)
            residual = tl.maximum(p - q, 0.0)
        else:  # d = -1 for the bonus race
            residual = tl.where(cols == d, 0.0, p)
        any_left = tl.maximum(any_left, tl.max((residual > 0).to(tl.int32), axis=0))
        res_val, res_idx = _fold_argmax(
            tl.where(mask, tl.math.div_rn(residual, e), float("-inf")), cols, res_val, res_idx)
        p_val, p_idx = _fold_argmax(
            tl.where(mask, tl.math.div_rn(p, e), float("-inf")), cols, p_val, p_idx)
    token = tl.where(any_left > 0, res_idx, p_idx)
    tl.store(out_row + num_accepted, token.to(tl.int64))


def rejection_sample_triton(
    draft_token_ids: torch.Tensor, num_draft_tokens: list[int], target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None, is_greedy: torch.Tensor, noise: RejectionNoise,
) -> torch.Tensor:
    """`rejection_sample_ref` on the Triton kernels: the same arguments (float32 probabilities
    and noise), the same int64 [B, max k + 1] tokens."""
    _check_float32(target_probs=target_probs, draft_probs=draft_probs,
                   uniform=noise.uniform, exponential=noise.exponential)
    num_reqs = len(num_draft_tokens)
    device = target_probs.device
    out = torch.full((num_reqs, max(num_draft_tokens, default=0) + 1), PLACEHOLDER,
                     dtype=torch.int64, device=device)
    if num_reqs == 0:
        return out
    target, exp = _rows(target_probs), _rows(noise.exponential)
    q = target if draft_probs is None else _rows(draft_probs)
    starts = torch.tensor([0, *accumulate(num_draft_tokens)][:-1], dtype=torch.int32,
                          device=device)
    ks = torch.tensor(num_draft_tokens, dtype=torch.int32, device=device)
    greedy = is_greedy.to(device=device, dtype=torch.int8)
    drafts = draft_token_ids.to(device=device, dtype=torch.int64)
    vocab = target.shape[-1]
    block = min(triton.next_power_of_2(vocab), _MAX_BLOCK)
    _greedy_kernel[(num_reqs,)](out, drafts, starts, ks, greedy, target, target.stride(0),
                                out.stride(0), vocab, BLOCK=block)
    _random_kernel[(num_reqs,)](out, drafts, starts, ks, greedy, target, q,
                                noise.uniform.contiguous(), exp, target.stride(0), q.stride(0),
                                exp.stride(0), out.stride(0), vocab,
                                HAS_Q=draft_probs is not None, BLOCK=block)
    return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with contiguous rows (the kernels step along a row by 1)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_float32(**tensors: torch.Tensor | None) -> None:
    """The kernels read float32: another dtype is an error, not a silent cast (which would
    change the tokens against the reference's)."""
    for name, t in tensors.items():
        if t is not None and t.dtype != torch.float32:
            raise ValueError(f"rejection_sample: {name} is {t.dtype}, expected torch.float32")
