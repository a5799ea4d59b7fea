"""The torch paged backend equals dense causal attention per request; slot -1 is never written."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.attention.base import AttentionInputs, AttentionSpec
from lab.attention.torch_backend import TorchAttentionBackend, write_kv_cache


def _dense(q, k, v, num_computed, scale):
    """q: [Q, H, D] at positions num_computed.., k/v: [L, Hkv, D] for positions 0..L-1."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    qpos = num_computed + torch.arange(q.shape[0])
    scores.masked_fill_(torch.arange(k.shape[0])[None, :] > qpos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@given(
    reqs=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 9)), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 2, 4, 8]),
    group=st.sampled_from([1, 2, 4]),
)
def test_paged_equals_dense(reqs, block_size, group):
    torch.manual_seed(0)
    hkv, d = 2, 8
    spec = AttentionSpec(num_heads=hkv * group, num_kv_heads=hkv, head_dim=d)
    backend = TorchAttentionBackend()
    seq_lens = [c + q for c, q in reqs]
    nblk = [-(-s // block_size) for s in seq_lens]
    cache = torch.zeros(2, sum(nblk) + 2, block_size, hkv, d)
    perm = (torch.randperm(sum(nblk)) + 1).tolist()  # scattered physical blocks, 0 is null
    tables, full_k, full_v = [], [], []
    for i, (c, q) in enumerate(reqs):
        table = perm[sum(nblk[:i]): sum(nblk[:i + 1])]
        tables.append(table)
        k, v = torch.randn(c + q, hkv, d), torch.randn(c + q, hkv, d)
        full_k.append(k)
        full_v.append(v)
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                              for p in range(c)], dtype=torch.long)
        write_kv_cache(cache, k[:c], v[:c], slots)  # the cached prefix
    width = max(nblk)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qlens = [q for _, q in reqs]
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (c, q) in enumerate(reqs) for p in range(c, c + q)]
    inputs = AttentionInputs(
        query_start_loc=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor([c for c, _ in reqs], dtype=torch.int32),
        block_table=bt, slot_mapping=torch.tensor(slots + [-1], dtype=torch.long),
        num_reqs=len(reqs), num_actual_tokens=sum(qlens), max_query_len=max(qlens),
        max_seq_len=max(seq_lens), block_size=block_size, query_lens_cpu=qlens,
        seq_lens_cpu=seq_lens)
    t = sum(qlens)
    q = torch.randn(t + 1, spec.num_heads, d)  # one padding token at the end
    k = torch.cat([fk[c:] for fk, (c, _) in zip(full_k, reqs)] + [torch.full((1, hkv, d), 7.0)])
    v = torch.cat([fv[c:] for fv, (c, _) in zip(full_v, reqs)] + [torch.full((1, hkv, d), 7.0)])
    before_null = cache[:, 0].clone()
    out = backend.forward(0, q, k, v, cache, backend.build_metadata(inputs), d ** -0.5)
    start = 0
    for i, (c, n) in enumerate(reqs):
        want = _dense(q[start:start + n], full_k[i], full_v[i], c, d ** -0.5)
        torch.testing.assert_close(out[start:start + n], want, atol=1e-5, rtol=1e-5)
        start += n
    assert torch.equal(cache[:, 0], before_null)  # padding (slot -1) wrote nothing
    assert not (cache == 7.0).any()
