"""Every scheduler x preemption pair, on a KV cache small enough to force preemption (except
under `reserve`), finishes every request with exactly the greedy tokens of an unconstrained run
and leaves every block free."""

import pytest
import torch

from lab import LLM, SamplingParams
from lab.engine.config import CONF_DIR

SCHEDULERS = sorted(p.stem for p in (CONF_DIR / "scheduler").glob("*.yaml"))
PREEMPTIONS = sorted(p.stem for p in (CONF_DIR / "preemption").glob("*.yaml"))
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
    preempted = sum(s.num_preempted for s in llm.engine.step_stats)
    if preemption == "reserve":
        assert preempted == 0
    else:
        assert preempted > 0
    kv = llm.engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks - 1
