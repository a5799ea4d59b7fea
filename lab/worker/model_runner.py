"""ModelRunner: caches request state, prepares each step's inputs, runs the model, samples.

Request state persists across steps (the scheduler only sends deltas). Each running request owns
a row of the token-id buffer and of the block table; a preempted request gives its row back and
keeps its token ids in its state until it resumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lab.attention.base import AttentionBackend, KVCache, KVScales
from lab.cache.block_table import BlockTable
from lab.sampling.metadata import SamplingMetadata, make_generator
from lab.sampling.params import SamplingParams
from lab.sampling.sampler import Sampler
from lab.scheduler.output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from lab.worker.inputs import BatchRows, prepare_inputs
from lab.worker.swap import BlockSwapper


@dataclass
class CachedRequestState:
    req_id: str
    params: SamplingParams
    generator: torch.Generator | None
    num_tokens: int
    num_computed: int
    row: int | None = None
    parked_tokens: list[int] | None = None  # token ids while preempted (no row)


class ModelRunner:
    """Runs one step of the model for a SchedulerOutput. Makes no scheduling decision."""

    def __init__(
        self, model: torch.nn.Module, attn_backend: AttentionBackend, device: torch.device,
        block_size: int, max_num_reqs: int, max_model_len: int,
    ) -> None:
        self.model = model
        self.attn_backend = attn_backend
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.token_ids = np.zeros((max_num_reqs, max_model_len + 1), dtype=np.int64)
        self.block_table = BlockTable(max_num_reqs, -(-max_model_len // block_size))
        self.free_rows = list(range(max_num_reqs - 1, -1, -1))
        self.states: dict[str, CachedRequestState] = {}
        self.kv_caches: list[torch.Tensor] = []
        self.kv_scales: KVScales | None = None  # an fp8 cache's scales, calibrated on first write
        self.swapper: BlockSwapper | None = None
        self.sampler = Sampler()

    def initialize_cache(self, kv_cache: KVCache, swapper: BlockSwapper | None = None) -> None:
        """Hold the cache the backend allocated (its layers and, for fp8, its scales)."""
        self.kv_caches, self.kv_scales = kv_cache.layers, kv_cache.scales
        self.swapper = swapper

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._swap(sched)
        self._update_states(sched)
        if sched.is_empty:
            return ModelRunnerOutput()
        batch = prepare_inputs(
            self._batch_rows(sched), self.token_ids, self.block_table, self.block_size,
            self.max_model_len, self.device, self.kv_scales,
        )
        metadata = self.attn_backend.build_metadata(batch.attn_inputs)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, metadata)
        self._advance_computed(sched)
        if not batch.sampled_req_ids:
            return ModelRunnerOutput()
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        states = [self.states[r] for r in batch.sampled_req_ids]
        meta = SamplingMetadata.from_params(
            [s.params for s in states], [s.generator for s in states], self.device
        )
        tokens = self.sampler(logits, meta).tolist()
        for state, token in zip(states, tokens):
            self._append_token(state, token)
        return ModelRunnerOutput(dict(zip(batch.sampled_req_ids, tokens)))

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
                self._park(state)
        for new in sched.scheduled_new_reqs:
            self._add_request(new)
        for cached in sched.scheduled_cached_reqs:
            self._update_request(cached)

    def _add_request(self, new: NewRequestData) -> None:
        seed = new.sampling_params.seed
        gen = None if seed is None else make_generator(seed, self.device)
        state = CachedRequestState(
            new.req_id, new.sampling_params, gen, len(new.prompt_token_ids),
            new.num_computed_tokens,
        )
        self.states[new.req_id] = state
        self._take_row(state, new.prompt_token_ids, new.block_ids)

    def _update_request(self, cached: CachedRequestData) -> None:
        state = self.states[cached.req_id]
        state.num_computed = cached.num_computed_tokens
        if cached.resumed_from_preemption:
            tokens = state.parked_tokens if state.row is None else self._tokens_of(state)
            if state.row is not None:
                self._release_row(state)
            self._take_row(state, tokens, cached.new_block_ids)
        elif cached.new_block_ids:
            self.block_table.append_row(state.row, cached.new_block_ids)

    def _take_row(self, state: CachedRequestState, tokens: list[int], block_ids: list[int]) -> None:
        state.row = self.free_rows.pop()
        state.parked_tokens = None
        self.token_ids[state.row, : len(tokens)] = tokens
        self.block_table.add_row(state.row, block_ids)

    def _park(self, state: CachedRequestState) -> None:
        state.parked_tokens = self._tokens_of(state)
        self._release_row(state)

    def _release_row(self, state: CachedRequestState) -> None:
        self.block_table.clear_row(state.row)
        self.free_rows.append(state.row)
        state.row = None

    def _tokens_of(self, state: CachedRequestState) -> list[int]:
        return self.token_ids[state.row, : state.num_tokens].tolist()

    def _append_token(self, state: CachedRequestState, token: int) -> None:
        if state.num_tokens < self.token_ids.shape[1]:
            self.token_ids[state.row, state.num_tokens] = token
        state.num_tokens += 1

    def _advance_computed(self, sched: SchedulerOutput) -> None:
        for rid, n in sched.num_scheduled_tokens.items():
            self.states[rid].num_computed += n

    def _batch_rows(self, sched: SchedulerOutput) -> BatchRows:
        req_ids = list(sched.num_scheduled_tokens)
        states = [self.states[r] for r in req_ids]
        return BatchRows(
            req_ids=req_ids,
            rows=np.array([s.row for s in states], dtype=np.int64),
            num_computed=np.array([s.num_computed for s in states], dtype=np.int64),
            num_scheduled=np.array(list(sched.num_scheduled_tokens.values()), dtype=np.int64),
            num_tokens=np.array([s.num_tokens for s in states], dtype=np.int64),
        )
