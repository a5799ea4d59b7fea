"""Greedy token ids with attention=triton_mla (fp32; Triton's interpreter on CPU) equal those of
attention=torch and of transformers, for tiny DeepSeek-V2 (with q_lora), V2-Lite (without) and V3,
in one run that forces chunked prefill (a 16-token budget: mixed prefill + decode steps go
through both paths), prefix-cache hits (shared prefixes) and preemption (a tiny cache), with
decode splits forced so the LSE merge runs. `kernels=triton` also puts norms, rotary and the
fused MoE through Triton."""

import pytest
import torch

from lab import LLM, SamplingParams
from tests.engine.test_triton_flash_parity import KNOBS, MAX_TOKENS, _hf, _prompts

MODELS = ["tiny_deepseek", "tiny_deepseek_lite", "tiny_deepseek_v3"]


@pytest.mark.parametrize("model_name", MODELS)
def test_triton_mla_matches_torch_and_transformers(model_name):
    prompts = _prompts()
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    runs = {}
    for backend in ("torch", "triton_mla"):
        extra = ({"kernels": "triton", "attention.num_sms": 132,
                  "attention.min_keys_per_split": 8} if backend != "torch" else {})
        llm = LLM(model_name, attention=backend, **extra, **KNOBS)
        runs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        steps = llm.engine.step_stats
        assert sum(s.num_preempted for s in steps) > 0
        assert sum(s.prefix_cache_hits for s in steps) > 0
        assert any(s.num_decode_tokens > 0 and s.num_prefill_tokens > 0 for s in steps)
        if backend != "torch":  # decode steps went through split-KV + merge
            assert llm.engine.executor.worker.attn_backend.workspace.out is not None
        kv = llm.engine.scheduler.kv
        assert kv.num_free_blocks == kv.num_blocks - 1
    assert runs["triton_mla"] == runs["torch"]
    assert runs["torch"] == _hf(model_name, prompts)


def test_backends_refuse_the_other_kind_naming_the_alternative():
    with pytest.raises(ValueError, match="triton_mla"):
        LLM("tiny_deepseek", attention="triton_flash")
    with pytest.raises(ValueError, match="triton_mla does not support 'gqa'"):
        LLM("tiny_llama", attention="triton_mla")


def test_triton_mla_refuses_bf16_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("bf16 runs on CUDA")
    with pytest.raises(ValueError, match="bfloat16"):
        LLM("tiny_deepseek", attention="triton_mla", dtype="bfloat16")
