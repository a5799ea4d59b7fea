"""Turning a SchedulerOutput into the step's tensors (vectorised numpy, then one copy each).

For scheduled requests with num_computed c[i] and new tokens n[i] (flattened back to back):

    query_start_loc = [0, n0, n0+n1, ...]            token t belongs to request req_idx[t]
    positions[t]    = c[req_idx[t]] + (t - query_start_loc[req_idx[t]])
    slot_mapping[t] = block_table[row, pos // bs] * bs + pos % bs
    seq_lens[i]     = c[i] + n[i]
    logits_indices  = query_start_loc[1:] - 1: every request's last token (a partial prefill
                      is sampled too, as in vLLM, so the batch's rows stay the persistent
                      batch's rows; `sampled` says whose token is kept)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lab.attention.base import AttentionInputs, KVScales
from lab.cache.block_table import BlockTable


@dataclass
class StepBatch:
    """The model's inputs for one step and which requests keep their sampled token."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_inputs: AttentionInputs
    logits_indices: torch.Tensor  # [num_reqs]: the last scheduled token of every request
    sampled: np.ndarray  # bool [num_reqs]: the request's prompt is complete (keeps its token)
    token_starts: np.ndarray  # [num_reqs]: each request's first token in the flat batch

    @property
    def any_sampled(self) -> bool:
        return bool(self.sampled.any())


@dataclass
class BatchRows:
    """Per-request host arrays of the scheduled requests, in schedule order."""

    req_ids: list[str]
    rows: np.ndarray  # persistent row of each request in the token / block tables
    num_computed: np.ndarray  # tokens already in the KV cache
    num_scheduled: np.ndarray  # tokens computed this step
    num_tokens: np.ndarray  # tokens the request holds (prompt + outputs)


def prepare_inputs(
    batch: BatchRows, token_ids: np.ndarray, block_table: BlockTable, block_size: int,
    max_model_len: int, device: torch.device, kv_scales: KVScales | None = None,
) -> StepBatch:
    """Build the step's flat input ids, positions, slot mapping and attention inputs (which
    carry the cache's fp8 `kv_scales`, if any, to the backend)."""
    n = batch.num_scheduled
    cu = np.cumsum(n)
    starts = cu - n
    req_idx = np.repeat(np.arange(len(n)), n)
    positions = batch.num_computed[req_idx] + (np.arange(cu[-1]) - starts[req_idx])
    token_rows = batch.rows[req_idx]
    input_ids = token_ids[token_rows, positions]
    slot_mapping = block_table.compute_slot_mapping(token_rows, positions, block_size)
    seq_lens = batch.num_computed + n
    max_blocks = -(-int(seq_lens.max()) // block_size)
    complete = seq_lens >= batch.num_tokens
    attn = AttentionInputs(
        query_start_loc=_to(np.concatenate([[0], cu]), torch.int32, device),
        seq_lens=_to(seq_lens, torch.int32, device),
        num_computed_tokens=_to(batch.num_computed, torch.int32, device),
        block_table=_to(block_table.block_table[batch.rows, :max_blocks], torch.int32, device),
        slot_mapping=_to(slot_mapping, torch.int64, device),
        num_reqs=len(n),
        num_actual_tokens=int(cu[-1]),
        max_query_len=int(n.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        query_lens_cpu=n.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
        max_model_len=max_model_len,
        kv_scales=kv_scales,
    )
    return StepBatch(
        input_ids=_to(input_ids, torch.int64, device),
        positions=_to(positions, torch.int64, device),
        attn_inputs=attn,
        logits_indices=_to(cu - 1, torch.int64, device),
        sampled=complete,
        token_starts=starts,
    )


def _to(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)
