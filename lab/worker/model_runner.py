"""ModelRunner: caches request state, prepares each step's inputs, runs the model, samples.

Request state persists across steps (the scheduler only sends deltas). Each running request owns
a row of the token-id buffer and of the block table; a preempted request gives its row back and
keeps its token ids in its state until it resumes.

The requests of a step also sit in a dense *persistent batch* (vLLM's InputBatch order): batch
index i is row i of the step's logits. The logits processors follow its changes (added, removed,
moved requests) through BatchUpdates and process the whole batch at once. Every scheduled request
is sampled, a partial prefill too (its token is dropped and its seeded generator is not
advanced), so the batch never has to be re-gathered for sampling.

Tensor parallelism (`tp`, the worker's TP group): every rank runs the same steps on the same
SchedulerOutputs and keeps the same request state and persistent batch. `compute_logits` is a
collective, so every rank calls it for the same rows (sampling and prompt logprobs alike); only
the group's first rank gets logits, samples (logits processors, logprobs, prompt logprobs) and
fills the ModelRunnerOutput, then broadcasts the step's sampled ids (one int64 tensor) so the
other ranks append the same tokens. Those return an empty ModelRunnerOutput. A group of one
takes none of these detours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lab.attention.base import AttentionBackend, KVCache, KVScales
from lab.cache.block_table import BlockTable
from lab.distributed.parallel_state import GroupCoordinator
from lab.logits_processors.base import LogitsProcessor
from lab.sampling.logprobs import LogprobsLists
from lab.sampling.metadata import SamplingMetadata, make_generator
from lab.sampling.params import SamplingParams
from lab.sampling.sampler import LogprobsTensors, Sampler, compute_logprobs, gather_logprobs
from lab.scheduler.output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from lab.worker.inputs import BatchRows, StepBatch, prepare_inputs
from lab.worker.persistent_batch import PersistentBatch
from lab.worker.swap import BlockSwapper


@dataclass
class CachedRequestState:
    req_id: str
    params: SamplingParams
    generator: torch.Generator | None
    prompt_token_ids: list[int]
    num_computed: int
    output_token_ids: list[int] = field(default_factory=list)  # live: processors read it
    row: int | None = None  # its row of the token / block tables while it has one
    prompt_logprobs_done: int = 0  # prompt positions whose next-token logprobs were sent

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


class ModelRunner:
    """Runs one step of the model for a SchedulerOutput. Makes no scheduling decision."""

    def __init__(
        self, model: torch.nn.Module, attn_backend: AttentionBackend, device: torch.device,
        block_size: int, max_num_reqs: int, max_model_len: int,
        logits_processors: Sequence[LogitsProcessor] = (), tp: GroupCoordinator | None = None,
    ) -> None:
        self.model = model
        self.tp = tp or GroupCoordinator.single()
        # only the TP group's first rank samples: the others keep no processor state
        self.samples = self.tp.is_first_rank
        self.attn_backend = attn_backend
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.token_ids = np.zeros((max_num_reqs, max_model_len + 1), dtype=np.int64)
        self.block_table = BlockTable(max_num_reqs, -(-max_model_len // block_size))
        self.free_rows = list(range(max_num_reqs - 1, -1, -1))
        self.states: dict[str, CachedRequestState] = {}
        self.batch = PersistentBatch(max_num_reqs)
        self.kv_caches: list[torch.Tensor] = []
        self.kv_scales: KVScales | None = None  # an fp8 cache's scales, calibrated on first write
        self.swapper: BlockSwapper | None = None
        self.processors = list(logits_processors) if self.samples else []
        self.sampler = Sampler(self.processors)

    def initialize_cache(self, kv_cache: KVCache, swapper: BlockSwapper | None = None) -> None:
        """Hold the cache the backend allocated (its layers and, for fp8, its scales)."""
        self.kv_caches, self.kv_scales = kv_cache.layers, kv_cache.scales
        self.swapper = swapper

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._swap(sched)
        self._update_states(sched)
        self._update_batch(sched)
        if sched.is_empty:
            return ModelRunnerOutput()
        req_ids = self.batch.req_ids[: self.batch.num_reqs]
        batch = prepare_inputs(
            self._batch_rows(req_ids, sched), self.token_ids, self.block_table, self.block_size,
            self.max_model_len, self.device, self.kv_scales,
        )
        metadata = self.attn_backend.build_metadata(batch.attn_inputs)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, metadata)
        self._advance_computed(sched)
        states = [self.states[r] for r in req_ids]
        out = ModelRunnerOutput()
        self._prompt_logprobs(states, sched, batch, hidden, out)
        if batch.any_sampled:
            logits = self.model.compute_logits(hidden[batch.logits_indices])
            if self.samples:
                self._sample(states, batch, logits, out)
            else:
                self._receive_sampled(states, batch)
        return out if self.samples else ModelRunnerOutput()

    def _sample(
        self, states: list[CachedRequestState], batch: StepBatch, logits: torch.Tensor,
        out: ModelRunnerOutput,
    ) -> None:
        """Sample every row, keep the tokens of complete prompts, tell the processors."""
        kept = batch.sampled.tolist()
        meta = SamplingMetadata.from_params(
            [s.params for s in states],
            [s.generator if ok else None for s, ok in zip(states, kept)], self.device)
        result = self.sampler.forward(logits, meta)
        self.tp.broadcast(result.sampled)  # the other TP ranks append the same tokens
        tokens = result.sampled.tolist()
        for state, token, ok in zip(states, tokens, kept):
            if ok:
                self._append_token(state, token)
                out.sampled_token_ids[state.req_id] = token
        if self.processors:
            appended = result.sampled.masked_fill(
                ~torch.from_numpy(batch.sampled).to(result.sampled.device), -1)
            for processor in self.processors:
                processor.on_sampled(appended)
        if result.logprobs is not None:
            out.logprobs.update(_logprobs_of(states, kept, result.logprobs))

    def _receive_sampled(self, states: list[CachedRequestState], batch: StepBatch) -> None:
        """A TP rank that does not sample: the first rank's sampled ids of this step (one per
        batch row), appended to the requests whose prompt is complete, as the first rank did."""
        sampled = torch.empty(len(states), dtype=torch.int64, device=self.device)
        tokens = self.tp.broadcast(sampled).tolist()
        for state, token, ok in zip(states, tokens, batch.sampled.tolist()):
            if ok:
                self._append_token(state, token)
    def _swap(self, sched: SchedulerOutput) -> None:
        """Apply the step's KV block swaps (before anything this step writes the cache)."""
        if not (sched.swap_out or sched.swap_in):
            return
        if self.swapper is None:
            raise RuntimeError("the scheduler asked for KV swaps but this worker has no swap "
                               "space (preemption=swap needs cache.swap_space_gb > 0)")
        self.swapper.apply(sched.swap_out, sched.swap_in)

    # -- state ---------------------------------------------------------------------------------
    def _update_states(self, sched: SchedulerOutput) -> None:
        for rid in sched.finished_req_ids:
            state = self.states.pop(rid, None)
            if state is not None and state.row is not None:
                self._release_row(state)
        for rid in sched.preempted_req_ids:
            state = self.states.get(rid)
            if state is not None and state.row is not None:
                self._release_row(state)
        for new in sched.scheduled_new_reqs:
            self._add_request(new)
        for cached in sched.scheduled_cached_reqs:
            self._update_request(cached)

    def _update_batch(self, sched: SchedulerOutput) -> None:
        """The persistent batch holds exactly this step's requests (as vLLM's: finished,
        preempted and unscheduled ones leave it), densely; the processors follow."""
        scheduled = sched.num_scheduled_tokens
        for rid in [r for r in self.batch.req_ids if r is not None and r not in scheduled]:
            self.batch.remove(rid)
        for rid in scheduled:
            if rid not in self.batch:
                state = self.states[rid]
                self.batch.add(rid, state.params, state.prompt_token_ids, state.output_token_ids)
        self.batch.condense()
        update = self.batch.take_update()
        for processor in self.processors:
            processor.update_state(update)

    def _add_request(self, new: NewRequestData) -> None:
        seed = new.sampling_params.seed
        gen = None if seed is None else make_generator(seed, self.device)
        state = CachedRequestState(
            new.req_id, new.sampling_params, gen, list(new.prompt_token_ids),
            new.num_computed_tokens,
        )
        self.states[new.req_id] = state
        self._take_row(state, new.block_ids)

    def _update_request(self, cached: CachedRequestData) -> None:
        state = self.states[cached.req_id]
        state.num_computed = cached.num_computed_tokens
        if cached.resumed_from_preemption:
            if state.row is not None:
                self._release_row(state)
            self._take_row(state, cached.new_block_ids)
        elif cached.new_block_ids:
            self.block_table.append_row(state.row, cached.new_block_ids)

    def _take_row(self, state: CachedRequestState, block_ids: list[int]) -> None:
        state.row = self.free_rows.pop()
        tokens = state.all_token_ids
        self.token_ids[state.row, : len(tokens)] = tokens
        self.block_table.add_row(state.row, block_ids)

    def _release_row(self, state: CachedRequestState) -> None:
        self.block_table.clear_row(state.row)
        self.free_rows.append(state.row)
        state.row = None

    def _append_token(self, state: CachedRequestState, token: int) -> None:
        if state.num_tokens < self.token_ids.shape[1]:
            self.token_ids[state.row, state.num_tokens] = token
        state.output_token_ids.append(token)

    def _advance_computed(self, sched: SchedulerOutput) -> None:
        for rid, n in sched.num_scheduled_tokens.items():
            self.states[rid].num_computed += n

    def _batch_rows(self, req_ids: list[str], sched: SchedulerOutput) -> BatchRows:
        states = [self.states[r] for r in req_ids]
        return BatchRows(
            req_ids=req_ids,
            rows=np.array([s.row for s in states], dtype=np.int64),
            num_computed=np.array([s.num_computed for s in states], dtype=np.int64),
            num_scheduled=np.array([sched.num_scheduled_tokens[r] for r in req_ids],
                                   dtype=np.int64),
            num_tokens=np.array([s.num_tokens for s in states], dtype=np.int64),
        )

    # -- prompt logprobs -------------------------------------------------------------------
    def _prompt_logprobs(
        self, states: list[CachedRequestState], sched: SchedulerOutput, batch: StepBatch,
        hidden: torch.Tensor, out: ModelRunnerOutput,
    ) -> None:
        """For requests that asked: the logprob of every prompt token after the first, from
        the position before it, for the prompt positions computed this step (each position
        once, even when a preempted request recomputes it)."""
        for i, state in enumerate(states):
            k = state.params.prompt_logprobs
            prompt_len = len(state.prompt_token_ids)
            if k is None or state.prompt_logprobs_done >= prompt_len - 1:
                continue
            computed_before = state.num_computed - sched.num_scheduled_tokens[state.req_id]
            first = max(computed_before, state.prompt_logprobs_done)
            last = min(state.num_computed, prompt_len - 1)  # positions [first, last)
            if first >= last:
                continue
            start = int(batch.token_starts[i]) + first - computed_before
            logits = self.model.compute_logits(hidden[start : start + last - first])
            state.prompt_logprobs_done = last
            if logits is None:  # a TP rank that does not sample took part in the collective
                continue
            targets = torch.tensor(state.prompt_token_ids[first + 1 : last + 1],
                                   device=logits.device)
            lp = compute_logprobs(logits)
            k = lp.shape[-1] if k < 0 else min(k, lp.shape[-1])
            out.prompt_logprobs[state.req_id] = _to_lists(gather_logprobs(lp, k, targets))


def _logprobs_of(
    states: list[CachedRequestState], kept: list[bool], lp: LogprobsTensors,
) -> dict[str, LogprobsLists]:
    """Each asking row's entry, cut to the top-k it asked for (the batch computed the most)."""
    rows = [i for i, (s, ok) in enumerate(zip(states, kept)) if ok and s.params.logprobs is not None]
    if not rows:
        return {}
    ids, values, ranks = (lp.token_ids[rows].tolist(), lp.logprobs[rows].tolist(),
                          lp.ranks[rows].tolist())
    result = {}
    for j, i in enumerate(rows):
        k = states[i].params.logprobs
        width = len(ids[j]) if k < 0 else k + 1
        result[states[i].req_id] = LogprobsLists([ids[j][:width]], [values[j][:width]], [ranks[j]])
    return result


def _to_lists(lp: LogprobsTensors) -> LogprobsLists:
    return LogprobsLists(lp.token_ids.tolist(), lp.logprobs.tolist(), lp.ranks.tolist())
