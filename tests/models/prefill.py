"""One sequence's prefill logits through a model's paged cache, without an engine (shared by
the model tests and the tensor-parallel rank functions), and the attention inputs of one
sequence's step for tests that drive a model step by step."""

from __future__ import annotations

import torch

from lab.attention.base import AttentionInputs


def scattered_table(num_tokens: int, block_size: int) -> tuple[list[int], int]:
    """(block table for num_tokens, blocks to allocate): the blocks in reverse order, past the
    null block 0, so that a wrong block or slot index shows."""
    nblk = -(-num_tokens // block_size)
    return list(range(nblk + 2, 2, -1))[:nblk], nblk + 3


def sequence_inputs(table: list[int], num_computed: int, seq_len: int,
                    block_size: int) -> AttentionInputs:
    """One sequence's step: positions num_computed .. seq_len - 1 are new (written to their
    slots through `table`), the earlier ones are read from the cache."""
    t = seq_len - num_computed
    slots = [table[p // block_size] * block_size + p % block_size
             for p in range(num_computed, seq_len)]
    return AttentionInputs(
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        num_computed_tokens=torch.tensor([num_computed], dtype=torch.int32),
        block_table=torch.tensor([table], dtype=torch.int32), slot_mapping=torch.tensor(slots),
        num_reqs=1, num_actual_tokens=t, max_query_len=t, max_seq_len=seq_len,
        block_size=block_size, query_lens_cpu=[t], seq_lens_cpu=[seq_len])


def prefill_logits(model, backend, ids: list[int], block_size: int = 4,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Logits [T, vocab] of one sequence computed in a single prefill step through the paged
    cache the model's attention spec shapes (blocks scattered in reverse order; block 0 is the
    null block). compute_logits is a collective under TP: None on the ranks that do not
    sample."""
    t = len(ids)
    table, nblocks = scattered_table(t, block_size)
    kv_spec = backend.kv_cache_spec(model.attention_spec, block_size, dtype)
    caches = backend.allocate_kv_cache(kv_spec, nblocks, model.num_layers,
                                       torch.device("cpu")).layers
    inputs = sequence_inputs(table, 0, t, block_size)
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(t), caches, backend.build_metadata(inputs))
        return model.compute_logits(hidden)
