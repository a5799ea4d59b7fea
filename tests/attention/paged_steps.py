"""One paged-attention step for the backend tests: requests with cached tokens in blocks of
their own, the step's new tokens, and a cache of random rows."""

import torch

from lab.attention.base import AttentionInputs


def paged_step(num_computed: list[int], query_lens: list[int], hkv: int = 2, group: int = 2,
               d: int = 8, block_size: int = 4, dtype=torch.float32, padding: bool = True):
    """(inputs, q, k, v, cache) of one step: request i holds num_computed[i] tokens in blocks
    1 + 3i .. 3 + 3i (room for 3 blocks) and adds query_lens[i]; with `padding`, one padding
    token (slot -1) follows the real ones."""
    torch.manual_seed(0)
    bs = block_size
    tables = [[1 + 3 * i, 2 + 3 * i, 3 + 3 * i] for i in range(len(query_lens))]
    slots = [tables[i][p // bs] * bs + p % bs
             for i, (c, n) in enumerate(zip(num_computed, query_lens)) for p in range(c, c + n)]
    seq_lens = [c + n for c, n in zip(num_computed, query_lens)]
    t = sum(query_lens)
    inputs = AttentionInputs(
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()],
                                     dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor(num_computed, dtype=torch.int32),
        block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots + [-1] * padding, dtype=torch.long),
        num_reqs=len(query_lens), num_actual_tokens=t, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_size=bs, query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens)
    rows = t + padding
    q = torch.randn(rows, hkv * group, d, dtype=dtype)
    k, v = torch.randn(rows, hkv, d, dtype=dtype), torch.randn(rows, hkv, d, dtype=dtype)
    cache = torch.randn(2, 3 * len(query_lens) + 1, bs, hkv, d, dtype=dtype)
    return inputs, q, k, v, cache
