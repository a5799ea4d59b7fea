"""`executor=sim`: no model — a stand-in worker that returns a token for every request whose
prompt is caught up. Measures the engine's own overhead (scheduler, cache manager, stats) and
lets scheduling policies be studied without a GPU. Tokens are a deterministic function of the
request id and its length, so runs are reproducible."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from lab.executor.base import Executor
from lab.scheduler.output import ModelRunnerOutput, SchedulerOutput
from lab.worker.worker import CacheSizing


@dataclass
class _SimState:
    num_tokens: int
    num_computed: int


class SimExecutor(Executor):
    """Executes SchedulerOutputs without a model (optionally with a fixed per-step cost)."""

    worker = None

    def __init__(self, num_blocks: int = 4096, vocab_size: int = 32000) -> None:
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size
        self.states: dict[str, _SimState] = {}

    def determine_num_blocks(self, sizing: CacheSizing) -> int:
        return sizing.num_gpu_blocks or self.num_blocks

    def initialize_cache(
        self, num_blocks: int, max_model_len: int, num_swap_blocks: int = 0
    ) -> None:
        self.num_blocks = num_blocks

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        for rid in sched.finished_req_ids:
            self.states.pop(rid, None)
        for new in sched.scheduled_new_reqs:
            self.states[new.req_id] = _SimState(len(new.prompt_token_ids), new.num_computed_tokens)
        for cached in sched.scheduled_cached_reqs:
            self.states[cached.req_id].num_computed = cached.num_computed_tokens
        sampled = {}
        for rid, n in sched.num_scheduled_tokens.items():
            state = self.states[rid]
            state.num_computed += n
            if state.num_computed >= state.num_tokens:
                sampled[rid] = self._token(rid, state.num_tokens)
                state.num_tokens += 1
        return ModelRunnerOutput(sampled)

    def _token(self, rid: str, n: int) -> int:
        return zlib.crc32(f"{rid}:{n}".encode()) % self.vocab_size
