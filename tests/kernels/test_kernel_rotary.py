"""Rotary kernel (Triton interpreter on CPU) against its PyTorch reference, both layouts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.kernels.rotary import rotary_embedding, rotary_embedding_ref
from lab.layers.ops import TorchOps
from lab.layers.rotary import RotaryEmbedding

MAX_POS = 128


def _tables(rotary_dim: int, scaling: float = 1.0):
    """cos/sin [MAX_POS, rotary_dim/2] as RotaryEmbedding caches them (scaling folded in)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    rope = RotaryEmbedding(inv_freq, MAX_POS, scaling)
    return rope.cos_cache, rope.sin_cache


def _qk(t, heads, kv_heads, d, dtype, seed, device="cpu"):
    """q, k as strided views of one fused qkv output, as the model produces them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g).to(device, dtype)
    q = qkv[:, : heads * d].view(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    pos = torch.randint(0, MAX_POS, (t,), generator=g).to(device)
    return pos, q, k


@settings(max_examples=15)
@given(t=st.integers(1, 40), heads=st.sampled_from([(1, 1), (4, 2), (6, 2), (8, 8)]),
       d=st.sampled_from([16, 32, 64, 128]), partial=st.booleans(), is_neox=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float16]), seed=st.integers(0, 2**16))
def test_rotary_matches_reference(t, heads, d, partial, is_neox, dtype, seed):
    cos, sin = _tables(d // 2 if partial else d, scaling=1.3)
    pos, q, k = _qk(t, *heads, d, dtype, seed)
    q_in, k_in = q.clone(), k.clone()
    q_out, k_out = rotary_embedding(pos, q, k, cos, sin, is_neox)
    q_ref, k_ref = rotary_embedding_ref(pos, q, k, cos, sin, is_neox)
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(q, q_in) and torch.equal(k, k_in)  # not in place


@pytest.mark.parametrize("is_neox", [True, False])
def test_reference_is_the_torch_ops_math(is_neox):
    cos, sin = _tables(32)
    pos, q, k = _qk(5, 4, 2, 32, torch.float16, 0)
    for a, b in zip(rotary_embedding_ref(pos, q, k, cos, sin, is_neox),
                    TorchOps().rotary(pos, q, k, cos, sin, is_neox)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_neox_matches_the_hf_rotate_half_formula():
    cos, sin = _tables(16)
    pos, q, k = _qk(3, 2, 1, 16, torch.float32, 1)
    c = torch.cat((cos[pos], cos[pos]), -1)[:, None]
    s = torch.cat((sin[pos], sin[pos]), -1)[:, None]
    rot_half = torch.cat((-q[..., 8:], q[..., :8]), -1)
    q_out, _ = rotary_embedding(pos, q, k, cos, sin, True)
    torch.testing.assert_close(q_out, q * c + rot_half * s, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_rounds_as_hf_does(is_neox, dtype):
    """The reference computes each half (pair element) from its own slice, so compile=true's
    kernel reads cos/sin as vectors; every product and sum is still HF's, rounded the same:
    equal bit for bit to x * cat(cos, cos) + rotate_half(x) * cat(sin, sin) (neox) and to
    gpt-j's rotate_every_two with repeat_interleave'd tables, partial rotary included."""
    cos, sin = _tables(48)
    pos, q, k = _qk(7, 4, 2, 64, dtype, 5)
    c, s = cos[pos].to(dtype), sin[pos].to(dtype)
    x_rot, x_pass = q[..., :48], q[..., 48:]
    if is_neox:
        rotated = torch.cat((-x_rot[..., 24:], x_rot[..., :24]), -1)
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    else:
        rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), -1).flatten(-2)
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
    want = torch.cat((x_rot * c[:, None] + rotated * s[:, None], x_pass), -1)
    assert torch.equal(rotary_embedding_ref(pos, q, k, cos, sin, is_neox)[0], want)


def test_rotary_rejects_bad_tables():
    cos, sin = _tables(64)
    pos, q, k = _qk(2, 2, 1, 32, torch.float32, 0)
    with pytest.raises(ValueError, match="head_dim"):
        rotary_embedding(pos, q, k, cos, sin)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_bf16_gpu(is_neox):
    cos, sin = (t.cuda() for t in _tables(128))
    pos, q, k = _qk(300, 32, 8, 128, torch.bfloat16, 0, device="cuda")
    for a, b in zip(rotary_embedding(pos, q, k, cos, sin, is_neox),
                    rotary_embedding_ref(pos, q, k, cos, sin, is_neox)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # same roundings as the PyTorch path


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(("d", "rotary_dim"), [(48, 24), (80, 80), (96, 40)])
def test_rotary_non_power_of_two_dims(is_neox, d, rotary_dim):
    cos, sin = _tables(rotary_dim)
    pos, q, k = _qk(9, 3, 1, d, torch.float16, 2)
    for a, b in zip(rotary_embedding(pos, q, k, cos, sin, is_neox),
                    rotary_embedding_ref(pos, q, k, cos, sin, is_neox)):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
