"""Parallel sampling (n > 1): a parent request fanned out into n independent child requests.

As in vLLM, the engine core never sees a parent: child i is request `f"{i}_{parent_id}"` with
n = 1 and, for a seeded parent, seed + i. The prompt is prefilled once: the frontend queues
child 0 first and holds the other children back until child 0 has computed its prompt (its
first token, or its end), so they find every full prompt block in the prefix cache.
(vLLM commits a block's hash when it schedules it, so siblings admitted in the same step share
it; lab commits hashes only once their tokens are computed, so siblings wait one prefill.)
Only child 0 computes prompt logprobs (a request that asks for them cannot read the cache).
"""

from __future__ import annotations

from dataclasses import replace

from lab.core.sampling_params import RequestOutputKind, SamplingParams
from lab.frontend.outputs import CompletionOutput


class ParentRequest:
    """The n children of one user request and how their outputs are reported."""

    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id = request_id
        self.params = params
        self.child_ids = [child_id(i, request_id) for i in range(params.n)]
        self.unfinished = set(self.child_ids)
        self.final: dict[int, CompletionOutput] = {}  # FINAL_ONLY: the finished completions

    @property
    def n(self) -> int:
        return self.params.n

    def child_params(self, index: int) -> SamplingParams:
        seed = None if self.params.seed is None else (self.params.seed + index) % 2**64
        prompt_logprobs = self.params.prompt_logprobs if index == 0 else None
        return replace(self.params, n=1, seed=seed, prompt_logprobs=prompt_logprobs)

    def get_outputs(
        self, child: str, completion: CompletionOutput,
    ) -> tuple[list[CompletionOutput], bool]:
        """The completions to report now for this child's update, and whether the parent is
        finished. Streaming kinds report each child's completion as it comes (its `index`
        says which); FINAL_ONLY reports all n, in index order, once the last one finishes."""
        if completion.finished():
            self.unfinished.discard(child)
        finished = not self.unfinished
        if self.params.output_kind != RequestOutputKind.FINAL_ONLY:
            return [completion], finished
        if completion.finished():
            self.final[completion.index] = completion
        return ([self.final[i] for i in sorted(self.final)] if finished else []), finished


def child_id(index: int, parent_id: str) -> str:
    return f"{index}_{parent_id}"
