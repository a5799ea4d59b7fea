"""What crosses from the scheduler to the worker (ids, counts, block ids; never tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.core.logprobs import LogprobsLists
from lab.core.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the worker has not seen: everything it needs to cache its state."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]  # one list per KV cache group (lab/cache/groups.py)
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """A delta for a request the worker already holds.

    resumed_from_preemption: the block ids replace the old ones instead of being appended.
    trimmed: since it was last scheduled, the scheduler freed its blocks past its computed tokens
    (rejected drafts' and lookahead slots, speculative decoding): the worker keeps the first
    cdiv(num_computed_tokens, block_size) of each group before appending the new ones.
    """

    req_id: str
    new_block_ids: tuple[list[int], ...]  # one list per KV cache group
    num_computed_tokens: int
    resumed_from_preemption: bool = False
    trimmed: bool = False


@dataclass(frozen=True)
class StepShape:
    """What a step asks of the device, in model-independent counts: what step-time models
    (lab/sim) predict from and what steps.jsonl records, so a profile fitted on real steps
    applies to simulated ones.

    A request of the step is a *decode* when it computes exactly one token, its last
    (q = 1 new token after c computed ones, c + 1 = its length); every other request is a
    *prefill* chunk (a prompt chunk, or tokens recomputed after a preemption). For a prefill
    chunk of q tokens after c computed ones, causal attention scores q*c + q*(q+1)/2
    query-key pairs; a decode reads c + 1 keys.

        num_tokens = prefill tokens + num_decode_reqs

    The rest is what an operator-level model (lab/sim/step_time/profiled.py) needs: each
    prefill chunk's (q, c), the longest query and context of the step (a backend that attends
    over a padded [requests, max_query_len, max_context_len] view pays for that geometry), the
    requests that sample a token (a decode, or a chunk that reaches the end of its request) and
    those new to the worker (admitted or resumed: their state is built this step).

    Speculative decoding (lab/speculative): a request verifying s drafts computes its last token
    and the drafts, q = 1 + s after c, and reaches its end: it is a prefill chunk (q, c) that
    samples. That is its real geometry — its attention scores q*c + q*(q+1)/2 pairs and reads
    its context once, as a chunk's — so step-time models price it as one; `num_draft_tokens`
    (the drafts the step verifies) is what they add: the LM head and the sampler score
    1 + s rows for it, not one.
    """

    num_tokens: int = 0
    num_prefill_reqs: int = 0
    num_decode_reqs: int = 0
    prefill_attention_pairs: int = 0  # sum over prefill chunks of q*c + q*(q+1)/2
    decode_context_tokens: int = 0  # sum over decodes of c + 1 (keys read)
    swap_in_blocks: int = 0
    swap_out_blocks: int = 0
    prefill_chunks: tuple[tuple[int, int], ...] = ()  # (q, c) of each prefill chunk
    max_query_len: int = 0
    max_context_len: int = 0  # max over the step's requests of c + q
    num_sampled_reqs: int = 0
    num_new_reqs: int = 0  # admitted or resumed this step
    num_finished_reqs: int = 0  # known after the step (the simulator's executor sets it)
    after_idle: bool = False  # the engine waited for an arrival before it (the simulator sets it)
    num_draft_tokens: int = 0  # drafts the step verifies (the scheduler sets it)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_reqs

    @property
    def num_reqs(self) -> int:
        return self.num_prefill_reqs + self.num_decode_reqs

    @staticmethod
    def of(chunks: list[tuple[int, int, int]], swap_in: int = 0, swap_out: int = 0,
           num_new: int = 0, num_drafts: int = 0) -> StepShape:
        """The shape of a step from (new tokens q, computed before c, request length) per
        request; `num_new` of them are new to the worker; `num_drafts` drafts it verifies."""
        decodes = pairs = context = total = sampled = max_q = max_ctx = 0
        prefills = []
        for q, c, length in chunks:
            total += q
            max_q, max_ctx = max(max_q, q), max(max_ctx, c + q)
            sampled += c + q >= length
            if q == 1 and c + 1 == length:
                decodes += 1
                context += c + 1
            else:
                prefills.append((q, c))
                pairs += q * c + q * (q + 1) // 2
        return StepShape(total, len(prefills), decodes, pairs, context, swap_in, swap_out,
                         tuple(prefills), max_q, max_ctx, sampled, num_new,
                         num_draft_tokens=num_drafts)


@dataclass
class SchedulerOutput:
    """One step's schedule. num_computed_tokens above are the values *before* this step."""

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # KV block copies the worker applies before the forward pass: every swap-out, then every
    # swap-in. swap_out: (device block, cpu block); swap_in: (cpu block, device block).
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    shape: StepShape = field(default_factory=StepShape)  # for step-time models and statistics
    step_id: int = 0  # the scheduler's count of schedule() calls: which step this is
    # the drafts each request's scheduled tokens end with (speculative decoding,
    # lab/speculative): the step verifies them; absent: none
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0

    @property
    def has_work(self) -> bool:
        """Whether the worker must see this step: tokens, preemptions, swaps or finished ids."""
        return bool(self.total_num_scheduled_tokens or self.preempted_req_ids or self.swap_out
                    or self.swap_in or self.finished_req_ids)


@dataclass
class ModelRunnerOutput:
    """What the worker returns: the tokens each request whose prompt is complete emits this step
    (one, or with speculative decoding its accepted drafts and one more: lab/speculative), the
    logprobs of those tokens (requests that asked), the prompt logprobs of the prompt positions
    computed this step (requests that asked), and the proposer's drafts for the next step."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
