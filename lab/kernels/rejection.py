"""The rejection sampler of speculative decoding (PyTorch reference). The rule, the
noise and the flat layout are lab/sampling/rejection.py's docstring; `draw_noise` there draws
the `RejectionNoise` both implementations read, so they emit the same tokens.

The noise type and the output's placeholder live here, beside the op, because lab.kernels is a
leaf package (tests/test_layering.py): lab/sampling/rejection.py re-exports them.

"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PLACEHOLDER = -1  # an output slot past a request's emitted tokens


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
