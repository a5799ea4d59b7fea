"""Tensor parallelism on CUDA (NCCL): TP=2 over executor=multiproc gives TP=1's greedy ids.

Needs two GPUs (skipped otherwise, and `gpu`-marked: scripts/gpu_check.sh runs it on a lent
machine with two). fp32 so that the order of the all-reduce's sums cannot flip a greedy choice;
triton_flash so the Triton kernels run with each rank's share of the heads."""

from __future__ import annotations

import pytest
import torch

from lab import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="TP=2 on CUDA needs two GPUs"),
]

KNOBS = dict(device="cuda", dtype="float32", attention="triton_flash", kernels="triton",
             max_num_batched_tokens=64, num_gpu_blocks=64, block_size=16)


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_llama_mqa", "tiny_deepseek"])
def test_tp2_nccl_equals_tp1(model):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 40, 90, 17)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runs = {}
    for tp, executor in ((1, "uniproc"), (2, "multiproc")):
        knobs = KNOBS | (dict(attention="triton_mla") if "deepseek" in model else {})
        llm = LLM(model, executor=executor, tensor_parallel_size=tp, **knobs)
        try:
            runs[tp] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        finally:
            llm.engine.shutdown()
    assert runs[2] == runs[1]
