"""attention=torch on MLA: paged latent cache (scattered blocks, cached context + new tokens,
several requests, a padding token) equals dense unpaged MLA, computed both expanded (per-head
k/v from kv_b_proj, as transformers does) and absorbed (w_uk / w_uv views)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lab.attention.base import AttentionInputs
from lab.attention.mla import MLAWeights
from lab.attention.spec import AttentionSpec, mla_attention_spec
from lab.attention.torch_backend import TorchAttentionBackend
from lab.kernels.mla_cache_write import write_latent_cache_ref
from lab.layers.linear import Linear

H, N, R, V, L = 4, 8, 4, 6, 12  # heads, nope, rope, v, kv_lora_rank


def _mla() -> MLAWeights:
    spec = mla_attention_spec(H, L, N, R, V)
    kv_b_proj = Linear(L, H * (N + V))
    kv_b_proj.weight.data.copy_(torch.randn(H * (N + V), L) / L**0.5)
    return MLAWeights.from_kv_b_proj(kv_b_proj, spec)


def _dense_expanded(q_nope, q_pe, kv_c, k_pe, mla, num_computed, scale):
    """Queries [Q, H, *] at positions num_computed.. over latents [S, *] at 0..S-1."""
    k_nope, v = mla.expand(kv_c)
    k = torch.cat((k_nope, k_pe[:, None, :].expand(-1, H, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    qpos = num_computed + torch.arange(q.shape[0])
    scores.masked_fill_(torch.arange(k.shape[0])[None, :] > qpos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _dense_absorbed(q_nope, q_pe, kv_c, k_pe, mla, num_computed, scale):
    """The same attention in latent space: q_nope·W_UK against kv_c, then W_UV on the output."""
    q_lat = torch.einsum("qhn,hnl->qhl", q_nope, mla.w_uk)
    scores = (torch.einsum("qhl,kl->hqk", q_lat, kv_c)
              + torch.einsum("qhr,kr->hqk", q_pe, k_pe)) * scale
    qpos = num_computed + torch.arange(q_nope.shape[0])
    scores.masked_fill_(torch.arange(kv_c.shape[0])[None, :] > qpos[:, None], float("-inf"))
    out_lat = torch.einsum("hqk,kl->qhl", scores.softmax(-1), kv_c)
    return torch.einsum("qhl,hlv->qhv", out_lat, mla.w_uv)


def _inputs(reqs, tables, block_size) -> AttentionInputs:
    seq_lens = [c + q for c, q in reqs]
    qlens = [q for _, q in reqs]
    width = max(len(t) for t in tables)
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (c, q) in enumerate(reqs) for p in range(c, c + q)]
    return AttentionInputs(
        query_start_loc=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_computed_tokens=torch.tensor([c for c, _ in reqs], dtype=torch.int32),
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots + [-1], dtype=torch.long),  # one padding token
        num_reqs=len(reqs), num_actual_tokens=sum(qlens), max_query_len=max(qlens),
        max_seq_len=max(seq_lens), block_size=block_size, query_lens_cpu=qlens,
        seq_lens_cpu=seq_lens)


@given(
    reqs=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 9)), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 2, 4, 8]),
)
def test_paged_mla_equals_dense(reqs, block_size):
    torch.manual_seed(0)
    mla, backend = _mla(), TorchAttentionBackend()
    spec = mla_attention_spec(H, L, N, R, V)
    nblk = [-(-(c + q) // block_size) for c, q in reqs]
    kv_spec = backend.kv_cache_spec(spec, block_size, torch.float32)
    cache = backend.allocate_kv_cache(kv_spec, sum(nblk) + 2, 1, torch.device("cpu")).layers[0]
    perm = (torch.randperm(sum(nblk)) + 1).tolist()  # scattered physical blocks, 0 is null
    tables = [perm[sum(nblk[:i]): sum(nblk[:i + 1])] for i in range(len(reqs))]
    lat = [(torch.randn(c + q, L), torch.randn(c + q, R)) for c, q in reqs]
    for (c, _), table, (kv_c, k_pe) in zip(reqs, tables, lat):  # the cached context
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                              for p in range(c)], dtype=torch.long)
        write_latent_cache_ref(cache, kv_c[:c], k_pe[:c], slots)
    t = sum(q for _, q in reqs)
    q_nope, q_pe = torch.randn(t + 1, H, N), torch.randn(t + 1, H, R)
    new = [(a[c:], b[c:]) for (a, b), (c, _) in zip(lat, reqs)]  # this step's tokens + 1 padding
    kv_c = torch.cat([a for a, _ in new] + [torch.full((1, L), 7.0)])
    k_pe = torch.cat([b for _, b in new] + [torch.full((1, R), 7.0)])
    null_before = cache[0].clone()
    scale = 0.3
    md = backend.build_metadata(_inputs(reqs, tables, block_size))
    out = backend.forward_mla(0, q_nope, q_pe, kv_c, k_pe, cache, md, mla, scale)
    assert out.shape == (t + 1, H, V) and not out[t].any()  # padding row stays zero
    start = 0
    for (c, n), (full_c, full_pe) in zip(reqs, lat):
        args = (q_nope[start:start + n], q_pe[start:start + n], full_c, full_pe, mla, c, scale)
        torch.testing.assert_close(out[start:start + n], _dense_expanded(*args), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[start:start + n], _dense_absorbed(*args), atol=1e-4, rtol=1e-4)
        start += n
    assert torch.equal(cache[0], null_before)  # slot -1 wrote nothing
    assert not (cache == 7.0).any()


def test_latent_cache_spec_and_layout():
    backend = TorchAttentionBackend()
    spec = mla_attention_spec(H, L, N, R, V)
    assert (spec.kind, spec.num_kv_heads, spec.head_dim) == ("mla", 1, L + R)
    kv = backend.kv_cache_spec(spec, 4, torch.float16)
    assert kv.layer_shape(10) == (10, 4, L + R) and kv.bytes_per_token == (L + R) * 2
    gqa = backend.kv_cache_spec(AttentionSpec(4, 2, 8), 4, torch.float16)
    assert gqa.layer_shape(10) == (2, 10, 4, 2, 8)  # other kinds keep the split K/V layout
    cache = torch.zeros(3, 4, L + R)
    kv_c, k_pe = torch.randn(2, L), torch.randn(2, R)
    write_latent_cache_ref(cache, kv_c, k_pe, torch.tensor([5, -1]))
    torch.testing.assert_close(cache[1, 1], torch.cat((kv_c[0], k_pe[0])))
    assert cache.count_nonzero() == L + R  # only slot 5 written
    with pytest.raises(ValueError, match="num_kv_heads=1"):
        AttentionSpec(4, 4, L + R, kind="mla", kv_lora_rank=L, qk_rope_head_dim=R)


def test_mla_weights_are_views_of_kv_b_proj():
    mla = _mla()
    w = mla.kv_b_proj.weight.view(H, N + V, L)
    assert torch.equal(mla.w_uk, w[:, :N]) and mla.w_uk.shape == (H, N, L)
    assert torch.equal(mla.w_uv, w[:, N:].transpose(1, 2)) and mla.w_uv.shape == (H, L, V)
    assert mla.w_uk.data_ptr() == mla.kv_b_proj.weight.data_ptr()  # no copy


def test_backends_without_mla_refuse_naming_the_alternatives():
    from lab.attention.triton_flash import TritonFlashBackend

    with pytest.raises(ValueError, match="attention=triton_mla or attention=torch"):
        TritonFlashBackend().check_supported(mla_attention_spec(H, L, N, R, V))
    TorchAttentionBackend().check_supported(mla_attention_spec(H, L, N, R, V))
