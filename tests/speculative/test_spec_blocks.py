"""Speculative decoding's block bookkeeping between the scheduler and the worker, through the real
engine with the replay proposer (tests/speculative/replay.py): the blocks the scheduler trims
after a step (rejected drafts' and lookahead slots) leave the worker's block table too, and a
proposer sees steps of prompt chunks only (a draft model writes its KV of them)."""

from __future__ import annotations

import numpy as np
import pytest

from lab.core.sampling_params import SamplingParams
from lab.engine.llm import LLM
from lab.metrics import InMemoryLogger
from tests.kv import SMALL_KV
from tests.speculative.replay import ReplayProposer, write_replay_option

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [3, 4, 5], list(range(20, 45))]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    llm = LLM(model="tiny_llama", **SMALL_KV)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def run_replay(tmp_path, reference, proposer: str, wrong_every: int, **knobs):
    sequences = [p + r for p, r in zip(PROMPTS, reference)]
    config = write_replay_option(tmp_path, sequences, 3, wrong_every, proposer)
    mem = InMemoryLogger()
    llm = LLM(model="tiny_llama", **SMALL_KV, speculative="replay", config_path=[config],
              stat_loggers=[mem], **knobs)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)], mem.steps


@pytest.mark.parametrize("proposer, wrong_every", [("LookaheadReplayProposer", 1000),
                                                    ("ReplayProposer", 3)])
def test_trimmed_blocks_leave_the_workers_block_table(tmp_path, reference, proposer, wrong_every):
    """16 blocks of 4 tokens: the requests preempt each other, so a block the scheduler trimmed
    goes to another request. The worker kept it in its table (and appended the request's next
    block after it) until CachedRequestData.trimmed: its outputs diverged, or a row overflowed."""
    outputs, steps = run_replay(tmp_path, reference, proposer, wrong_every,
                                num_gpu_blocks=16, block_size=4)
    assert outputs == reference
    assert sum(s.num_preempted for s in steps) > 0
    assert sum(s.num_accepted_tokens for s in steps) > 0


def test_proposer_sees_steps_of_prompt_chunks_only(tmp_path, reference, monkeypatch):
    """A 25-token prompt in chunks of 8: its first chunks emit nothing, and the proposer is still
    called for them (with no drafts allowed), so a draft model can write its KV of them."""
    seen = []
    propose = ReplayProposer.propose

    def record(self, inputs):
        seen.append((inputs.sampled.copy(), inputs.max_drafts.copy()))
        return propose(self, inputs)

    monkeypatch.setattr(ReplayProposer, "propose", record)
    outputs, _ = run_replay(tmp_path, reference, "ReplayProposer", 1000,
                            max_num_batched_tokens=8, max_num_seqs=1)
    assert outputs == reference
    chunk_only = [drafts for sampled, drafts in seen if not sampled.any()]
    assert len(chunk_only) >= 3 + 1  # the 9-token prompt's first chunk, the 25-token one's 3
    assert all(not np.any(drafts) for drafts in chunk_only)
