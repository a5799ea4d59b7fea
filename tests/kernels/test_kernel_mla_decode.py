"""MLA split-KV decode (Triton, interpreted on CPU) vs its PyTorch reference and unabsorbed MLA.

The latent cache is poisoned with NaN outside the live tokens (null block 0, unused blocks, slots
past a request's length), so any unmasked read of them shows up as NaN in the output.
"""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (switches Triton to its interpreter when there is no CUDA)
from lab.kernels import mla_decode as md
from lab.kernels.mla_decode import (
    DecodeWorkspace,
    mla_decode_attention,
    mla_decode_attention_ref,
    mla_head_blocks,
)
from lab.kernels.paged_decode import choose_num_splits
from tests.kernels.sm90 import compile_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 dots are tf32 on a GPU; exact fp32 in the interpreter.
TOL = {torch.float32: 5e-3 if DEVICE == "cuda" else 2e-5, torch.float16: 4e-3,
       torch.bfloat16: 2e-2}


def make_case(lens, block_size, num_heads, lora, rope, dtype, seed=0, device=DEVICE,
              scatter=True, extra_blocks=2):
    """Random q_nope/q_pe and a latent cache holding `lens` tokens per request.

    Blocks are a random permutation of 1.. (scatter) or consecutive from 1; block 0 is the null
    block that pads the table. Returns (q_nope, q_pe, kv_cache, seq_lens, block_table).
    """
    g = torch.Generator().manual_seed(seed)
    nblk = [-(-n // block_size) for n in lens]
    num_blocks = 1 + sum(nblk) + extra_blocks
    kv_cache = torch.full((num_blocks, block_size, lora + rope), float("nan"))
    ids = torch.randperm(num_blocks - 1, generator=g) + 1  # drawn either way: same data
    if not scatter:
        ids = torch.arange(1, num_blocks)
    table = torch.zeros(len(lens), max(nblk, default=0) + 1, dtype=torch.int32)  # 0-padded
    used = 0
    for b, n in enumerate(lens):
        table[b, : nblk[b]] = ids[used : used + nblk[b]]
        used += nblk[b]
        pos = torch.arange(n)
        kv_cache[table[b, pos // block_size].long(), pos % block_size] = torch.randn(
            n, lora + rope, generator=g)
    q_nope = torch.randn(len(lens), num_heads, lora, generator=g)
    q_pe = torch.randn(len(lens), num_heads, rope, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return tuple(
        t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        for t in (q_nope, q_pe, kv_cache, seq_lens, table)
    )


def scale_of(case):
    return (case[0].shape[-1] + case[1].shape[-1]) ** -0.5


def run_mla(case, num_splits, workspace=None, out_dtype=None):
    q_nope, q_pe, kv_cache, seq_lens, table = case
    out = torch.full_like(q_nope, float("nan"), dtype=out_dtype or q_nope.dtype)
    mla_decode_attention(q_nope, q_pe, kv_cache, out, seq_lens, table, scale_of(case), num_splits,
                         workspace=workspace)
    return out


def check_against_ref(case, num_splits):
    out = run_mla(case, num_splits)
    ref = mla_decode_attention_ref(*case, scale=scale_of(case))
    assert ref.dtype == out.dtype and ref.shape == out.shape
    assert not out.isnan().any()
    tol = TOL[out.dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    return out


@settings(max_examples=15, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 4),
    num_heads=st.integers(1, 8),
    lora=st.sampled_from([16, 24, 32]),
    rope=st.sampled_from([8, 16]),
    block_size=st.sampled_from([1, 4, 16]),
    num_splits=st.integers(1, 8),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_mla_decode_matches_reference(data, batch, num_heads, lora, rope, block_size, num_splits,
                                      dtype, seed):
    short_or_long = st.one_of(st.integers(1, 8), st.integers(1, 150))  # short -> empty splits
    lens = data.draw(st.lists(short_or_long, min_size=batch, max_size=batch), label="lens")
    case = make_case(lens, block_size, num_heads, lora, rope, dtype, seed)
    check_against_ref(case, num_splits)


@pytest.mark.parametrize("block_size", [1, 5, 16, 32])
def test_small_tiles_many_head_blocks(monkeypatch, block_size):
    """TILE_N = 16 (< and > block_size, several tiles per split) and H = 20 over two head blocks
    of 16 (the second one mostly padding)."""
    monkeypatch.setattr(md, "_launch_config", lambda num_heads: dict(
        BLOCK_H=16, TILE_N=16, num_warps=4, num_stages=1))
    assert mla_head_blocks(20) == 2
    case = make_case([70, 1, 33], block_size, 20, 24, 8, torch.float32, seed=block_size)
    for splits in (1, 3):
        check_against_ref(case, splits)


def test_scattered_blocks_equal_contiguous():
    """The same tokens in a random permutation of blocks (block 0 = null, NaN) or in consecutive
    blocks give the same output."""
    args = ([37, 64, 5], 8, 6, 32, 16, torch.float32)
    scattered = make_case(*args, seed=7, scatter=True)
    contiguous = make_case(*args, seed=7, scatter=False)
    assert not torch.equal(scattered[4], contiguous[4])
    assert scattered[2][0].isnan().all()  # null block never holds data
    for splits in (1, 4):
        torch.testing.assert_close(run_mla(scattered, splits), run_mla(contiguous, splits),
                                   atol=1e-6, rtol=1e-6)


def test_absorbed_equals_unabsorbed_mla():
    """Kernel on the absorbed query, then W_UV, equals plain softmax attention with per-head
    k = [W_UK c | k_pe] and v = W_UV-projected latents (fp64 math)."""
    g = torch.Generator().manual_seed(11)
    lens, heads, nope, lora, rope, v_dim, bs = [29, 3, 50], 4, 16, 32, 8, 24, 4
    case = make_case(lens, bs, heads, lora, rope, torch.float32, seed=11)
    _, q_pe, kv_cache, seq_lens, table = case
    w_uk = torch.randn(heads, nope, lora, generator=g) / lora**0.5  # k_nope[h] = W_UK[h] @ c
    w_uv = torch.randn(heads, lora, v_dim, generator=g) / lora**0.5  # v[h] = c @ W_UV[h]
    q_orig = torch.randn(len(lens), heads, nope, generator=g)
    q_nope = torch.einsum("bhn,hnl->bhl", q_orig, w_uk)  # absorbed query
    scale = (nope + rope) ** -0.5
    out = torch.full_like(q_nope, float("nan")).to(DEVICE)
    mla_decode_attention(q_nope.to(DEVICE), q_pe, kv_cache, out, seq_lens, table, scale, 3)
    got = torch.einsum("bhl,hlv->bhv", out.cpu().double(), w_uv.double())

    kv_cache, q_pe, table = kv_cache.cpu().double(), q_pe.cpu().double(), table.cpu().long()
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        rows = kv_cache[table[b, pos // bs], pos % bs]
        c, k_pe = rows[:, :lora], rows[:, lora:]
        k_nope = torch.einsum("hnl,jl->hjn", w_uk.double(), c)  # [H, n, nope]
        k = torch.cat([k_nope, k_pe.expand(heads, n, rope)], dim=-1)  # [H, n, nope + R]
        v = torch.einsum("jl,hlv->hjv", c, w_uv.double())  # [H, n, v]
        q = torch.cat([q_orig[b].double(), q_pe[b]], dim=-1)  # [H, nope + R]
        p = torch.softmax(torch.einsum("hd,hjd->hj", q, k) * scale, dim=-1)
        want = torch.einsum("hj,hjv->hv", p, v)
        torch.testing.assert_close(got[b], want, atol=1e-5, rtol=1e-5)
    ref = mla_decode_attention_ref(q_nope.to(DEVICE), *case[1:], scale=scale)
    torch.testing.assert_close(torch.einsum("bhl,hlv->bhv", ref.cpu().double(), w_uv.double()),
                               got, atol=1e-5, rtol=1e-5)


def test_zero_length_rows_and_empty_splits():
    """seq_len 0 (a padded batch row) gives zeros; more splits than tiles leaves splits empty."""
    case = make_case([0, 3, 1, 0], 4, 3, 16, 8, torch.float32, seed=3)
    for splits in (1, 8):
        out = check_against_ref(case, splits)
        assert (out[0] == 0).all() and (out[3] == 0).all()


def test_workspace_reused_dirty_and_fp32_out():
    ws = DecodeWorkspace()
    ws.get(4, 8, 8, 32, DEVICE)
    ws.out.fill_(float("nan"))
    ws.lse.fill_(float("nan"))
    case = make_case([5, 100, 33], 16, 5, 24, 8, torch.float16, seed=5)
    ptr = ws.out.data_ptr()
    out = run_mla(case, 6, workspace=ws, out_dtype=torch.float32)
    assert ws.out.data_ptr() == ptr and out.dtype == torch.float32
    ref = mla_decode_attention_ref(*case, scale=scale_of(case)).float()
    torch.testing.assert_close(out, ref, atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(out, run_mla(case, 1, out_dtype=torch.float32), atol=1e-3,
                               rtol=1e-3)


def _bad_inputs():
    """(name, mutate(args) -> args, error pattern) for mla_decode_attention's argument checks."""
    def with_(i, f):
        return lambda a: a[:i] + (f(a[i]),) + a[i + 1:]

    return [
        ("q_nope_2d", with_(0, lambda t: t[:, 0]), "3-D"),
        ("q_pe_heads", with_(1, lambda t: t[:, :1]), "q_pe"),
        ("cache_width", with_(2, lambda t: t[..., :-1].contiguous()), "L \\+ R"),
        ("out_shape", with_(3, lambda t: t[:, :, :-1]), "out"),
        ("q_dtype", with_(0, lambda t: t.half()), "dtype"),
        ("cache_int", with_(2, lambda t: t.int()), "fp16, bf16 or fp32"),
        ("seq_lens_int64", with_(4, lambda t: t.long()), "seq_lens"),
        ("seq_lens_shape", with_(4, lambda t: t[:1]), "seq_lens"),
        ("table_int64", with_(5, lambda t: t.long()), "block_table"),
        ("table_1d", with_(5, lambda t: t[0]), "block_table"),
        ("q_strided", with_(0, lambda t: torch.cat([t, t], -1)[..., ::2]), "contiguous"),
        ("cache_strided", with_(2, lambda t: torch.cat([t, t], -1)[..., ::2]), "contiguous"),
        ("splits_zero", with_(7, lambda s: 0), "num_splits"),
    ]


@pytest.mark.parametrize("name,mutate,pattern", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_raise(name, mutate, pattern):
    q_nope, q_pe, kv_cache, seq_lens, table = make_case([5, 9], 4, 2, 16, 8, torch.float32)
    out = torch.empty_like(q_nope)
    args = mutate((q_nope, q_pe, kv_cache, out, seq_lens, table, 0.25, 2))
    with pytest.raises(ValueError, match=pattern):
        mla_decode_attention(*args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only check")
def test_bf16_refused_by_interpreter():
    case = make_case([5], 4, 2, 16, 8, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="bfloat16"):
        run_mla(case, 1)


def test_head_blocks_for_split_sizing():
    assert mla_head_blocks(1) == 1
    splits = choose_num_splits(64, 4096, num_kv_heads=mla_head_blocks(16))
    assert 1 <= splits <= 16


_COMPILE_SCRIPT = """
    import os, re, subprocess, tempfile
    from lab.kernels import mla_decode as md

    fn = md._mla_split_kernel
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for heads, splits in ((16, 1), (16, 4), (32, 4), (128, 1)):
        cfg = md._launch_config(heads)
        types = {n: "*bf16" for n in ("qn_ptr", "qp_ptr", "kv_ptr", "o_ptr")}
        types.update(seq_lens_ptr="*i32", bt_ptr="*i32", lse_ptr="*fp32", qk_scale="fp32",
                     c_scale_ptr="*fp32", pe_scale_ptr="*fp32")
        if splits > 1:
            types["o_ptr"] = "*fp32"
        consts = dict(NUM_SPLITS=splits, BLOCK_SIZE=64, TILE_N=cfg["TILE_N"],
                      BLOCK_H=cfg["BLOCK_H"], LORA=512, BLOCK_L=512, ROPE=64, BLOCK_R=64,
                      STORE_LSE=splits > 1, DOT_PRECISION="tf32", KV_FP8=False)
        aligned = {n for n in fn.arg_names if n.endswith("_ptr")
                   or (n.startswith("stride") and n not in ("stride_os", "stride_ls"))}
        k = build(fn, types, consts, aligned, num_warps=cfg["num_warps"],
                  num_stages=cfg["num_stages"])
        ptx = k.asm["ptx"]
        assert "cp.async" in ptx and "ld.global.b16" not in ptx, heads
        assert ("wgmma" in ptx) == (cfg["BLOCK_H"] >= 64) and ("wgmma" in ptx or "mma.sync" in ptx)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                                   text=True, check=True).stdout
        stack = [int(x) for x in re.findall(r"STACK:(\\d+)", usage)]
        assert stack and max(stack) == 0, (heads, splits, usage)  # no register spills
        print(heads, splits, re.findall(r"REG:\\d+", usage), k.metadata.shared)
    print("ok")
"""


def test_kernel_compiles_for_hopper_without_spills():
    """AOT-compile the sm_90 configs at DeepSeek's shape (L=512, R=64, bf16, block 64; no GPU
    needed): tensor-core dots (wgmma at 64 heads per program), async tile loads, no spills."""
    compile_for_sm90(_COMPILE_SCRIPT)


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads", [16, 128])
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_mla_decode_bf16_cuda(num_heads, num_splits):
    """DeepSeek-like decode on CUDA: L=512, R=64, block 64, bf16, B=16 with ~1-2k tokens."""
    torch.manual_seed(0)
    lens = torch.randint(1000, 2049, (16,)).tolist()
    lens[0] = 1
    case = make_case(lens, 64, num_heads, 512, 64, torch.bfloat16, device="cuda")
    splits = num_splits or choose_num_splits(16, 2048, num_kv_heads=mla_head_blocks(num_heads))
    out = run_mla(case, splits, workspace=DecodeWorkspace())
    ref = mla_decode_attention_ref(*case, scale=scale_of(case))
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
