"""lab/sim/model_shape.py against the real thing: the KV cache groups, KV bytes per block and
parameter count of every embedded tiny model equal those of the loaded model; published sizes of
real models."""

import json

import pytest
from transformers import AutoConfig

from lab.cache.groups import num_tensors
from lab.engine.llm import LLM
from lab.executor.sim import kv_cache_groups
from lab.sim.configs import CONFIGS, write_configs
from lab.sim.model_shape import ModelShape
from tests.options import tiny_models


@pytest.fixture(scope="module", params=tiny_models())
def worker(request):
    # 64 blocks: a request of 64 tokens holds blocks in every KV cache group of a hybrid model
    llm = LLM(request.param, num_gpu_blocks=64, max_model_len=64, device="cpu")
    return llm.engine.executor.worker


def test_kv_groups_and_bytes_per_block_equal_the_workers(worker):
    shape = ModelShape.from_hf_config(worker.hf_config)
    groups = kv_cache_groups(worker.hf_config, worker.config)  # what the simulator plans with
    assert groups == worker.kv_groups
    elem = worker.dtype.itemsize  # fp32 on the CPU
    assert (shape.kv_bytes_per_token_per_layer(elem) * worker.block_size * num_tensors(groups)
            == worker.bytes_per_block)


def test_parameter_count_and_bytes_equal_the_loaded_models(worker):
    shape = ModelShape.from_hf_config(worker.hf_config)
    params = {p.untyped_storage().data_ptr(): p.numel() for p in worker.model.parameters()}
    assert shape.num_params == sum(params.values())
    assert shape.weight_bytes(worker.dtype.itemsize) == worker.weight_bytes


def test_active_params_of_a_moe_model_count_top_k_experts():
    cfg = AutoConfig.for_model("deepseek_v2", **_small_moe())
    shape = ModelShape.from_hf_config(cfg)
    expert = 3 * 64 * 32
    # layer 0 dense; layers 1, 2 MoE: 8 experts, 2 active, 1 shared
    assert shape.num_moe_layers == 2
    assert shape.linear_params()[1] == 2 * 8 * expert
    dense, routed = shape.linear_params()
    assert shape.active_linear_params == dense + 2 * 2 * expert
    # total - active: the idle experts, and the embedding table but one row
    assert shape.num_params - shape.num_active_params == routed - 2 * 2 * expert + 512 * 64 - 64


def _small_moe() -> dict:
    return dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16,
                qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
                num_hidden_layers=3, vocab_size=512, architectures=["DeepseekV2ForCausalLM"])


def test_published_sizes_of_real_models(tmp_path):
    dirs = write_configs(tmp_path)
    assert json.loads((dirs["llama3_8b"] / "config.json").read_text()) == CONFIGS["llama3_8b"]
    llama = ModelShape.from_hf_config(AutoConfig.from_pretrained(dirs["llama3_8b"]))
    assert llama.num_params == 8_030_261_248  # Meta-Llama-3-8B
    assert llama.kv_bytes_per_token(2) == 32 * 8 * 128 * 2 * 2 == 128 * 1024
    v3 = ModelShape.from_hf_config(AutoConfig.from_pretrained(dirs["deepseek_v3"]))
    assert 670e9 < v3.num_params < 672e9  # 671B without the MTP layer
    assert 36e9 < v3.num_active_params < 38e9  # 37B activated per token
    assert v3.kv_bytes_per_token(2) == 61 * (512 + 64) * 2
