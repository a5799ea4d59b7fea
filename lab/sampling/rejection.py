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
(`draw_noise`: a seeded request from its own generator), so the reference and the Triton kernel
(lab/kernels/rejection.py, the `rejection_sample` op of lab/layers/ops.py: callers use
`ops.rejection_sample`) compute the same tokens from the same noise.

Layout (flat, vLLM's): `draft_token_ids` [D] the drafts of every request back to back;
`num_draft_tokens` [B]; target rows [D + B]: request i's k_i + 1 rows back to back; draft
probabilities [D, V]. Output [B, max k + 1]: the emitted tokens, then -1.
"""

from __future__ import annotations

import torch

# the op's types live beside it (lab.kernels imports no other lab package)
from lab.kernels.rejection import PLACEHOLDER, RejectionNoise

__all__ = ["PLACEHOLDER", "RejectionNoise", "draw_noise", "empty_noise"]


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
