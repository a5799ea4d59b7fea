"""Whole models at tensor_parallel_size=2 (two gloo ranks of one module-scoped RankPool): the
real tiny checkpoints loaded sharded on each rank give TP=1's prefill logits on rank 0."""

from __future__ import annotations

import pytest
import torch
import tp_model_fns as fns
from transformers import AutoConfig

from lab.distributed.launch import RankPool
from lab.distributed.parallel_state import GroupCoordinator
from lab.models.deepseek import DeepseekV2ForCausalLM
from lab.models.llama import LlamaForCausalLM
from tests.models.conftest import DenseCausalBackend

CASES = [  # (preset, expert_parallel, per-rank (heads, kv heads, head dim) at TP=2)
    ("tiny_llama", False, (2, 1, 16)),
    ("tiny_qwen3", False, (2, 1, 32)),
    ("tiny_qwen2", False, (2, 1, 16)),  # q/k/v bias, tied embeddings
    ("tiny_llama_mqa", False, (2, 1, 16)),  # the one KV head replicated on both ranks
    ("tiny_deepseek", False, (2, 1, 48)),  # MLA heads split, MoE experts split
    ("tiny_deepseek", True, (2, 1, 48)),  # MoE experts whole per rank
    ("tiny_gemma2", False, (2, 1, 16)),  # soft caps, local / global layers, tied embeddings
    ("tiny_gemma3", False, (2, 1, 16)),  # q/k norms, a RoPE per layer type
    ("tiny_gpt_oss", False, (2, 1, 16)),  # sinks split with the heads, experts split by width
    ("tiny_gpt_oss", True, (2, 1, 16)),  # experts whole per rank
]


@pytest.fixture(scope="module")
def pool():
    with RankPool(2) as p:
        yield p


@pytest.mark.parametrize("name,expert_parallel,spec", CASES,
                         ids=[f"{n}{'-ep' if ep else ''}" for n, ep, _ in CASES])
def test_tp2_logits_equal_tp1(pool, tiny_path, name, expert_parallel, spec):
    r0, r1 = pool.run(fns.tp_and_tp1_logits, str(tiny_path(name)), expert_parallel)
    assert r1["logits"] is None and r0["spec"] == r1["spec"] == spec
    assert r0["logits"].shape == r0["ref"].shape == (len(fns.PROMPT), 512)
    torch.testing.assert_close(r0["logits"], r0["ref"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,expert_parallel", [(n, ep) for n, ep, _ in CASES],
                         ids=[f"{n}{'-ep' if ep else ''}" for n, ep, _ in CASES])
def test_the_simulators_per_rank_shape_counts_each_ranks_parameters(pool, tiny_path, name,
                                                                    expert_parallel):
    """lab/sim/model_shape.py at tensor_parallel_size=2 against the loaded ranks: parameters
    and fp32 weight bytes of each rank (heads, kv heads replicated or split, vocab-parallel
    embedding, replicated norms and MLA latent projections, experts split or whole)."""
    from lab.sim.model_shape import ModelShape

    cfg = AutoConfig.from_pretrained(tiny_path(name))
    shape = ModelShape.from_hf_config(cfg, 2, expert_parallel)
    for rank in pool.run(fns.rank_params, str(tiny_path(name)), expert_parallel):
        assert rank == {"params": shape.num_params, "weight_bytes": shape.weight_bytes(4)}


@pytest.mark.parametrize("name,expert_parallel", [("tiny_llama", False), ("tiny_deepseek", False),
                                                  ("tiny_deepseek", True)])
def test_tp2_int8_logits_equal_tp1(pool, tiny_path, name, expert_parallel):
    """quant=int8 (experts too): weight scales (weight_amax) and activation scales
    (activation_amax, lab/quant/base.py) equal TP=1's, so TP=2 gives TP=1's int8 logits up to
    the order of fp32 sums (measured 2e-7 relative), far below the quantization error itself."""
    r0, _ = pool.run(fns.tp_and_tp1_logits, str(tiny_path(name)), expert_parallel, "int8")

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    quant_err = rel(r0["ref"], r0["dense"])  # TP=1 int8 against dense: ~4 % llama, ~20 % deepseek
    assert quant_err > 1e-2  # the comparison below would mean nothing for an unquantized model
    assert rel(r0["logits"], r0["ref"]) < 1e-5


def test_divisibility_is_refused_by_field(tiny_path):
    """Construction-time checks name the config field (a group of 3 needs no processes)."""
    tp3 = GroupCoordinator([0, 1, 2], 0)
    llama = AutoConfig.from_pretrained(tiny_path("tiny_llama"))
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by "
                                         "tensor_parallel_size=3"):
        LlamaForCausalLM.arch_spec.attention_spec(llama, 3)
    llama.num_attention_heads, llama.num_key_value_heads, llama.head_dim = 6, 3, 8
    with pytest.raises(ValueError, match="intermediate_size=128 is not divisible"):
        LlamaForCausalLM(llama, DenseCausalBackend(), tp=tp3)
    deepseek = AutoConfig.from_pretrained(tiny_path("tiny_deepseek"))
    deepseek.num_attention_heads, deepseek.intermediate_size = 6, 128
    with pytest.raises(ValueError, match="^intermediate_size=128"):
        DeepseekV2ForCausalLM(deepseek, DenseCausalBackend(), tp=tp3)
    deepseek.intermediate_size = 126
    with pytest.raises(ValueError, match="n_routed_experts=8"):
        DeepseekV2ForCausalLM(deepseek, DenseCausalBackend(), tp=tp3, expert_parallel=True)
    with pytest.raises(ValueError, match="moe_intermediate_size=32"):
        DeepseekV2ForCausalLM(deepseek, DenseCausalBackend(), tp=tp3)
