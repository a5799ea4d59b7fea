"""Every scheduler x preemption pair, on a KV cache small enough to force preemption (except
under `reserve`), finishes every request with exactly the greedy tokens of an unconstrained run
and leaves every block free; `swap` really moves blocks through the CPU swap space (and falls
back to recompute, still exact, when that space is too small)."""

import pytest
import torch

from lab import LLM, SamplingParams
from tests.options import options

SCHEDULERS = options("scheduler")
PREEMPTIONS = options("preemption")
SP = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _workload():
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 500, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 30, (10,), generator=g)]
    priorities = [i % 3 for i in range(len(prompts))]
    return prompts, priorities


@pytest.fixture(scope="module")
def reference():
    prompts, priorities = _workload()
    llm = LLM("tiny_llama", num_gpu_blocks=256, block_size=4)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, SP, priority=priorities)]


@pytest.mark.parametrize("preemption", PREEMPTIONS)
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_pair_under_memory_pressure(scheduler, preemption, reference):
    prompts, priorities = _workload()
    llm = LLM("tiny_llama", scheduler=scheduler, preemption=preemption, num_gpu_blocks=16,
              block_size=4, max_model_len=44)
    outs = llm.generate(prompts, SP, priority=priorities)
    assert [o.outputs[0].token_ids for o in outs] == reference
    preempted = sum(s.num_preempted for s in llm.engine.recent_steps)
    if preemption == "reserve":
        assert preempted == 0
    else:
        assert preempted > 0
    kv = llm.engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks - 1
    steps = llm.engine.recent_steps
    swapped_out = sum(s.swap_out_blocks for s in steps)
    assert (swapped_out > 0) == (preemption == "swap")
    if preemption == "swap":
        back = sum(s.swap_in_blocks + s.swap_in_cached_blocks for s in steps)
        assert back == swapped_out  # every victim came back (copied, or still on the device)
        assert sum(s.swap_out_bytes for s in steps) == swapped_out * kv.bytes_per_block
        assert max(s.num_swapped_reqs for s in steps) > 0
        assert kv.swap_space.num_used_blocks == 0


# kernels=triton runs every op of the model in Triton's interpreter (~9 CPU-s here); the block
# copy it adds is checked against its reference in tests/kernels/test_kernel_copy_blocks.py
@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_swap_through_the_kernels_copy_with_a_full_swap_space(reference, kernels):
    """The kernels option's block copy moves the blocks (kernels=triton: the Triton block-copy
    kernel); a swap space of 3 blocks cannot hold every victim, so some are recomputed instead
    (counted), and tokens stay exact."""
    prompts, priorities = _workload()
    llm = LLM("tiny_llama", preemption="swap", kernels=kernels, num_gpu_blocks=16,
              block_size=4, max_model_len=44)
    three_blocks = 3 * llm.engine.scheduler.kv.bytes_per_block / 2**30
    llm = LLM("tiny_llama", preemption="swap", kernels=kernels, num_gpu_blocks=16,
              block_size=4, max_model_len=44, **{"cache.swap_space_gb": three_blocks})
    outs = llm.generate(prompts, SP, priority=priorities)
    assert [o.outputs[0].token_ids for o in outs] == reference
    steps = llm.engine.recent_steps
    assert sum(s.swap_out_blocks for s in steps) > 0
    assert sum(s.num_swap_fallbacks for s in steps) > 0
    by = {}
    for s in steps:
        for k, v in s.preempted_by_strategy.items():
            by[k] = by.get(k, 0) + v
    assert by.get("swap", 0) > 0 and by.get("recompute", 0) > 0


@pytest.mark.parametrize("bad", [-1, -0.25])
def test_negative_swap_space_is_refused(bad):
    with pytest.raises(ValueError, match="cache.swap_space_gb"):
        LLM("tiny_llama", preemption="swap", num_gpu_blocks=16, **{"cache.swap_space_gb": bad})


def test_swap_without_swap_space_is_refused():
    with pytest.raises(ValueError, match="needs a swap space"):
        LLM("tiny_llama", preemption="swap", num_gpu_blocks=16, **{"cache.swap_space_gb": 0})
