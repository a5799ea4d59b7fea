"""The rejection sampler of speculative decoding (lab/speculative): from the target's
distributions at a request's draft positions, keep the longest accepted prefix of its drafts
plus one token, so that the emitted tokens are distributed exactly as the target's
(Leviathan et al. 2023; Chen et al. 2023; vLLM V1's RejectionSampler).

A request with drafts d_1..d_k has k + 1 rows of target probabilities p_0..p_k (row j: the
distribution of the token after the j-th draft prefix) and, for a draft model, the draft's
probabilities q_1..q_k (a proposer without them, n-gram lookup, proposes a point mass: q(d) = 1).

    random rows:  draft j is accepted when u_j * q_j(d_j) <= p_{j-1}(d_j), u_j ~ U(0, 1);
                  at the first rejection the token is drawn from max(p_{j-1} - q_j, 0)
                  (renormalised; for a point mass: p_{j-1} without d_j); all accepted: the
                  bonus token is drawn from p_k
    greedy rows:  draft j is accepted while argmax p_{j-1} = d_j; the emitted token after the
                  accepted run is the argmax at that position

Draws from a distribution are exponential races (argmax(probs / e), e ~ Exp(1)), as the
non-speculative sampler's (lab/sampling/sampler.py). The noise is drawn before the sampling
(`draw_noise`: a seeded request from its own generator), so the reference here and the Triton
kernel (lab/kernels/triton_rejection.py) compute the same tokens from the same noise.

Layout (flat, vLLM's): `draft_token_ids` [D] the drafts of every request back to back;
`num_draft_tokens` [B]; target rows [D + B]: request i's k_i + 1 rows back to back; draft
probabilities [D, V]. Output [B, max k + 1]: the emitted tokens, then -1.
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


def empty_noise(like: torch.Tensor) -> RejectionNoise:
    """The noise of an all-greedy call: none is read."""
    return RejectionNoise(like.new_empty(0), like.new_empty(0, like.shape[-1]))


def draw_noise(num_draft_tokens: list[int], vocab_size: int,
               generators: list[torch.Generator | None], device: torch.device | str = "cpu"
               ) -> RejectionNoise:
    """Noise for a call: a request with a generator draws its uniforms then its race from it,
    the others share one draw from the global RNG (as the sampler's exponential_noise)."""
    total = sum(num_draft_tokens)
    uniform = torch.empty(total, dtype=torch.float32, device=device)
    exponential = torch.empty(len(num_draft_tokens), vocab_size, dtype=torch.float32,
                              device=device)
    if any(g is None for g in generators):
        uniform.uniform_()
        exponential.exponential_()
    start = 0
    for i, (k, gen) in enumerate(zip(num_draft_tokens, generators)):
        if gen is not None:
            uniform[start : start + k].uniform_(generator=gen)
            exponential[i].exponential_(generator=gen)
        start += k
    exponential.clamp_(min=torch.finfo(torch.float32).tiny)
    return RejectionNoise(uniform, exponential)


def rejection_sample_ref(
    draft_token_ids: torch.Tensor, num_draft_tokens: list[int], target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None, is_greedy: torch.Tensor, noise: RejectionNoise,
) -> torch.Tensor:
    """The reference (module docstring): a loop over requests and their drafts, for clarity.
    `target_probs` [D + B, V] float32 (greedy rows: any scores, only their argmax is read);
    `draft_probs` [D, V] or None (point masses); `is_greedy` bool [B]. Returns int64
    [B, max k + 1]."""
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
