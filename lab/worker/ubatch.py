"""Micro-batching (vLLM's ubatching / dual batch overlap, DBO): one step's flat token batch run
as two micro-batches of balanced token counts, their hidden states concatenated back in the
step's token order. Design, costs and measurements: docs/ubatch.md.

The split point is the token midpoint, wherever it falls (vLLM's rule): between two requests,
or inside one (a prefill chunk), which then becomes two requests, one per micro-batch:

    tokens:   | req 0 (5) | req 1 (8)                | req 2 | req 3 |    T = 15, split = 8
              0           5         8                13      14      15
    ubatch A: | req 0     | req 1 [0:3] |                                requests [0, 2), tokens [0, 8)
    ubatch B:                           | req 1 [3:8] | req 2 | req 3 |   requests [1, 4), tokens [8, 15)

    req 1 (c tokens cached):  in A  num_computed c,      query 3, seq_len c + 3
                              in B  num_computed c + 3,  query 5, seq_len c + 8

Positions and slots are per token, so they are sliced as they are; the per-request fields
(query_start_loc, num_computed, seq_lens, block_table rows) are rebuilt from the host copies.
B's part of req 1 attends over positions [0, c + 3) through the paged cache: it sees A's three
tokens of that request because A writes their KV before B's attention reads it, layer by layer
(run sequentially A runs whole first; interleaved, A is ahead at every layer: see
lab/worker/ubatch_overlap.py). Nothing else crosses between the micro-batches: lab's
KVCacheManager commits a block to the prefix cache only after the step that computed it
(lab/cache/manager.py), so no request of a step reads a block another request of the same step
writes. (vLLM shares blocks within a step and vetoes a split that would separate such a reader
from its writer, `_allow_microbatching`; lab needs that veto only if it ever shares them too.)

Padding tokens beyond `num_actual_tokens` (slot -1) stay with B, at the end.

Entry point (what the model runner calls in place of `model(...)`):

    hidden = run_model(model, attn_backend, batch, kv_caches, cfg)   # cfg: the three knobs
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from lab.attention.base import AttentionInputs, build_step_metadata

if TYPE_CHECKING:
    from lab.worker.inputs import StepBatch


class UbatchKnobs(Protocol):
    """The engine knobs of micro-batching (declared in lab/config/knobs.py: EngineKnobs)."""

    enable_dbo: bool
    dbo_decode_token_threshold: int
    dbo_prefill_token_threshold: int


@dataclass(frozen=True)
class UbatchSlice:
    """One micro-batch: the requests with a token in it and its tokens, both [start, stop)."""

    reqs: slice
    tokens: slice


@dataclass
class Ubatch:
    """One micro-batch's model inputs."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_inputs: AttentionInputs


def should_split(inputs: AttentionInputs, cfg: UbatchKnobs) -> bool:
    """Split this step? Only with enable_dbo and at least the threshold of its kind of step
    (pure decode: dbo_decode_token_threshold; any prefill in it: dbo_prefill_token_threshold)."""
    if not cfg.enable_dbo or inputs.num_actual_tokens < 2:
        return False
    threshold = (cfg.dbo_decode_token_threshold if inputs.is_pure_decode
                 else cfg.dbo_prefill_token_threshold)
    return inputs.num_actual_tokens >= threshold


def split_point(num_tokens: int) -> int:
    """The first token of micro-batch B: balanced counts, A the larger by at most one."""
    return (num_tokens + 1) // 2


def ubatch_slices(query_lens: list[int] | np.ndarray, split: int) -> tuple[UbatchSlice, UbatchSlice]:
    """A = tokens [0, split), B = tokens [split, T); each takes the requests it has tokens of
    (a request cut by `split` is in both). 0 < split < T."""
    cu = np.concatenate([[0], np.cumsum(query_lens)])
    total = int(cu[-1])
    if not 0 < split < total:
        raise ValueError(f"split point {split} must lie inside the step's {total} tokens")
    last_of_a = int(np.searchsorted(cu, split, side="left"))  # first request starting at >= split
    first_of_b = int(np.searchsorted(cu, split, side="right")) - 1  # the request holding `split`
    return (UbatchSlice(slice(0, last_of_a), slice(0, split)),
            UbatchSlice(slice(first_of_b, len(cu) - 1), slice(split, total)))


def slice_attention_inputs(inputs: AttentionInputs, part: UbatchSlice) -> AttentionInputs:
    """The AttentionInputs of one micro-batch, from the step's (host copies: no device sync).

    A request whose tokens start before `part.tokens.start` has those tokens in the cache by
    then (num_computed grows by them); one whose tokens go past `part.tokens.stop` ends there
    (seq_len shrinks by them). The part that ends the step's tokens also takes the padding
    slots (-1) after them."""
    qlens = np.asarray(inputs.query_lens_cpu, dtype=np.int64)
    seq = np.asarray(inputs.seq_lens_cpu, dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(qlens)])
    r0, r1, t0, t1 = part.reqs.start, part.reqs.stop, part.tokens.start, part.tokens.stop
    lo = np.maximum(cu[r0:r1], t0)  # each request's first token in this part
    hi = np.minimum(cu[r0 + 1 : r1 + 1], t1)  # and its end
    query = hi - lo
    computed = (seq - qlens)[r0:r1] + (lo - cu[r0:r1])
    seq_lens = computed + query
    device = inputs.query_start_loc.device
    tokens = slice(t0, None if t1 == inputs.num_actual_tokens else t1)

    def dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.int32)).to(device, non_blocking=True)

    return replace(
        inputs,
        query_start_loc=dev(np.concatenate([[0], np.cumsum(query)])),
        seq_lens=dev(seq_lens),
        num_computed_tokens=dev(computed),
        block_table=inputs.block_table[r0:r1],
        slot_mapping=inputs.slot_mapping[tokens],
        group_tables=tuple((table[r0:r1], slots[tokens]) for table, slots in inputs.group_tables),
        num_reqs=r1 - r0,
        num_actual_tokens=t1 - t0,
        max_query_len=int(query.max()),
        max_seq_len=int(seq_lens.max()),
        query_lens_cpu=query.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
    )


def split_batch(input_ids: torch.Tensor, positions: torch.Tensor,
                inputs: AttentionInputs) -> list[Ubatch]:
    """The step's inputs as micro-batches A and B (B also takes any padding tokens)."""
    a, b = ubatch_slices(inputs.query_lens_cpu, split_point(inputs.num_actual_tokens))
    return [Ubatch(input_ids[a.tokens], positions[a.tokens], slice_attention_inputs(inputs, a)),
            Ubatch(input_ids[b.tokens.start :], positions[b.tokens.start :],
                   slice_attention_inputs(inputs, b))]


def run_sequential(model, attn_backend, ubatches: list[Ubatch],
                   kv_caches: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each micro-batch's hidden states, A first (its KV is in the cache before B reads it)."""
    return [model(u.input_ids, u.positions, kv_caches, build_step_metadata(attn_backend, u.attn_inputs))
            for u in ubatches]


def run_model(model, attn_backend, batch: StepBatch, kv_caches: list[torch.Tensor],
              cfg: UbatchKnobs) -> torch.Tensor:
    """The step's hidden states [T, hidden]: one forward, or (should_split) two micro-batches,
    run in turn on one rank, interleaved at every all-reduce under tensor parallelism (the
    other's compute hides each one's communication: lab/worker/ubatch_overlap.py).

    `batch`: anything with input_ids, positions [T] and attn_inputs (a StepBatch). A padded
    decode (`padded_size` set: the CUDA-graph path's static buffers) is never split."""
    inputs = batch.attn_inputs
    if getattr(batch, "padded_size", None) is not None or not should_split(inputs, cfg):
        return model(batch.input_ids, batch.positions, kv_caches,
                     build_step_metadata(attn_backend, inputs))
    ubatches = split_batch(batch.input_ids, batch.positions, inputs)
    tp = getattr(model, "tp", None)
    if tp is None or tp.world_size == 1:
        parts = run_sequential(model, attn_backend, ubatches, kv_caches)
    else:
        from lab.worker.ubatch_overlap import DualBatchOverlap

        parts = DualBatchOverlap(batch.input_ids.device).run(model, attn_backend, ubatches,
                                                             kv_caches)
    return torch.cat(parts)
