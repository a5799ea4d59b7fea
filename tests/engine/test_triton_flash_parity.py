"""Greedy token ids with attention=triton_flash (fp32; Triton's interpreter on CPU) equal those of
attention=torch and of transformers, for tiny Llama and tiny Qwen3, in one run that forces chunked
prefill (a 16-token budget), prefix-cache hits (shared prefixes) and preemption (a tiny cache)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lab import LLM, SamplingParams
from lab.models.tiny import ensure_tiny_model
from tests.options import tiny_models

MAX_TOKENS = 8
KNOBS = dict(dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=16,
             num_gpu_blocks=14, max_model_len=48)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(3, 500, (9,), generator=g).tolist()
    tails = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (14, 3, 20, 1)]
    return [shared + t for t in tails]


def _hf(model_name: str, prompts) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(model_name),
                                                 dtype=torch.float32).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                             attention_mask=torch.ones_like(ids))
        out.append(gen[0, len(p):].tolist())
    return out


def check_backend_parity(model_name: str, backend: str, kernels: str = "triton") -> None:
    """`backend` (with decode splits forced, and the `kernels` ops) and attention=torch give the
    same greedy ids as transformers, in a run with chunked prefill, prefix hits and preemption."""
    prompts = _prompts()
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    runs = {}
    for name in ("torch", backend):
        extra = ({"kernels": kernels, "attention.num_sms": 132,
                  "attention.min_keys_per_split": 8} if name != "torch" else {})
        llm = LLM(model_name, attention=name, **extra, **KNOBS)
        runs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        steps = llm.engine.recent_steps
        assert sum(s.num_preempted for s in steps) > 0
        assert sum(s.prefix_cache_hits for s in steps) > 0
        assert any(s.num_decode_tokens == 0 and s.num_prefill_tokens == 16 for s in steps)
        assert any(s.num_decode_tokens > 0 and s.num_prefill_tokens > 0 for s in steps)
        if name != "torch":  # decode steps went through split-KV + merge
            assert llm.engine.executor.worker.attn_backend.workspace.out is not None
        kv = llm.engine.scheduler.kv
        assert kv.num_free_blocks == kv.num_blocks - 1
    assert runs[backend] == runs["torch"]
    assert runs["torch"] == _hf(model_name, prompts)


# tiny_qwen2 differs from tiny_llama only outside attention (q/k/v bias, tied embeddings)
MODELS = [m for m in tiny_models("gqa") if m != "tiny_qwen2"]


@pytest.mark.parametrize("model_name", MODELS)
def test_triton_flash_matches_torch_and_transformers(model_name):
    """kernels=triton (norms, rotary) on the first model only: Triton's interpreter runs every
    op, and TritonOps vs TorchOps is checked on every GQA preset in test_ops_wiring.py."""
    kernels = "triton" if model_name == MODELS[0] else "torch"
    check_backend_parity(model_name, "triton_flash", kernels)


def test_triton_flash_refuses_bf16_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("the interpreter restriction only applies without CUDA")
    with pytest.raises(ValueError, match="bf16|bfloat16"):
        LLM("tiny_llama", attention="triton_flash", dtype="bfloat16", num_gpu_blocks=16)
