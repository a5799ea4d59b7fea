"""A scripted workload through the real LLMEngine (tiny_llama) on a manual clock.

Time moves only inside the executor, by STEP_S = 0.25 s per forward pass, so every timestamp and
latency is an exact multiple of 0.25 (exact in binary floating point). The engine has
block_size 4, max_num_batched_tokens 8, max_num_seqs 4 and 6 KV blocks (5 usable), FCFS,
recompute preemption, prefix caching:

    t=0.00  A: prompt 6 tokens, 4 output tokens    B: prompt 10 tokens, 2 output tokens
    t=0.50  C: prompt 7 tokens whose first 4 are A's (one cached block), 2 output tokens

What happens (the expected records in test_memory_records.py follow from this):
    step 0  A prefills 6, B 2 (chunked)                     blocks A2 B1
    step 1  A decodes, B prefills 7                         blocks A2 B3 (cache full)
    step 2  A decodes, B prefills its last token; C hits 4 tokens but has no block: waits
    step 3  A needs a 3rd block: B (last in) is preempted; no admissions in a step that
            preempted; A finishes
    step 4  B resumes (8 of its 11 tokens hit the cache, 3 recomputed, the last an output
            token, so counted as decode), C admitted (4 hits + 3 computed); B finishes
    step 5  C decodes and finishes
Tokens are ignore_eos greedy; only their counts matter here.
"""

from __future__ import annotations

from lab import LLM, SamplingParams
from lab.engine.llm_engine import LLMEngine
from lab.metrics.base import StatLogger
from lab.metrics.stats import SLO, RunSummary, summarize

STEP_S = 0.25
A = [11, 12, 13, 14, 15, 16]
B = [21, 22, 23, 24, 25, 26, 27, 28, 29, 30]
C = [11, 12, 13, 14, 31, 32, 33]
SCRIPT_SLO = SLO(ttft_s=0.5, tpot_s=0.25, e2e_s=None)


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def build_engine(loggers: list[StatLogger]) -> LLMEngine:
    """tiny_llama with the scheduler's and the core's clocks replaced by a manual one."""
    llm = LLM("tiny_llama", num_gpu_blocks=6, block_size=4, max_num_batched_tokens=8,
              max_num_seqs=4, scheduler="fcfs", preemption="recompute")
    engine = llm.engine
    clock = ManualClock()
    engine.core.clock = engine.scheduler.clock = clock
    engine.core.origin = 0.0
    execute = engine.executor.execute_model

    def timed_execute(sched):
        out = execute(sched)
        clock.t += STEP_S
        return out

    engine.executor.execute_model = timed_execute
    engine.loggers = list(loggers)
    return engine


def run_script(loggers: list[StatLogger], run_dir, config=None) -> RunSummary:
    """Run the script through `loggers` (on_start .. close) and return its summary."""
    engine = build_engine(loggers)
    for lg in loggers:
        lg.on_start(run_dir, config if config is not None else {"script": "abc"}, 3)

    def sp(n: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    engine.add_request(A, sp(4), request_id="A", arrival_time=0.0)
    engine.add_request(B, sp(2), request_id="B", arrival_time=0.0)
    while engine.has_unfinished_requests():
        if engine.core.step_count == 2:
            engine.add_request(C, sp(2), request_id="C", arrival_time=engine.core.clock())
        engine.step()
    summary = summarize(engine.recent_steps, engine.recent_requests, engine.core.clock(),
                        SCRIPT_SLO)
    for lg in loggers:
        lg.close(summary)
    return summary
