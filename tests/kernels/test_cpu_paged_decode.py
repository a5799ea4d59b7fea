"""The C++ CPU paged-decode kernel equals its PyTorch reference: the step's K/V rows written to
their slots (slot -1 skipped), then each request's query over its keys read through the block
table; padding rows zero; bad input refused with the field named."""

import pytest
import torch

from lab.kernels import cpu_paged_decode as kernel


@pytest.fixture(scope="module", autouse=True)
def built():
    """Build (or load) the extension once; no C++ toolchain here: skip, saying why."""
    try:
        kernel.load()
    except kernel.CPUKernelUnavailable as e:
        pytest.skip(str(e))


def _step(num_reqs: int, hkv: int, group: int, d: int, bs: int, dtype, seed: int = 0):
    """A decode step over a scattered cache: request b holds seq_len[b] keys (its new token's
    included) in its own blocks; q/k/v are views of one fused qkv row per token (as the model
    hands them over), plus one padding token (slot -1)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, 5 * bs + 1, (num_reqs,), generator=g, dtype=torch.int32)
    nblk = int(-(-seq_lens.max() // bs))
    perm = torch.randperm(num_reqs * nblk, generator=g) + 1  # block 0 is the null block
    table = perm.view(num_reqs, nblk).int()
    kv = torch.randn(2, num_reqs * nblk + 1, bs, hkv, d, generator=g).to(dtype)
    t, h = num_reqs + 1, hkv * group
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(dtype)
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    last = (seq_lens - 1).long()
    slots = table[torch.arange(num_reqs), last // bs].long() * bs + last % bs
    slots = torch.cat([slots, torch.tensor([-1])])
    return (q.view(t, h, d), k.view(t, hkv, d), v.view(t, hkv, d), kv, slots, table, seq_lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_reqs", "hkv", "group", "d", "bs"), [
    (1, 1, 1, 8, 1), (3, 2, 2, 16, 4), (4, 2, 4, 8, 16), (2, 4, 1, 32, 8), (5, 1, 8, 16, 2),
])
def test_kernel_equals_reference(dtype, num_reqs, hkv, group, d, bs):
    q, k, v, kv, slots, table, seq_lens = _step(num_reqs, hkv, group, d, bs, dtype)
    kv_ref = kv.clone()
    args = (slots, table, seq_lens, num_reqs, q.shape[0], d ** -0.5)
    out = kernel.paged_decode(q, k, v, kv, *args)
    want = kernel.paged_decode_ref(q, k, v, kv_ref, *args)
    assert torch.equal(kv, kv_ref)  # the same rows written, the padding token's nowhere
    assert not out[num_reqs:].any()  # the padding row's output is zero
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol)


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hkv", "group", "d"), [
    (2, 4, 64), (8, 2, 128), (1, 1, 64), (2, 8, 128), (3, 3, 64),
])
@pytest.mark.parametrize("num_reqs", [1, 6, 16])
def test_vector_shapes_equal_reference_both_paths(portable, dtype, hkv, group, d, num_reqs):
    """Head dims 64 / 128 with groups 1-8 are the AVX-512 tasks' shapes (group 3: portable
    even there); `portable=True` runs the plain loops on the same step. Block size 16 with up
    to 5 blocks: the prefetch a block ahead runs past a request's last K block into its V. One
    request splits into a task per KV head (span_heads), 16 give a task per request, 6 between
    (at 1-8 threads)."""
    q, k, v, kv, slots, table, seq_lens = _step(num_reqs, hkv, group, d, 16, dtype,
                                                seed=d + group + num_reqs)
    kv_ref = kv.clone()
    args = (slots, table, seq_lens, num_reqs, q.shape[0], d ** -0.5)
    out = kernel.paged_decode(q, k, v, kv, *args, portable=portable)
    want = kernel.paged_decode_ref(q, k, v, kv_ref, *args)
    assert torch.equal(kv, kv_ref) and not out[num_reqs:].any()
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol)


def test_request_without_keys_gives_zeros():
    q, k, v, kv, slots, table, seq_lens = _step(3, 2, 4, 64, 16, torch.float32)
    seq_lens[1] = 0
    slots[1] = -1
    out = kernel.paged_decode(q, k, v, kv, slots, table, seq_lens, 3, 4, 0.125)
    assert not out[1].any() and out[0].abs().sum() > 0


def test_rows_past_num_tokens_are_not_written():
    q, k, v, kv, slots, table, seq_lens = _step(3, 2, 2, 8, 4, torch.float32)
    before = kv.clone()
    kernel.paged_decode(q, k, v, kv, slots, table, seq_lens, 3, 1, 1.0)
    changed = (kv != before).flatten(3).any(-1)  # [2, num_blocks, block_size]
    blk, off = divmod(int(slots[0]), 4)
    assert changed.sum() == 2 and changed[0, blk, off] and changed[1, blk, off]


def test_bad_input_is_refused_naming_it():
    q, k, v, kv, slots, table, seq_lens = _step(2, 2, 2, 8, 4, torch.float32)
    args = (slots, table, seq_lens, 2, 3, 1.0)
    with pytest.raises(RuntimeError, match="must share one dtype"):
        kernel.paged_decode(q.double(), k, v, kv, *args)
    with pytest.raises(RuntimeError, match="k must be .* each token's heads contiguous"):
        kernel.paged_decode(q, k.transpose(0, 1).contiguous().transpose(0, 1), v, kv, *args)
    with pytest.raises(RuntimeError, match="slots must be int64"):
        kernel.paged_decode(q, k, v, kv, slots.int(), table, seq_lens, 2, 3, 1.0)


def test_no_toolchain_is_reported_as_unavailable(monkeypatch):
    import torch.utils.cpp_extension as ext

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(ext, "load", no_compiler)
    with pytest.raises(kernel.CPUKernelUnavailable, match="could not be built: no C\\+\\+"):
        kernel.build()


def test_the_build_is_named_for_this_source_and_cpu():
    name = kernel.extension_name()
    assert name.startswith("lab_cpu_paged_decode_") and name == kernel.extension_name()
    kernel.build()  # from the disk cache; once it appended torch's libraries to the flags
    assert kernel.extension_name() == name
    assert kernel.supports(torch.zeros(1), torch.zeros(1))
    assert not kernel.supports(torch.zeros(1, dtype=torch.float16), torch.zeros(1))


FEATURES = {"window1": dict(sliding_window=1), "window5": dict(sliding_window=5),
            "window_past": dict(sliding_window=500), "sinks": dict(sinks=True),
            "softcap": dict(softcap=0.7), "all": dict(sliding_window=9, sinks=True, softcap=0.7)}


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hkv", "group", "d", "bs"), [(2, 4, 64, 4), (2, 3, 16, 16)])
@pytest.mark.parametrize("features", FEATURES)
def test_features_equal_reference(features, hkv, group, d, bs, dtype, portable):
    """A sliding window (a query seeing itself only, 5 keys, more than any request has),
    sinks, a soft cap and all three, on an AVX-512 shape (d 64, group 4) and a portable one, both
    paths. Keys below the window are NaN and their whole blocks' table entries the null block
    (NaN too): the kernel reads none of them."""
    q, k, v, kv, slots, table, seq_lens = _step(4, hkv, group, d, bs, dtype, seed=len(features))
    kw = dict(FEATURES[features])
    if kw.pop("sinks", False):
        kw["sinks"] = torch.linspace(-2.0, 3.0, hkv * group)
    kv_ref = kv.clone()
    args = (slots, table, seq_lens, 4, q.shape[0], d ** -0.5)
    want = kernel.paged_decode_ref(q, k, v, kv_ref, *args, **kw)
    window = kw.get("sliding_window")
    if window:  # poisoned after the reference ran on the clean cache (it writes the step's rows)
        kv[0, 0] = kv[1, 0] = float("nan")
        for b, n in enumerate(seq_lens.tolist()):
            pos = torch.arange(max(0, n - window))
            kv[:, table[b, pos // bs].long(), pos % bs] = float("nan")
            table[b, : max(0, n - window) // bs] = 0
    out = kernel.paged_decode(q, k, v, kv, *args, portable=portable, **kw)
    assert not out.isnan().any() and not out[4:].any()
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol)
