"""One sequence's prefill logits through a model's paged cache, without an engine (shared by
the model tests and the tensor-parallel rank functions)."""

from __future__ import annotations

import torch

from lab.attention.base import AttentionInputs


def prefill_logits(model, backend, ids: list[int], block_size: int = 4,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Logits [T, vocab] of one sequence computed in a single prefill step through the paged
    cache the model's attention spec shapes (blocks scattered in reverse order; block 0 is the
    null block). compute_logits is a collective under TP: None on the ranks that do not
    sample."""
    t = len(ids)
    nblk = -(-t // block_size)
    kv_spec = backend.kv_cache_spec(model.attention_spec, block_size, dtype)
    caches = backend.allocate_kv_cache(kv_spec, nblk + 3, model.num_layers,
                                       torch.device("cpu")).layers
    table = list(range(nblk + 2, 2, -1))[:nblk]
    slots = [table[p // block_size] * block_size + p % block_size for p in range(t)]
    inputs = AttentionInputs(
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([t], dtype=torch.int32),
        num_computed_tokens=torch.tensor([0], dtype=torch.int32),
        block_table=torch.tensor([table], dtype=torch.int32), slot_mapping=torch.tensor(slots),
        num_reqs=1, num_actual_tokens=t, max_query_len=t, max_seq_len=t, block_size=block_size,
        query_lens_cpu=[t], seq_lens_cpu=[t])
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(t), caches, backend.build_metadata(inputs))
        return model.compute_logits(hidden)
