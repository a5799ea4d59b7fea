"""KV cache groups in `executor=sim`: the simulator groups a model's layers as the real worker
does (lab/cache/groups.py) and sizes its blocks by the same layout, so a config-only hybrid model
plans the capacity a real run would have. Layer windows come from a test double (LlamaSpec's
layers made to slide), so these run on any tree whatever its families' windows; the published
Mistral-7B config runs once MistralSpec applies its window."""

import json
from dataclasses import replace

import pytest
from transformers import AutoConfig

from lab import LLM
from lab.cache.groups import (
    FULL,
    SLIDING_WINDOW,
    KVCacheGroup,
    KVCacheGroupSpec,
    group_layers,
    max_blocks_per_request,
)
from lab.models.llama_arch import LlamaSpec
from lab.models.registry import arch_spec
from lab.sim.configs import CONFIGS, write_configs

WINDOW = 64  # tokens: tiny_llama's 2048 positions pass it


def slide(monkeypatch, pattern: str, window: int) -> None:
    """LlamaSpec's layer i slides over `window` when pattern[i % len(pattern)] is "S" (full
    when "F"): a stand-in for a family with sliding layers (Mistral, Gemma, gpt-oss)."""

    def specs(cls, hf_config, tp_size=1):
        spec = cls.attention_spec(hf_config, tp_size)
        return [replace(spec, sliding_window=window if pattern[i % len(pattern)] == "S" else None)
                for i in range(hf_config.num_hidden_layers)]

    monkeypatch.setattr(LlamaSpec, "layer_attention_specs", classmethod(specs))


SLIDING = KVCacheGroupSpec(SLIDING_WINDOW, WINDOW)
GROUPS = {  # tiny_llama's 2 layers
    ("SF", True): (KVCacheGroup(FULL, (1,)), KVCacheGroup(SLIDING, (0,))),
    ("SF", False): (KVCacheGroup(FULL, (0, 1)),),
    ("S", True): (KVCacheGroup(SLIDING, (0, 1)),),
    ("S", False): (KVCacheGroup(FULL, (0, 1)),),
}


@pytest.mark.parametrize("pattern,hybrid", list(GROUPS))
def test_sim_plans_the_real_cpu_workers_groups_blocks_and_context(monkeypatch, pattern, hybrid):
    slide(monkeypatch, pattern, WINDOW)
    knobs = {"cache.hybrid": hybrid, "cpu_kv_cache_requests": 1}
    real = LLM("tiny_llama", device="cpu", **knobs).engine
    sim = LLM("tiny_llama", executor="sim", **{"sim.device": "cpu"}, **knobs).engine
    assert sim.model_info.kv_groups == real.model_info.kv_groups == GROUPS[pattern, hybrid]
    # fp32: 2 KV heads x 16 x K,V x 4 bytes x 16 tokens a page, one per layer of a group
    pages = 1 if (pattern, hybrid) == ("SF", True) else 2
    assert sim.model_info.bytes_per_block == real.model_info.bytes_per_block == 4096 * pages
    assert sim.num_blocks == real.num_blocks == 129
    assert sim.max_model_len == real.max_model_len
    if pages == 1:  # a request holds full-context blocks in one group, a window's in the other
        assert 1024 <= sim.max_model_len < 2048
    else:
        assert sim.max_model_len == 2048


def test_sim_groups_one_ranks_specs(monkeypatch):
    slide(monkeypatch, "SF", WINDOW)
    one = LLM("tiny_llama", executor="sim").engine
    two = LLM("tiny_llama", executor="sim", tensor_parallel_size=2).engine
    cfg = one.hf_config
    assert two.model_info.kv_groups == group_layers(LlamaSpec.layer_attention_specs(cfg, 2))
    assert two.model_info.kv_groups == one.model_info.kv_groups == GROUPS["SF", True]
    assert two.model_info.bytes_per_block * 2 == one.model_info.bytes_per_block  # 1 KV head


# a Mistral-7B-v0.1 shape (every layer sliding over 4096 tokens, 32k positions) in the Llama
# layout, its window from the test double
MISTRAL_STYLE = {**CONFIGS["llama3_8b"], "max_position_embeddings": 32768, "vocab_size": 32000,
                 "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}


def _capacity(path, hybrid: bool, **knobs):
    """(engine, blocks one request of the model's whole context holds, such requests the cache
    holds at once) of a simulated H100."""
    engine = LLM(str(path), executor="sim", **{"cache.hybrid": hybrid}, **knobs).engine
    step = engine.executor.config.knobs.max_num_batched_tokens
    per_request = max_blocks_per_request(engine.model_info.kv_groups, 32768, 16, step)
    return engine, per_request, (engine.num_blocks - 1) // per_request


def _check_capacity(path):
    full, full_blocks, full_requests = _capacity(path, hybrid=False)
    hybrid, hybrid_blocks, hybrid_requests = _capacity(path, hybrid=True)
    assert [g.spec.sliding_window for g in hybrid.model_info.kv_groups] == [4096]
    assert [g.spec.sliding_window for g in full.model_info.kv_groups] == [None]
    # one group of 32 layers either way: the same blocks of the same bytes
    assert hybrid.model_info.bytes_per_block == full.model_info.bytes_per_block == 32 * 4096 * 16
    assert hybrid.num_blocks == full.num_blocks > 25_000  # ~57 GiB of KV
    assert hybrid.max_model_len == full.max_model_len == 32768
    # a 32k request keeps 2048 blocks, or its window's (4096 + a step's tokens) under hybrid
    assert full_blocks == 2048 and hybrid_blocks < 0.2 * full_blocks
    assert hybrid_requests > 5 * full_requests
    # a cache of 16k tokens takes 16k-token requests, or whole 32k ones under hybrid
    small = {"num_gpu_blocks": 1025}
    assert _capacity(path, hybrid=False, **small)[0].max_model_len == 16384
    assert _capacity(path, hybrid=True, **small)[0].max_model_len == 32768


def test_a_hybrid_config_only_model_plans_more_capacity_than_without_hybrid(monkeypatch,
                                                                             tmp_path):
    slide(monkeypatch, "S", 4096)
    path = tmp_path / "mistral_style"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(MISTRAL_STYLE))
    _check_capacity(path)


def test_mistral_7b_config_plans_more_capacity_than_without_hybrid(tmp_path):
    path = write_configs(tmp_path, ["mistral_7b"])["mistral_7b"]
    cfg = AutoConfig.from_pretrained(path)
    if arch_spec(cfg).layer_attention_specs(cfg)[0].sliding_window is None:
        pytest.skip("MistralSpec applies no sliding window in this tree")
    _check_capacity(path)
