"""ModelRunner: caches request state, prepares each step's inputs, runs the model, samples.

Request state persists across steps (the scheduler only sends deltas). Each running request owns
a row of the token-id buffer and of the block table; a preempted request gives its row back and
keeps its token ids in its state until it resumes.

The requests of a step also sit in a dense *persistent batch* (vLLM's InputBatch order): batch
index i is row i of the step's logits. Its row stores (lab/worker/persistent_batch.py) hold what
a step reads as slices [:num_reqs] — the inputs' rows (token-table row, computed and held
tokens), the sampling parameters (lab/worker/sampling_state.py: the SamplingMetadata is rebuilt
from them only when the batch changed) and the request states — and follow its adds, removes
and moves, as the logits processors do through BatchUpdates. Every scheduled request is sampled,
a partial prefill too (its token is dropped and its seeded generator is not advanced), so the
batch is never re-gathered for sampling. The Python loops left per step read the
SchedulerOutput's per-request entries and append kept tokens to the requests' output lists (as
vLLM's); the index arithmetic is numpy into persistent buffers (pinned on CUDA, copied without
blocking). A uniform decode batch runs padded to a capture size from static buffers when the
runner has a PaddedDecode (lab/worker/cudagraph.py): a CUDA-graph replay, or eagerly on a CPU.

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

import numpy as np
import torch

from lab.attention.base import AttentionBackend, KVCache, KVScales
from lab.cache.block_table import GroupBlockTables
from lab.config.knobs import EngineKnobs
from lab.core.logprobs import LogprobsLists
from lab.core.step import CachedRequestData, ModelRunnerOutput, NewRequestData, SchedulerOutput
from lab.distributed.parallel_state import GroupCoordinator
from lab.kernels.cpu_argmax import argmax_rows_ref
from lab.kernels.rejection import PLACEHOLDER, rejection_sample_ref
from lab.layers.ops import LayerOps
from lab.logits_processors.base import LogitsProcessor
from lab.sampling.metadata import make_generator
from lab.sampling.sampler import LogprobsTensors, Sampler
from lab.speculative.base import KVBinding, ProposeInputs, Proposer
from lab.worker.buffers import InputBuffers
from lab.worker.cudagraph import PaddedDecode, padding_applies
from lab.worker.inputs import (
    BatchRows,
    InputRows,
    StepBatch,
    prepare_inputs,
    prepare_padded_decode,
    spec_logits_indices,
)
from lab.worker.persistent_batch import ObjectRows, PersistentBatch
from lab.worker.request_state import CachedRequestState
from lab.worker.sampling_state import NO_LOGPROBS, SamplingRows
from lab.worker.step_logprobs import prompt_logprobs, sampled_logprobs
from lab.worker.swap import BlockSwapper
from lab.worker.ubatch import UbatchKnobs, run_model


class ModelRunner:
    """Runs one step of the model for a SchedulerOutput. Makes no scheduling decision."""

    def __init__(
        self, model: torch.nn.Module, attn_backend: AttentionBackend, device: torch.device,
        block_size: int, max_num_reqs: int, max_model_len: int,
        logits_processors: Sequence[LogitsProcessor] = (), tp: GroupCoordinator | None = None,
        max_num_tokens: int | None = None, cudagraph_sizes: Sequence[int] = (),
        ubatch: UbatchKnobs | None = None, ops: LayerOps | None = None,
        layer_groups: Sequence[int] | None = None, proposer: Proposer | None = None,
    ) -> None:
        """`max_num_tokens`: the most tokens of one step (max_num_batched_tokens; None:
        max_model_len); `cudagraph_sizes`: the decode sizes to pad to (resolved already,
        lab/worker/cudagraph.py; () = never pad); `ubatch`: when an eager step runs as two
        micro-batches (lab/worker/ubatch.py; off by default); `ops`: the kernels option, whose
        `argmax_rows` and `rejection_sample` the sampler uses (None: the references);
        `proposer`: speculative decoding's (lab/speculative; None: off)."""
        self.model = model
        self.tp = tp or GroupCoordinator.single()
        # only the TP group's first rank samples: the others keep no processor state
        self.samples = self.tp.is_first_rank
        self.attn_backend = attn_backend
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.token_ids = np.zeros((max_num_reqs, max_model_len + 1), dtype=np.int64)
        self.layer_groups = tuple(layer_groups or ())
        num_groups = max(self.layer_groups, default=0) + 1
        self.block_table = GroupBlockTables(num_groups, max_num_reqs,
                                            -(-max_model_len // block_size))
        self.free_rows = list(range(max_num_reqs - 1, -1, -1))
        self.states: dict[str, CachedRequestState] = {}
        pin = device.type == "cuda"
        self.rows = InputRows(max_num_reqs)
        self.sampling_rows = SamplingRows(max_num_reqs, device, pin)
        self.row_states = ObjectRows(max_num_reqs)
        self.batch = PersistentBatch(max_num_reqs,
                                     [self.rows, self.sampling_rows, self.row_states])
        self.buffers = InputBuffers(max_num_reqs, max(max_num_tokens or max_model_len,
                                                      max_num_reqs),
                                    self.block_table.max_blocks_per_req, device, pin,
                                    num_groups=num_groups)
        self.cudagraph_sizes = tuple(cudagraph_sizes)
        self.ubatch = ubatch or EngineKnobs()  # the declared defaults: micro-batching off
        self.padded: PaddedDecode | None = None
        self.prompt_logprobs_reqs: dict[str, None] = {}  # requests still owed prompt logprobs
        self.kv_caches: list[torch.Tensor] = []
        self.kv_scales: KVScales | None = None  # an fp8 cache's scales, calibrated on first write
        self.swapper: BlockSwapper | None = None
        self.processors = list(logits_processors) if self.samples else []
        self.sampler = Sampler(self.processors,
                               argmax=ops.argmax_rows if ops is not None else argmax_rows_ref)
        self.rejection_sample = (ops.rejection_sample if ops is not None
                                 else rejection_sample_ref)
        self.proposer = proposer if self.samples else None

    def initialize_cache(self, kv_cache: KVCache, swapper: BlockSwapper | None = None,
                         num_blocks: int = 0) -> None:
        """Hold the cache the backend allocated (its layers and, for fp8, its scales) of
        `num_blocks` blocks, set up the padded decode path if it applies
        (lab/worker/cudagraph.py), and let the proposer bind its own KV to the blocks."""
        self.kv_caches, self.kv_scales = kv_cache.layers, kv_cache.scales
        self.swapper = swapper
        self.padded = self._padded_decode()
        if self.proposer is not None:
            self.proposer.bind_kv(KVBinding(
                token_ids=self.token_ids, block_table=self.block_table.group(0),
                num_blocks=num_blocks, kv_dtype=kv_cache.layers[0].dtype,
                block_size=self.block_size, max_model_len=self.max_model_len,
                max_num_reqs=self.token_ids.shape[0], max_num_tokens=self.buffers.max_num_tokens,
                device=self.device))

    def _padded_decode(self) -> PaddedDecode | None:
        if not self.cudagraph_sizes or not padding_applies(
                self.attn_backend, self.device, self.tp.world_size, self.kv_scales is not None):
            return None
        return PaddedDecode(self.cudagraph_sizes, self.model, self.attn_backend, self.buffers,
                            self.block_size, self.max_model_len, self.device,
                            self.layer_groups)

    def capture_graphs(self) -> int:
        """Capture the padded decode's CUDA graphs (CUDA only); how many were captured."""
        if self.padded is None or not self.padded.can_capture:
            return 0
        if not self.padded.capture(self.kv_caches):
            self.padded = None
            return 0
        return len(self.padded.graphs)

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.buffers.fence.wait()  # the last step's copies have read the host buffers
        self._swap(sched)
        self._update_states(sched)
        self._update_batch(sched)
        if sched.is_empty:
            return ModelRunnerOutput()
        n = self.batch.num_reqs
        req_ids = self.batch.req_ids
        rows = self.rows.step(np.fromiter(map(sched.num_scheduled_tokens.__getitem__, req_ids),
                                          dtype=np.int64, count=n))
        drafts = self._write_drafts(req_ids, sched.scheduled_spec_decode_tokens)
        batch = self._prepare(rows)
        if drafts is not None:
            batch.logits_indices = spec_logits_indices(batch, rows, drafts, self.device)
        hidden = self._forward(batch)
        self.rows.num_computed[:n] += rows.num_scheduled
        out = ModelRunnerOutput()
        self._prompt_logprobs(rows, batch, hidden, out)
        if batch.any_sampled:
            logits = self.model.compute_logits(hidden[batch.logits_indices])
            if drafts is not None:
                self._verify(req_ids, batch, logits, drafts, sched, out)
            elif self.samples:
                self._sample(req_ids, batch, logits, out)
            else:
                self._receive_sampled(batch)
        if self.proposer is not None:  # a step of prompt chunks only too: a draft's KV of them
            self._propose(req_ids, batch, rows, hidden, drafts, out)
        self.buffers.fence.record()
        return out if self.samples else ModelRunnerOutput()

    def _write_drafts(self, req_ids: list[str], spec: dict[str, list[int]]
                      ) -> np.ndarray | None:
        """Put the step's drafts after each request's tokens in the token table (its held
        tokens are not advanced: they are verified, not yet emitted); the drafts per batch row,
        None when the step has none."""
        if not spec:
            return None
        num = np.zeros(len(req_ids), dtype=np.int64)
        index = self.batch.index_map
        for rid, tokens in spec.items():
            i = index[rid]
            num[i] = len(tokens)
            start = self.rows.num_tokens[i]
            self.token_ids[self.rows.token_row[i], start : start + len(tokens)] = tokens
        return num

    def _prepare(self, rows: BatchRows) -> StepBatch:
        size = (self.padded.size_for(len(rows.num_scheduled))
                if self.padded is not None and rows.is_uniform_decode else None)
        if size is not None:
            return prepare_padded_decode(rows, self.token_ids, self.block_table, self.block_size,
                                         self.max_model_len, self.buffers, size,
                                         self.layer_groups)
        return prepare_inputs(rows, self.token_ids, self.block_table, self.block_size,
                              self.max_model_len, self.buffers, self.kv_scales,
                              self.layer_groups)

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        """The step's hidden states (a padded decode: P rows, the first num_reqs real)."""
        if batch.padded_size is not None:
            return self.padded.run(batch, self.kv_caches)
        return run_model(self.model, self.attn_backend, batch, self.kv_caches, self.ubatch)

    def _sample(self, req_ids: list[str], batch: StepBatch, logits: torch.Tensor,
                out: ModelRunnerOutput) -> None:
        """Sample every row, keep the tokens of complete prompts, tell the processors."""
        kept = batch.sampled
        meta = self.sampling_rows.metadata(len(req_ids), kept)
        result = self.sampler.forward(logits, meta)
        self.tp.broadcast(result.sampled)  # the other TP ranks append the same tokens
        tokens = result.sampled.tolist()
        idx = self._append_sampled(kept, tokens)
        out.sampled_token_ids.update((req_ids[i], [tokens[i]]) for i in idx)
        if self.processors:
            appended = result.sampled.masked_fill(
                ~torch.from_numpy(kept).to(result.sampled.device), -1)
            for processor in self.processors:
                processor.on_sampled(appended)
        if result.logprobs is not None:
            out.logprobs.update(self._logprobs_of(req_ids, kept, result.logprobs))

    def _verify(self, req_ids: list[str], batch: StepBatch, logits: torch.Tensor,
                drafts: np.ndarray, sched: SchedulerOutput, out: ModelRunnerOutput) -> None:
        """Speculative decoding's sampling: every request's emitted tokens (accepted drafts
        and one more; lab/sampling/rejection.py), appended where its prompt is complete."""
        kept = batch.sampled
        n = len(req_ids)
        width = int(drafts.max()) + 1
        if not self.samples:  # a TP rank that does not sample: the first rank's tokens
            tokens = torch.empty(n, width, dtype=torch.int64, device=self.device)
            self._append_emitted(kept, self.tp.broadcast(tokens).tolist())
            return
        meta = self.sampling_rows.metadata(n, kept)
        draft_ids = torch.tensor([t for rid in req_ids
                                  for t in sched.scheduled_spec_decode_tokens.get(rid, ())],
                                 dtype=torch.int64, device=logits.device)
        result = self.sampler.verify(logits, meta, drafts.tolist(), draft_ids,
                                     self.rejection_sample)
        tokens = result.tokens  # [n, width]: the other ranks receive it by that shape
        self.tp.broadcast(tokens)
        lists = tokens.tolist()
        idx = self._append_emitted(kept, lists)
        emitted = {i: [t for t in lists[i] if t != PLACEHOLDER] for i in idx}
        out.sampled_token_ids.update((req_ids[i], emitted[i]) for i in idx)
        if self.processors:
            masked = tokens.masked_fill(~torch.from_numpy(kept).to(tokens.device).unsqueeze(1),
                                        PLACEHOLDER)
            for j in range(tokens.shape[1]):
                column = masked[:, j]
                if bool((column != PLACEHOLDER).any()):
                    for processor in self.processors:
                        processor.on_sampled(column)
        if result.logprobs is not None:
            out.logprobs.update(self._spec_logprobs_of(req_ids, lists, kept, result.logprobs))

    def _spec_logprobs_of(self, req_ids: list[str], lists: list[list[int]], kept: np.ndarray,
                          lp: LogprobsTensors) -> dict[str, LogprobsLists]:
        """The logprobs of every emitted token of the kept rows that asked (`lp` holds one entry
        per emitted token of every row, row by row)."""
        asked = self.sampling_rows.num_logprobs[: len(req_ids)]
        ids, values, ranks = lp.token_ids.tolist(), lp.logprobs.tolist(), lp.ranks.tolist()
        result, start = {}, 0
        for i, row in enumerate(lists):
            count = sum(t != PLACEHOLDER for t in row)
            if kept[i] and asked[i] != NO_LOGPROBS:
                width = None if asked[i] < 0 else int(asked[i]) + 1
                span = range(start, start + count)
                result[req_ids[i]] = LogprobsLists([ids[j][:width] for j in span],
                                                   [values[j][:width] for j in span],
                                                   [ranks[j] for j in span])
            start += count
        return result

    def _append_emitted(self, kept: np.ndarray, lists: list[list[int]]) -> list[int]:
        """Append row i's emitted tokens (PLACEHOLDER-padded) to its request wherever kept[i];
        the kept rows."""
        idx = np.flatnonzero(kept).tolist()
        width = self.token_ids.shape[1]
        states = self.row_states.items
        for i in idx:
            tokens = [t for t in lists[i] if t != PLACEHOLDER]
            pos = int(self.rows.num_tokens[i])
            end = min(pos + len(tokens), width)
            self.token_ids[self.rows.token_row[i], pos:end] = tokens[: end - pos]
            self.rows.num_tokens[i] += len(tokens)
            states[i].output_token_ids.extend(tokens)
        return idx

    def _propose(self, req_ids: list[str], batch: StepBatch, rows: BatchRows,
                 hidden: torch.Tensor, drafts: np.ndarray | None,
                 out: ModelRunnerOutput) -> None:
        """The proposer's drafts for the requests that emitted tokens this step, for the next
        step to verify (none for those it cannot serve, or whose context or max_tokens is
        reached). It sees every request of the step (a draft model writes its own KV of the
        prompt chunks too)."""
        n = len(req_ids)
        num_tokens = self.rows.num_tokens[:n].copy()
        emitted = np.fromiter((len(out.sampled_token_ids.get(rid, ())) for rid in req_ids),
                              dtype=np.int64, count=n)
        rejected = np.zeros(n, dtype=np.int64)
        if drafts is not None:
            rejected = np.where(batch.sampled, np.maximum(drafts + 1 - emitted, 0), 0)
        states = self.row_states.items[:n]
        serve = np.fromiter((s.speculates for s in states), dtype=bool, count=n)
        # the next step computes positions num_tokens - 1 .. num_tokens - 1 + drafts, which the
        # scheduler keeps below max_model_len - 1, and a request emits at most its max_tokens:
        # drafts past either are never verified
        left = np.fromiter((_tokens_left(s) for s in states), dtype=np.int64, count=n)
        room = np.minimum(np.maximum(self.max_model_len - 1 - num_tokens, 0),
                          np.maximum(left - 1, 0))
        k = self.proposer.num_speculative_tokens
        inputs = ProposeInputs(
            req_ids=list(req_ids), token_ids=self.token_ids, rows=rows.rows.copy(),
            num_tokens=num_tokens,
            max_drafts=np.where(serve & batch.sampled, np.minimum(room, k), 0),
            num_computed=rows.num_computed, num_scheduled=rows.num_scheduled,
            num_rejected=rejected, sampled=batch.sampled, step=batch, hidden=hidden)
        for rid, tokens in zip(req_ids, self.proposer.propose(inputs)):
            if tokens:
                out.spec_token_ids[rid] = list(tokens)

    def _receive_sampled(self, batch: StepBatch) -> None:
        """A TP rank that does not sample: the first rank's sampled ids of this step (one per
        batch row), appended to the requests whose prompt is complete, as the first rank did."""
        sampled = torch.empty(len(batch.sampled), dtype=torch.int64, device=self.device)
        self._append_sampled(batch.sampled, self.tp.broadcast(sampled).tolist())

    def _append_sampled(self, kept: np.ndarray, tokens: list[int]) -> list[int]:
        """Append row i's token to its request wherever kept[i]; the kept rows."""
        idx = np.flatnonzero(kept)
        rows, pos = self.rows.token_row[idx], self.rows.num_tokens[idx]
        fits = pos < self.token_ids.shape[1]
        self.token_ids[rows[fits], pos[fits]] = np.asarray(tokens, dtype=np.int64)[idx[fits]]
        self.rows.num_tokens[idx] += 1
        idx = idx.tolist()
        states = self.row_states.items
        for i in idx:
            states[i].output_token_ids.append(tokens[i])
        return idx

    def _logprobs_of(self, req_ids: list[str], kept: np.ndarray,
                     lp: LogprobsTensors) -> dict[str, LogprobsLists]:
        """The sampled logprobs of the kept rows that asked for them."""
        n = len(req_ids)
        rows = np.flatnonzero(kept & (self.sampling_rows.num_logprobs[:n] != NO_LOGPROBS))
        if not rows.size:
            return {}
        return sampled_logprobs(req_ids, rows.tolist(),
                                self.sampling_rows.num_logprobs[rows].tolist(), lp)

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
            self.prompt_logprobs_reqs.pop(rid, None)
            if state is not None:
                self._leave(state)
        for rid in sched.preempted_req_ids:
            state = self.states.get(rid)
            if state is not None:
                self._leave(state)
        for new in sched.scheduled_new_reqs:
            self._add_request(new)
        states, index, num_computed = self.states, self.batch.index_map, self.rows.num_computed
        for cached in sched.scheduled_cached_reqs:  # the hot loop: one per running request
            state = states[cached.req_id]
            state.num_computed = cached.num_computed_tokens
            if cached.resumed_from_preemption or cached.trimmed or any(cached.new_block_ids):
                self._update_blocks(state, cached)
            i = index.get(cached.req_id)
            if i is not None:  # in the batch: the scheduler's count is the truth
                num_computed[i] = cached.num_computed_tokens

    def _leave(self, state: CachedRequestState) -> None:
        """A finished or preempted request gives back its batch row and its table row."""
        if state.req_id in self.batch:
            self.batch.remove(state.req_id)
        if state.row is not None:
            self._release_row(state)

    def _update_batch(self, sched: SchedulerOutput) -> None:
        """The persistent batch holds exactly this step's requests (as vLLM's: finished,
        preempted and unscheduled ones leave it), densely; the processors follow."""
        scheduled = sched.num_scheduled_tokens
        for rid in sorted(self.batch.ids - scheduled.keys(), key=self.batch.index_of):
            self.batch.remove(rid)
        if len(self.batch) < len(scheduled):
            for rid in scheduled:  # adds in the schedule's order
                if rid not in self.batch:
                    self._add_to_batch(self.states[rid])
        self.batch.condense()
        update = self.batch.take_update()
        for processor in self.processors:
            processor.update_state(update)

    def _add_to_batch(self, state: CachedRequestState) -> None:
        """Put a request in the batch and write its row of every store."""
        i = self.batch.add(state.req_id, state.params, state.prompt_token_ids,
                           state.output_token_ids)
        self.rows.set_row(i, state.row, state.num_computed, state.num_tokens)
        self.sampling_rows.set_row(i, state.params, state.generator)
        self.row_states.items[i] = state

    def _add_request(self, new: NewRequestData) -> None:
        seed = new.sampling_params.seed
        gen = None if seed is None else make_generator(seed, self.device)
        state = CachedRequestState(
            new.req_id, new.sampling_params, gen, list(new.prompt_token_ids),
            new.num_computed_tokens,
            speculates=all(type(p).speculates(new.sampling_params) for p in self.processors),
        )
        self.states[new.req_id] = state
        if new.sampling_params.prompt_logprobs is not None:
            self.prompt_logprobs_reqs[new.req_id] = None
        self._take_row(state, new.block_ids)

    def _update_blocks(self, state: CachedRequestState, cached: CachedRequestData) -> None:
        """A resumed request takes a fresh row with its new blocks; another appends them, after
        dropping the blocks the scheduler freed past its computed tokens (`trimmed`)."""
        if cached.resumed_from_preemption:
            if state.row is not None:
                self._release_row(state)
            self._take_row(state, cached.new_block_ids)
            return
        if cached.trimmed:
            keep = -(-cached.num_computed_tokens // self.block_size)
            self.block_table.truncate_row(state.row, keep)
        self.block_table.append_row(state.row, cached.new_block_ids)

    def _take_row(self, state: CachedRequestState, block_ids: tuple[list[int], ...]) -> None:
        state.row = self.free_rows.pop()
        tokens = state.all_token_ids
        self.token_ids[state.row, : len(tokens)] = tokens
        self.block_table.add_row(state.row, block_ids)

    def _release_row(self, state: CachedRequestState) -> None:
        self.block_table.clear_row(state.row)
        self.free_rows.append(state.row)
        state.row = None

    # -- prompt logprobs -------------------------------------------------------------------
    def _prompt_logprobs(self, rows: BatchRows, batch: StepBatch, hidden: torch.Tensor,
                         out: ModelRunnerOutput) -> None:
        """The prompt logprobs of this step's positions (lab/worker/step_logprobs.py) for the
        requests still owed some, in batch order (every TP rank makes the same compute_logits
        calls)."""
        if not self.prompt_logprobs_reqs:
            return
        owed = sorted(self.batch.index_of(r) for r in self.prompt_logprobs_reqs
                      if r in self.batch)
        for i in owed:
            state = self.row_states.items[i]
            lists = prompt_logprobs(self.model, state, int(rows.num_computed[i]),
                                    int(rows.num_scheduled[i]), int(batch.token_starts[i]),
                                    hidden)
            if lists is not None:
                out.prompt_logprobs[state.req_id] = lists
            if state.prompt_logprobs_done >= len(state.prompt_token_ids) - 1:
                self.prompt_logprobs_reqs.pop(state.req_id)


def _tokens_left(state: CachedRequestState) -> int:
    """The tokens a request may still emit (its max_tokens; unbounded: a large number)."""
    max_tokens = state.params.max_tokens
    return 2**62 if max_tokens is None else max_tokens - len(state.output_token_ids)
