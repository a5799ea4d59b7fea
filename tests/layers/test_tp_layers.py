"""Tensor-parallel layers at world size 2 (two gloo ranks of one module-scoped RankPool) equal
their unsharded twins: linears, vocab embedding / LM head, MoE experts, quantized linears."""

from __future__ import annotations

import pytest
import torch
import tp_layer_fns as fns

from lab.distributed.launch import RankPool
from lab.distributed.parallel_state import GroupCoordinator
from lab.layers.linear import QKVParallelLinear, RowParallelLinear


@pytest.fixture(scope="module")
def pool():
    with RankPool(2) as p:
        yield p


def assert_pairs(per_rank: list[dict], atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Every rank's {check: (got, want)} pairs are close."""
    for rank, checks in enumerate(per_rank):
        for name, (got, want) in checks.items():
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol,
                                       msg=lambda m, n=name, r=rank: f"rank {r}, {n}: {m}")


def test_linears_equal_unsharded(pool):
    assert_pairs(pool.run(fns.linears))


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["kv_split", "kv_replicated"])
def test_qkv_heads(pool, num_kv_heads):
    assert_pairs(pool.run(fns.qkv, num_kv_heads))


@pytest.mark.parametrize("vocab_size", [8, 7], ids=["even", "padded"])
def test_vocab_parallel_embedding_and_lm_head(pool, vocab_size):
    per_rank = pool.run(fns.vocab, vocab_size)
    assert "lm_head" in per_rank[0] and "lm_head" not in per_rank[1]
    assert_pairs(per_rank)


@pytest.mark.parametrize("expert_parallel,quantize", [(False, False), (True, False),
                                                      (False, True), (True, True)])
def test_moe_experts(pool, expert_parallel, quantize):
    assert_pairs(pool.run(fns.experts, expert_parallel, quantize), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["int8", "fp8_per_channel", "fp8_per_tensor",
                                    "fp8_checkpoint", "w4a16"])
def test_quantized_linears_match_tp1(pool, method):
    """Weight scales equal TP=1's bit for bit, and both outputs equal TP=1's up to the order of
    the fp32 sums: a row-parallel rank quantizes its activation slice with the whole row's
    scale (lab/quant/base.py activation_amax), so its 8-bit values are TP=1's columns."""
    per_rank = pool.run(fns.quantized, method)
    scales = [{k: v for k, v in r.items() if k.endswith("_scale")} for r in per_rank]
    assert_pairs(scales, atol=0, rtol=0)
    if method != "w4a16":
        assert all(scales), "every 8-bit method has scales to compare"
    for r in per_rank:
        for name in ("column", "row"):
            torch.testing.assert_close(*r[name], atol=1e-4, rtol=1e-4)


def test_w4a16_refuses_groups_across_ranks(pool):
    msg = pool.run(fns.w4a16_refuses_split_groups)[0]
    assert "model.layers.0.mlp.down_proj" in msg and "tensor_parallel_size=2" in msg


def test_shapes_and_refusals_without_processes():
    """Sharded shapes from a group of 4 (construction needs no collective)."""
    tp4 = GroupCoordinator([0, 1, 2, 3], 3)
    qkv = QKVParallelLinear(16, 2, num_heads=8, num_kv_heads=2, tp=tp4)
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.kv_replicas) == (2, 1, 2)
    assert qkv.output_partition_sizes == [4, 2, 2] and qkv.weight.shape == (8, 16)
    assert qkv.shard_rows(1) == (4, 2, 2)  # rank 3 holds kv head 3 // 2 = 1
    row = RowParallelLinear(16, 5, tp=tp4)
    assert row.weight.shape == (5, 4) and row.input_columns() == (12, 4)
    with pytest.raises(ValueError, match="num_attention_heads=6 is not divisible"):
        QKVParallelLinear(16, 2, num_heads=6, num_kv_heads=2, tp=tp4)
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        QKVParallelLinear(16, 2, num_heads=12, num_kv_heads=3, tp=tp4)
