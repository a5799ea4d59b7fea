"""Dynamic activation quantization (Triton, interpreter on CPU) against the references: int8 and
fp8 per token, fp8 per tensor, bit for bit; the references' quantize -> dequantize error bounds;
edge cases; argument checks; sm_90 compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lab.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before kernel modules load)
from lab.kernels.quantize import (
    FP8_DTYPE,
    quantize_fp8_per_tensor,
    quantize_fp8_per_tensor_ref,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
    quantize_int8_per_token,
    quantize_int8_per_token_ref,
)
from tests.kernels.sm90 import compile_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAIRS = {
    "int8_token": (quantize_int8_per_token, quantize_int8_per_token_ref),
    "fp8_token": (quantize_fp8_per_token, quantize_fp8_per_token_ref),
    "fp8_tensor": (quantize_fp8_per_tensor, quantize_fp8_per_tensor_ref),
}


def bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.int8)


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 9), k=st.sampled_from([1, 16, 40, 48, 130, 4100]),
       kind=st.sampled_from(sorted(PAIRS)), dtype=st.sampled_from([torch.float32, torch.float16]),
       mag=st.sampled_from([1e-3, 1.0, 300.0]), zero_row=st.booleans(), seed=st.integers(0, 2**16))
def test_quantize_matches_reference_bitwise(m, k, kind, dtype, mag, zero_row, seed):
    """k=4100 takes the two-pass path (rows longer than one 4096 block)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * mag).to(DEVICE, dtype)
    if zero_row:
        x[m // 2] = 0
    fn, ref = PAIRS[kind]
    q, s = fn(x)
    qr, sr = ref(x)
    assert q.dtype == qr.dtype and s.dtype == torch.float32 and s.shape == sr.shape
    assert torch.equal(bits(q), bits(qr))
    assert torch.equal(s, sr)


def test_round_half_to_even_and_ties():
    """Values landing exactly on .5 after scaling round to even, like torch.round."""
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5, -126.5]], device=DEVICE)
    q, s = quantize_int8_per_token(x)
    assert s.item() == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 4, 126, -126]]
    assert torch.equal(q, quantize_int8_per_token_ref(x)[0])


def test_fp8_rounding_carries_into_exponent():
    """125.6 must round up to 128 (the interpreter's own conversion gives 64 there), ties to
    even at the fp8 spacing, subnormals, and the saturation value 448."""
    vals = [448.0, 125.6, 120.0, 124.0, 3.0 * 2**-9, 2**-10, 0.0, -125.6, -7.5, 0.001]
    x = torch.tensor([vals], device=DEVICE)
    q, s = quantize_fp8_per_token(x)
    assert s.item() == 1.0
    assert torch.equal(bits(q), bits(x.to(FP8_DTYPE)))
    assert q.float()[0, 1].item() == 128.0


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_scale_is_the_rounded_quotient(kind):
    """scale = fl32(max(amax, EPS) / qmax) in the kernels and the references on every device, for
    amax = every bf16 value in [1, 2) (per tensor: every 8th). On CUDA `amax / 448.0` (a Python
    divisor) multiplies by fl32(1 / 448) instead: 1 ulp off for 71 of these 128 (127: 6)."""
    amax = ((127 << 23) | (torch.arange(128, dtype=torch.int32) << 16)).view(torch.float32)
    qmax = 127.0 if kind.startswith("int8") else 448.0
    exact = (amax.double() / qmax).float()  # double rounding is harmless for a division
    fn, ref = PAIRS[kind]
    rows = [amax[:, None]] if kind.endswith("token") else [a.reshape(1, 1) for a in amax[::8]]
    got = [torch.cat([f(x.to(DEVICE))[1].reshape(-1) for x in rows]) for f in (fn, ref)]
    want = exact if kind.endswith("token") else exact[::8]
    assert torch.equal(got[0].cpu(), want) and torch.equal(got[1].cpu(), want), kind


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_dequantize_error_bounds(kind):
    """Reference math: |x - q * s| <= s / 2 (int8) and <= 2**-4 |x| + tiny (e4m3, 3 mantissa
    bits; subnormals below 2**-6 * s), scale = amax / qmax, and amax maps to +-qmax."""
    x = torch.randn(6, 200) * torch.tensor([1e-3, 1, 10, 100, 1e4, 0.5])[:, None]
    q, s = PAIRS[kind][1](x)
    deq = q.float() * s.reshape(-1, 1) if s.numel() > 1 else q.float() * s
    qmax = 127.0 if kind.startswith("int8") else 448.0
    amax = x.abs().amax(-1, keepdim=True) if kind.endswith("token") else x.abs().amax()
    torch.testing.assert_close(s.reshape(amax.shape), amax / qmax)
    err = (x - deq).abs()
    if kind.startswith("int8"):
        assert (err <= s.reshape(-1, 1) / 2 * (1 + 1e-6)).all()
        assert (q.abs().amax(-1) == 127).all()
    else:
        assert (err <= x.abs() * 2**-4 + 2**-10 * s.reshape(-1, 1)).all()
        assert q.float().abs().max().item() == 448.0


def test_empty_and_zero_inputs():
    for kind, (fn, ref) in PAIRS.items():
        for shape in ((0, 16), (3, 0), (2, 8)):
            x = torch.zeros(shape, device=DEVICE)
            q, s = fn(x)
            qr, sr = ref(x)
            assert q.shape == shape and torch.equal(s, sr), kind
            assert (s > 0).all() and (q.float() == 0).all(), kind


def test_strided_input():
    wide = torch.randn(5, 96, device=DEVICE)
    x = wide[:, 8:56]
    for fn, ref in PAIRS.values():
        q, s = fn(x)
        qr, sr = ref(x.contiguous())
        assert torch.equal(bits(q), bits(qr)) and torch.equal(s, sr)


def test_bad_inputs():
    for fn, _ in PAIRS.values():
        with pytest.raises(ValueError, match="2-D"):
            fn(torch.randn(2, 3, 4))
        with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
            fn(torch.ones(2, 4, dtype=torch.int32))
        if DEVICE == "cpu":
            with pytest.raises(ValueError, match="bfloat16"):
                fn(torch.randn(2, 4, dtype=torch.bfloat16))


_COMPILE_SCRIPT = """
    from lab.kernels import quantize as qz

    for q_t, qmax, is_int in (("*i8", 127.0, True), ("*fp8e4nv", 448.0, False)):
        for per_token in (True, False):
            for one_pass in (True, False):
                types = dict(x_ptr="*bf16", q_ptr=q_t, scale_ptr="*fp32", amax_ptr="*fp32")
                build(qz._quantize_kernel, types, dict(QMAX=qmax, EPS_=qz.EPS,
                      PER_TOKEN=per_token, IS_INT=is_int, BLOCK=4096, ONE_PASS=one_pass),
                      num_warps=8)
    build(qz._row_absmax_kernel, dict(x_ptr="*bf16", amax_ptr="*fp32"), dict(BLOCK=4096))
    print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu-marked tests run the kernels there")
def test_kernels_compile_for_hopper():
    compile_for_sm90(_COMPILE_SCRIPT)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096), (300, 14336), (64, 7168)])
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_quantize_bf16_cuda(kind, shape):
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3
    fn, ref = PAIRS[kind]
    q, s = fn(x)
    qr, sr = ref(x)
    assert torch.equal(s, sr)
    assert torch.equal(bits(q), bits(qr))
