"""`paged_attention` (Triton) against its PyTorch reference and an independent dense attention.

Each batch stores every request's full K/V in a scattered paged cache (random permutation of
physical blocks, block-table rows padded with the null block 0). Unwritten cache slots hold NaN,
so a kernel that reads past a request's keys (or from the null block) fails loudly.
"""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.kv_cache_write import write_kv_cache_ref
from lab.kernels.paged_prefill import paged_attention, paged_attention_ref, pick_config

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # interpreter on CPU
SENTINEL = -7.0  # fills `out`; rows past query_start_loc[B] must keep it
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),  # GPU: 3-pass tf32
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


@dataclass
class Batch:
    """One mixed step: inputs of `paged_attention` plus each request's dense K/V."""

    q: torch.Tensor  # [T + pad, H, D]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, Hkv, D]
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    scale: float
    keys: list  # per request [seq_len, Hkv, D]
    values: list


def make_batch(q_lens, ctxs, block_size, hkv, group, d, dtype, seed, pad_rows=3, device=DEVICE,
               index_dtype=torch.int32):
    """Random batch; request b has ctx cached tokens followed by q_len new ones."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(ctxs, q_lens)]
    nblk = [-(-s // block_size) for s in seq_lens]
    num_blocks = 1 + sum(nblk) + 2  # null block + used + spare
    phys = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(q_lens), max(nblk) + 1, dtype=torch.int32)  # 0-padded rows
    kv_cache = torch.full((2, num_blocks, block_size, hkv, d), float("nan"), dtype=dtype)
    keys, values = [], []
    for b, (s, n) in enumerate(zip(seq_lens, nblk)):
        table[b, :n] = torch.tensor(phys[:n], dtype=torch.int32)
        phys = phys[n:]
        keys.append(torch.randn(s, hkv, d, generator=gen).to(dtype))
        values.append(torch.randn(s, hkv, d, generator=gen).to(dtype))
        pos = torch.arange(s)
        slots = table[b, pos // block_size].long() * block_size + pos % block_size
        write_kv_cache_ref(keys[-1], values[-1], kv_cache[0], kv_cache[1], slots)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=index_dtype)
    q = torch.randn(sum(q_lens) + pad_rows, hkv * group, d, generator=gen).to(dtype)
    return Batch(
        q.to(device), kv_cache.to(device), qsl.to(device),
        torch.tensor(seq_lens, dtype=index_dtype, device=device), table.to(device),
        max(q_lens), d**-0.5, [k.to(device) for k in keys], [v.to(device) for v in values],
    )


def run(fn, batch: Batch, **kw) -> torch.Tensor:
    """Call `paged_attention` or its reference on a sentinel-filled output."""
    out = torch.full_like(batch.q, SENTINEL)
    fn(batch.q, batch.kv_cache[0], batch.kv_cache[1], out, batch.query_start_loc,
       batch.seq_lens, batch.block_table, batch.max_query_len, batch.scale, **kw)
    return out


def dense_attention(batch: Batch) -> torch.Tensor:
    """Independent float64 check: SDPA per request on the dense K/V (no cache, no block table)."""
    out = torch.full_like(batch.q, SENTINEL, dtype=torch.float64)
    qsl = batch.query_start_loc.tolist()
    for b, (k, v) in enumerate(zip(batch.keys, batch.values)):
        q = batch.q[qsl[b]:qsl[b + 1]].double()
        ctx = k.shape[0] - q.shape[0]
        mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril(ctx)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.double().transpose(0, 1), v.double().transpose(0, 1),
            attn_mask=mask, scale=batch.scale, enable_gqa=True,
        )
        out[qsl[b]:qsl[b + 1]] = o.transpose(0, 1)
    return out


def check(batch: Batch, **kw) -> None:
    """Kernel vs reference vs dense; padding rows of `out` untouched."""
    got = run(paged_attention, batch, **kw)
    want = run(paged_attention_ref, batch)
    dense = dense_attention(batch)
    tol = TOL[batch.q.dtype]
    n = int(batch.query_start_loc[-1])
    assert torch.all(got[n:] == SENTINEL)
    assert not torch.isnan(got[:n]).any()
    torch.testing.assert_close(got.float(), want.float(), **tol)
    torch.testing.assert_close(got.double(), dense.to(got.dtype).double(), **tol)


@st.composite
def batches(draw):
    """Ragged mixed batches: decode rows (q_len 1), prefills and extends with cached prefixes."""
    n_req = draw(st.integers(1, 4))
    q_len = st.one_of(st.just(1), st.integers(1, 40))
    ctx = st.one_of(st.just(0), st.integers(0, 64))
    return dict(
        q_lens=draw(st.lists(q_len, min_size=n_req, max_size=n_req)),
        ctxs=draw(st.lists(ctx, min_size=n_req, max_size=n_req)),
        block_size=draw(st.integers(1, 32)),
        hkv=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4, 8])),
        d=draw(st.sampled_from([16, 32, 64])),
        dtype=draw(st.sampled_from([torch.float32, torch.float16])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=25)
@given(spec=batches(), tiles=st.sampled_from([{}, dict(block_m=16, tile_n=16),
                                               dict(block_m=32, tile_n=16),
                                               dict(block_m=16, tile_n=32)]))
def test_matches_reference_and_dense(spec, tiles):
    check(make_batch(**spec), **tiles)


def test_d128_gqa4():
    """Fixed d=128 case: GQA 4, block 16, a prefix hit, a decode row and a fresh prefill."""
    for dtype in (torch.float32, torch.float16):
        check(make_batch([9, 1, 20], [23, 40, 0], 16, 2, 4, 128, dtype, seed=3))


def test_non_power_of_two_group_and_block():
    """G = 3 (rows padded to BLOCK_M) and G = 5 with a block size of 7."""
    check(make_batch([5, 17], [3, 30], 7, 2, 3, 32, torch.float32, seed=4))
    check(make_batch([12, 2], [0, 9], 7, 1, 5, 16, torch.float16, seed=5), block_m=16, tile_n=16)


def test_pure_decode_batch():
    """max_query_len = 1: every request is one row after a long cached context."""
    check(make_batch([1, 1, 1], [70, 5, 129], 16, 2, 8, 32, torch.float16, seed=6))


def test_int64_metadata():
    """query_start_loc / seq_lens given as int64 work the same."""
    check(make_batch([6, 1, 19], [0, 33, 8], 8, 2, 2, 32, torch.float32, seed=10,
                     index_dtype=torch.int64), block_m=16, tile_n=16)


def test_empty_request_and_strided_q_out():
    """A request with q_len = 0 writes nothing; q / out are views into fused buffers."""
    batch = make_batch([4, 0, 6], [2, 11, 0], 4, 1, 2, 16, torch.float32, seed=7)
    fused_q = torch.randn(batch.q.shape[0], batch.q.shape[1] + 2, 16, device=DEVICE)
    fused_q[:, :batch.q.shape[1]] = batch.q
    fused_out = torch.full_like(fused_q, SENTINEL)
    q, out = fused_q[:, :batch.q.shape[1]], fused_out[:, :batch.q.shape[1]]
    paged_attention(q, batch.kv_cache[0], batch.kv_cache[1], out, batch.query_start_loc,
                    batch.seq_lens, batch.block_table, batch.max_query_len, batch.scale)
    want = run(paged_attention_ref, batch)
    torch.testing.assert_close(out, want, **TOL[torch.float32])
    assert torch.all(fused_out[:, batch.q.shape[1]:] == SENTINEL)


@pytest.mark.parametrize("max_q,group,d", [(1, 1, 64), (1, 8, 128), (7, 4, 128), (512, 1, 128),
                                           (4096, 4, 256), (2, 32, 64)])
def test_pick_config_is_valid(max_q, group, d):
    cfg = pick_config(max_q, group, d)
    m = cfg["BLOCK_M"]
    assert m >= max(16, group) and m & (m - 1) == 0 and cfg["TILE_N"] in (32, 64)


def test_bf16_rejected_in_interpreter():
    if torch.cuda.is_available():
        pytest.skip("bf16 is supported on CUDA")
    batch = make_batch([3], [2], 4, 1, 1, 16, torch.float32, seed=8)
    batch.q = batch.q.bfloat16()
    with pytest.raises(ValueError):
        run(paged_attention, batch)


@pytest.mark.gpu
def test_bf16_cuda_realistic():
    """bf16 on CUDA: 4 requests (~1k context), d128, GQA 4 (32q/8kv), block 16, mixed batch."""
    batch = make_batch([1024, 1, 200, 37], [0, 1023, 824, 990], 16, 8, 4, 128,
                       torch.bfloat16, seed=9, device="cuda")
    check(batch)
