"""Split-KV paged decode (Triton, interpreted on CPU) vs its PyTorch reference and dense attention.

Caches are poisoned with NaN outside the live keys (null block 0, unused blocks, slots past a
request's length), so any unmasked read of them shows up as NaN in the output.
"""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (switches Triton to its interpreter when there is no CUDA)
from lab.kernels.paged_decode import (
    DecodeWorkspace,
    choose_num_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from tests.kernels.features import CUDA_FEATURES, feature_kwargs
from tests.kernels.sm90 import compile_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def make_case(lens, block_size, num_kv_heads, group, head_dim, dtype, seed=0, device=DEVICE):
    """Random q and a paged cache holding `lens` keys per request in scattered blocks."""
    g = torch.Generator().manual_seed(seed)
    nblk = [-(-n // block_size) for n in lens]
    num_blocks = 1 + sum(nblk) + 2  # null block 0 + used + 2 never referenced
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1)[: sum(nblk)]
    table = torch.zeros(len(lens), max(nblk, default=0) + 1, dtype=torch.int32)  # 0-padded
    used = 0
    for b, n in enumerate(lens):
        table[b, : nblk[b]] = ids[used : used + nblk[b]]
        used += nblk[b]
        pos = torch.arange(n)
        blocks, slots = table[b, pos // block_size].long(), pos % block_size
        k_cache[blocks, slots] = torch.randn(n, num_kv_heads, head_dim, generator=g)
        v_cache[blocks, slots] = torch.randn(n, num_kv_heads, head_dim, generator=g)
    q = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return tuple(
        t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        for t in (q, k_cache, v_cache, seq_lens, table)
    )


def dense_attention(q, k_cache, v_cache, seq_lens, table, scale, window=None, sinks=None,
                    softcap=None):
    """Plain softmax attention per request in fp64 over its gathered keys: (out, lse). With a
    window only the last `window` keys; scores soft-capped (softcap * tanh(s / softcap)); each
    head's sink logit one more column of the softmax (and of lse), with no value."""
    b, h, d = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(b, h, d, dtype=torch.float64)
    lse = torch.full((b, h), float("-inf"), dtype=torch.float64)
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0 and sinks is None:
            continue
        pos = torch.arange(max(0, n - window) if window else 0, n)
        blocks, slots = table[i].cpu().long()[pos // bs], pos % bs
        k = k_cache.cpu()[blocks, slots].double().repeat_interleave(h // hkv, dim=1)  # [L, H, D]
        v = v_cache.cpu()[blocks, slots].double().repeat_interleave(h // hkv, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i].cpu().double(), k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if sinks is not None:
            scores = torch.cat((scores, sinks.cpu().double()[:, None]), -1)
        lse[i] = scores.logsumexp(-1)
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1)[:, :len(pos)], v)
    return out, lse


def run_decode(case, num_splits, workspace=None, with_lse=True, **features):
    q, k_cache, v_cache, seq_lens, table = case
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device=q.device) if with_lse else None
    scale = q.shape[-1] ** -0.5
    paged_decode_attention(q, k_cache, v_cache, out, seq_lens, table, scale, num_splits,
                           workspace=workspace, lse=lse, **features)
    return out, lse


def check_against_ref_and_dense(case, num_splits, **features):
    """Kernel output and lse agree with the split reference and with dense attention (over
    `dense_case`: the case before keys outside the window were poisoned, default `case`)."""
    dense_case = features.pop("dense_case", case)
    q, k_cache, v_cache, seq_lens, table = case
    scale = q.shape[-1] ** -0.5
    out, lse = run_decode(case, num_splits, **features)
    ref_out = torch.empty_like(q)
    ref_lse = paged_decode_attention_ref(q, k_cache, v_cache, ref_out, seq_lens, table, scale,
                                         num_splits, **features)
    dense_out, dense_lse = dense_attention(*dense_case, scale, features.get("sliding_window"),
                                           features.get("sinks"), features.get("softcap"))
    tol = TOL[q.dtype]
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.cpu().double(), dense_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.cpu().double(), dense_lse, atol=1e-4, rtol=1e-4)
    return out, lse


@settings(max_examples=15, deadline=None)
@given(
    data=st.data(),
    num_splits=st.integers(1, 8),
    block_size=st.integers(1, 32),
    head_dim=st.sampled_from([16, 32, 64]),
    group=st.sampled_from([1, 2, 4, 8]),
    num_kv_heads=st.integers(1, 2),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_decode_matches_reference_and_dense(
    data, num_splits, block_size, head_dim, group, num_kv_heads, dtype, seed
):
    short_or_long = st.one_of(st.integers(1, 8), st.integers(1, 200))  # short -> empty splits
    lens = data.draw(st.lists(short_or_long, min_size=1, max_size=3), label="lens")
    case = make_case(lens, block_size, num_kv_heads, group, head_dim, dtype, seed)
    check_against_ref_and_dense(case, num_splits)


def poison_outside_window(case, window):
    """The case with every key a query cannot see through its window read as NaN: cache rows
    below seq_len - window, and the block-table entries of blocks wholly below it pointing at
    the null block 0 (as a hybrid KV cache leaves them; NaN here). A kernel that reads any of
    them, even masked out afterwards, gives NaN."""
    q, k_cache, v_cache, seq_lens, table = (t.clone() for t in case)
    bs = k_cache.shape[1]
    for b, n in enumerate(seq_lens.tolist()):
        lo = max(0, n - window)
        pos = torch.arange(lo, device=table.device)
        blocks, slots = table[b, pos // bs].long(), pos % bs
        k_cache[blocks, slots] = float("nan")
        v_cache[blocks, slots] = float("nan")
        table[b, : lo // bs] = 0
    return q, k_cache, v_cache, seq_lens, table


# windows: a query sees itself only (1), fewer keys than most requests (7), exactly request 1's
# keys (37), more than any (500: the window changes nothing)
FEATURES = {"window1": dict(sliding_window=1), "window7": dict(sliding_window=7),
            "window37": dict(sliding_window=37), "window500": dict(sliding_window=500),
            "sinks": dict(sinks=True), "softcap": dict(softcap=0.8),
            "all": dict(sliding_window=20, sinks=True, softcap=0.8)}


@pytest.mark.parametrize(("features", "num_splits", "hkv", "dtype"), [
    *((f, splits, 1, torch.float32) for f in FEATURES for splits in (1, 3)),
    *((f, 8, 2, torch.float16) for f in ("window7", "all")),  # the interpreter's costliest
])
def test_features_match_reference_and_dense(features, num_splits, hkv, dtype):
    """Sliding window, sinks, soft cap (and all three) against the split reference and dense
    attention, one split (the direct path: the sink in its only split) or several (the sink in
    split 0's LSE, merged once; with 8, the short requests leave splits empty). Keys outside
    the window are NaN: the splits cover the window only."""
    case = make_case([1, 37, 90, 5], 4, hkv, 4, 16, dtype, seed=len(features))
    kw = dict(FEATURES[features])
    if kw.pop("sinks", False):
        kw["sinks"] = torch.linspace(-2.0, 3.0, case[0].shape[1], device=case[0].device)
    run_case = case
    if "sliding_window" in kw:
        run_case = poison_outside_window(case, kw["sliding_window"])
    check_against_ref_and_dense(run_case, num_splits, dense_case=case, **kw)


def test_a_sink_counts_once_in_an_empty_row():
    """A padded batch row (no keys) with sinks: zeros, and lse = the sink, split or not."""
    case = make_case([3, 0], 4, 1, 2, 16, torch.float32, seed=7)
    sinks = torch.tensor([0.5, -1.0], device=case[0].device)
    for splits in (1, 4):
        out, lse = run_decode(case, splits, sinks=sinks)
        assert not out[1].any()
        torch.testing.assert_close(lse[1], sinks)


@pytest.mark.parametrize(
    "head_dim,dtype", [(128, torch.float32), (128, torch.float16), (80, torch.float16)]
)
def test_head_dim_128_and_padded(head_dim, dtype):
    """d=128 (Llama) and a non-power-of-two d (padded to BLOCK_D, masked)."""
    case = make_case([300, 77, 5], 16, num_kv_heads=2, group=4, head_dim=head_dim, dtype=dtype,
                     seed=1)
    check_against_ref_and_dense(case, num_splits=4)


@pytest.mark.parametrize("block_size", [1, 7, 64, 128])
def test_tile_independent_of_block_size(block_size):
    """Blocks smaller than, not dividing, equal to and larger than the key tile."""
    case = make_case([190, 64, 129], block_size, 1, 2, 32, torch.float32, seed=block_size)
    check_against_ref_and_dense(case, num_splits=3)


def test_single_split_equals_multi_split():
    case = make_case([1, 63, 64, 65, 250], 16, 2, 4, 32, torch.float32, seed=2)
    out1, lse1 = run_decode(case, 1)
    for splits in (2, 5, 8):
        out_s, lse_s = run_decode(case, splits)
        torch.testing.assert_close(out_s, out1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse_s, lse1, atol=1e-5, rtol=1e-5)


def test_empty_splits_and_zero_length_rows():
    """L < num_splits leaves splits empty; L = 0 (a padded batch row) gives zeros and -inf."""
    case = make_case([3, 1, 0, 2], 4, 1, 4, 16, torch.float32, seed=3)
    for splits in (1, 8):
        out, lse = run_decode(case, splits)
        dense_out, dense_lse = dense_attention(*case, scale=0.25)
        torch.testing.assert_close(out.cpu().double(), dense_out, atol=1e-5, rtol=1e-5)
        assert torch.isneginf(lse[2]).all() and torch.equal(lse.isneginf(), dense_lse.isneginf())
        torch.testing.assert_close(lse[[0, 1, 3]].cpu().double(), dense_lse[[0, 1, 3]], atol=1e-5, rtol=1e-5)


def test_without_lse():
    case = make_case([40, 9], 8, 2, 2, 16, torch.float16, seed=4)
    for splits in (1, 4):
        out, _ = run_decode(case, splits, with_lse=False)
        ref, _ = run_decode(case, splits)
        torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_workspace_grows_and_is_reused_dirty():
    ws = DecodeWorkspace()
    p_out, p_lse = ws.get(2, 4, 3, 16, DEVICE)
    assert p_out.shape == (2, 4, 3, 16) and p_lse.shape == (2, 4, 3)
    ptr = ws.out.data_ptr()
    ws.get(1, 4, 2, 16, DEVICE)
    assert ws.out.data_ptr() == ptr  # smaller request: same storage
    ws.get(3, 4, 2, 16, DEVICE)
    assert tuple(ws.out.shape) == (3, 4, 3, 16)  # grows each dim to the max asked
    ws.out.fill_(float("nan"))
    ws.lse.fill_(float("nan"))
    case = make_case([5, 100, 33], 16, 2, 2, 16, torch.float32, seed=5)
    out, lse = run_decode(case, num_splits=6, workspace=ws)
    ref, ref_lse = run_decode(case, num_splits=1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only check")
def test_bf16_refused_by_interpreter():
    case = make_case([5], 4, 1, 2, 16, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="bfloat16"):
        run_decode(case, 1)


def test_choose_num_splits_rule():
    # A full batch already fills the GPU: one split (single launch).
    assert choose_num_splits(64, 4096, num_kv_heads=8) == 1
    assert choose_num_splits(17, 1 << 20, num_kv_heads=8) == 1  # 136 programs >= 132 SMs
    # B=1, long context: as many splits as allowed.
    assert choose_num_splits(1, 32768, num_kv_heads=8) == 16
    assert choose_num_splits(1, 32768, num_kv_heads=8, max_splits=8) == 8
    # Short sequences: capped by min_keys_per_split.
    assert choose_num_splits(1, 200, num_kv_heads=8) == 1
    assert choose_num_splits(8, 1024, num_kv_heads=8) == 4
    # Just enough programs for two waves: 2*132 / (4*8) -> 9 splits.
    assert choose_num_splits(4, 1 << 20, num_kv_heads=8, max_splits=64) == 9


@settings(max_examples=50, deadline=None)
@given(
    b=st.integers(1, 512), seq=st.integers(1, 1 << 17), hkv=st.sampled_from([1, 2, 8]),
    sms=st.sampled_from([8, 132]), min_keys=st.sampled_from([64, 256]),
    max_splits=st.integers(1, 32),
)
def test_choose_num_splits_properties(b, seq, hkv, sms, min_keys, max_splits):
    s = choose_num_splits(b, seq, num_sms=sms, min_keys_per_split=min_keys,
                          max_splits=max_splits, num_kv_heads=hkv)
    assert 1 <= s <= max_splits
    assert s == 1 or seq // s >= min_keys  # every split keeps enough keys
    capped = s == max_splits or s == max(1, seq // min_keys)
    if b * hkv >= sms:
        assert s == 1  # the batch alone fills the GPU
    else:
        assert capped or b * hkv * s >= 2 * sms  # otherwise the grid fills two waves
    assert b * hkv * (s - 1) < 2 * sms  # never more splits than needed
    assert choose_num_splits(b + 1, seq, sms, min_keys, max_splits, hkv) <= s


_COMPILE_SCRIPT = """
    from lab.kernels import merge_attn_states as ma, paged_decode as pd

    fn = pd._decode_split_kernel
    for splits, hd in ((1, 128), (8, 128), (4, 64)):
        cfg = pd._launch_config(hd)
        types = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
        types.update(seq_lens_ptr="*i32", bt_ptr="*i32", lse_ptr="*fp32", qk_scale="fp32",
                     k_scale_ptr="*fp32", v_scale_ptr="*fp32", sinks_ptr="*fp32",
                     softcap="fp32")
        if splits > 1:
            types["o_ptr"] = "*fp32"
        features = splits == 8  # window, sinks and soft cap on one variant
        consts = dict(NUM_SPLITS=splits, BLOCK_SIZE=16, TILE_N=cfg["TILE_N"], BLOCK_G=16,
                      HEAD_DIM=hd, BLOCK_D=hd, STORE_LSE=True, DOT_PRECISION="tf32",
                      KV_FP8=False, SLIDING=features, SINKS=features, SOFTCAP=features)
        aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")}
        k = build(fn, types, consts, aligned - {"stride_os", "stride_ls"},
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        ptx = k.asm["ptx"]
        assert "mma.sync" in ptx and "cp.async" in ptx and "ld.global.b16" not in ptx, splits
    fn = ma._merge_attn_states_kernel
    consts = dict(po_sd=1, o_sd=1, BLOCK_S=16, HEAD_DIM=128, BLOCK_D=128, STORE_LSE=True)
    types = dict(po_ptr="*fp32", plse_ptr="*fp32", out_ptr="*bf16", lse_ptr="*fp32")
    k = build(fn, types, consts, set(types) | {"po_sb", "po_sh", "po_ss", "o_sb", "o_sh"},
              num_warps=2)
    assert "ld.global.v4" in k.asm["ptx"]
    print("ok")
"""


def test_kernels_compile_for_hopper():
    """AOT-compile the kernels for sm_90 (no GPU needed): tensor-core dot, async vector loads."""
    compile_for_sm90(_COMPILE_SCRIPT)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_decode_bf16_cuda(num_splits):
    """Llama-8B-like decode: B=64, ctx ~4k, GQA 32:8, d=128, block 16, bf16 on CUDA."""
    torch.manual_seed(0)
    lens = torch.randint(3500, 4097, (64,)).tolist()
    case = make_case(lens, 16, num_kv_heads=8, group=4, head_dim=128, dtype=torch.bfloat16,
                     device="cuda")
    splits = num_splits or choose_num_splits(64, 4096, num_kv_heads=8)
    out, lse = run_decode(case, splits, workspace=DecodeWorkspace())
    q, k_cache, v_cache, seq_lens, table = case
    ref = torch.empty_like(q)
    ref_lse = paged_decode_attention_ref(q, k_cache, v_cache, ref, seq_lens, table,
                                         q.shape[-1] ** -0.5, splits)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("features", CUDA_FEATURES)
def test_decode_features_bf16_cuda(features):
    """Llama-8B-like decode (B=32, ctx ~4k, GQA 32:8, d=128, block 16, bf16) with a sliding
    window of 1000 (keys below it NaN: never read), sinks, a soft cap of 30, or all three;
    splits as the backend picks them (by the window's keys)."""
    torch.manual_seed(0)
    lens = torch.randint(3500, 4097, (32,)).tolist()
    case = make_case(lens, 16, num_kv_heads=8, group=4, head_dim=128, dtype=torch.bfloat16,
                     device="cuda")
    kw = feature_kwargs(features, 1000, num_heads=32)
    splits = choose_num_splits(32, kw.get("sliding_window", 4096), num_kv_heads=8)
    run_case = poison_outside_window(case, kw["sliding_window"]) if "sliding_window" in kw \
        else case
    out, lse = run_decode(run_case, splits, workspace=DecodeWorkspace(), **kw)
    q, k_cache, v_cache, seq_lens, table = case
    ref = torch.empty_like(q)
    ref_lse = paged_decode_attention_ref(q, k_cache, v_cache, ref, seq_lens, table,
                                         q.shape[-1] ** -0.5, splits, **kw)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-3)
