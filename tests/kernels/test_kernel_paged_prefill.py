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
from tests.kernels.features import CUDA_FEATURES, feature_kwargs

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


def dense_features(batch: Batch, window=None, sinks=None, softcap=None) -> torch.Tensor:
    """Independent float64 check of the features, spelled out per request on the dense K/V:
    scores soft-capped (softcap * tanh(s / softcap)), query i sees key j iff j <= i and
    i - j < window, each head's sink logit one more softmax column with no value."""
    out = torch.full_like(batch.q, SENTINEL, dtype=torch.float64)
    qsl = batch.query_start_loc.tolist()
    for b, (k, v) in enumerate(zip(batch.keys, batch.values)):
        q = batch.q[qsl[b]:qsl[b + 1]].double()
        g = q.shape[1] // k.shape[1]
        k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * batch.scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        qpos = (k.shape[0] - q.shape[0] + torch.arange(q.shape[0], device=q.device))[:, None]
        kpos = torch.arange(k.shape[0], device=q.device)[None, :]
        seen = (kpos <= qpos) & (qpos - kpos < (window or k.shape[0] + 1))
        scores = scores.masked_fill(~seen, float("-inf"))
        if sinks is not None:
            sink = sinks.double()[:, None, None].expand(-1, q.shape[0], 1)
            scores = torch.cat((scores, sink), -1)
        probs = scores.softmax(-1)[..., :k.shape[0]]
        out[qsl[b]:qsl[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def poison_outside_window(batch: Batch, window: int) -> Batch:
    """The batch with every key no query of its request can see through the window (below
    ctx - window + 1, ctx = the request's cached tokens) read as NaN: those cache rows, and the
    block-table entries of blocks wholly below them pointing at the null block 0 (NaN), as a
    hybrid KV cache leaves them. A kernel that reads any of them gives NaN."""
    kv_cache, table = batch.kv_cache.clone(), batch.block_table.clone()
    bs = kv_cache.shape[2]
    q_lens = batch.query_start_loc.diff().tolist()
    for b, (seq_len, q_len) in enumerate(zip(batch.seq_lens.tolist(), q_lens)):
        lo = max(0, seq_len - q_len - window + 1)
        pos = torch.arange(lo, device=table.device)
        kv_cache[:, table[b, pos // bs].long(), pos % bs] = float("nan")
        table[b, : lo // bs] = 0
    return Batch(batch.q, kv_cache, batch.query_start_loc, batch.seq_lens, table,
                 batch.max_query_len, batch.scale, batch.keys, batch.values)


def check(batch: Batch, **kw) -> None:
    """Kernel vs reference vs dense; padding rows of `out` untouched. With features
    (sliding_window, sinks, softcap in kw) the keys outside the window are poisoned first and
    the dense check is `dense_features`."""
    features = {f: kw.pop(f) for f in ("sliding_window", "sinks", "softcap") if f in kw}
    if features:
        dense = dense_features(batch, features.get("sliding_window"), features.get("sinks"),
                               features.get("softcap"))
        if features.get("sliding_window"):
            batch = poison_outside_window(batch, features["sliding_window"])
    else:
        dense = dense_attention(batch)
    got = run(paged_attention, batch, **kw, **features)
    want = run(paged_attention_ref, batch, **features)
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


@st.composite
def features(draw, n_heads: int):
    """A layer's features: any of a window (1, short, or past every context), sinks and a
    soft cap, at least one."""
    which = draw(st.sets(st.sampled_from(["sliding_window", "sinks", "softcap"]), min_size=1))
    kw = {}
    if "sliding_window" in which:
        kw["sliding_window"] = draw(st.one_of(st.just(1), st.integers(1, 40), st.just(200)))
    if "sinks" in which:
        kw["sinks"] = torch.linspace(-2.0, 3.0, n_heads, device=DEVICE) + draw(st.floats(-2, 2))
    if "softcap" in which:
        kw["softcap"] = draw(st.sampled_from([0.5, 2.0]))
    return kw


@settings(max_examples=15)
@given(spec=batches(), data=st.data(),
       tiles=st.sampled_from([{}, dict(block_m=16, tile_n=16), dict(block_m=32, tile_n=16)]))
def test_features_match_reference_and_dense(spec, data, tiles):
    """Mixed batches with a sliding window, sinks and / or a soft cap; keys outside the window
    are NaN (never read)."""
    kw = data.draw(features(spec["hkv"] * spec["group"]), label="features")
    check(make_batch(**spec), **tiles, **kw)


@pytest.mark.parametrize("window", [1, 5, 37, 60, 64, 65, 500])
def test_window_tiles_skipped_masked_and_whole(window):
    """16-key tiles and 16-query blocks over a 64-token context and 40 new tokens: a q-block
    at positions p0 .. p0 + 15 starts at the tile of p0 - window + 1 (the tiles below are
    never read: NaN), masks the window's edge, runs unmasked tiles where every row sees the
    whole tile (window 60: two of them) and masks the causal edge. Window 1: a row sees
    itself only; 64 and 65: around the context's length; 500: past every position."""
    batch = make_batch([40, 1, 7], [64, 64, 0], 4, 1, 1, 16, torch.float32, seed=window)
    check(batch, block_m=16, tile_n=16, sliding_window=window)


def test_all_features_gqa_fp16():
    """Window, sinks and soft cap at once, GQA 4 at d = 64, fp16, a non-power-of-two block."""
    batch = make_batch([9, 1, 20], [23, 40, 0], 7, 2, 4, 64, torch.float16, seed=11)
    sinks = torch.linspace(-1.0, 2.0, 8, device=DEVICE)
    check(batch, block_m=32, tile_n=16, sliding_window=13, sinks=sinks, softcap=1.5)


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


@pytest.mark.gpu
@pytest.mark.parametrize("features", CUDA_FEATURES)
def test_bf16_cuda_features(features):
    """The realistic bf16 mixed batch with a sliding window of 300 (keys below every query's
    window NaN: never read), sinks, a soft cap of 30, or all three; the kernel's own tiles."""
    batch = make_batch([1024, 1, 200, 37], [0, 1023, 824, 990], 16, 8, 4, 128,
                       torch.bfloat16, seed=12, device="cuda")
    kw = feature_kwargs(features, 300, num_heads=32)
    check(batch, **kw)
