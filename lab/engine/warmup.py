"""The warm-up: a few synthetic requests through a fresh engine before the clock of its work
starts (run.py: before the workload's replay; lab serve: before it accepts requests; LLM(...):
when given warmup=True — the `warmup` knob), so that one-time costs stay out of the run: the
first steps of a cold engine pay first-call allocations, oneDNN primitives for new GEMM shapes,
Triton's JIT, a kernel built at its first call and the like (tiny_llama on a 2-core CPU,
attention=torch: a 16-token prefill took 21 ms cold against 3 ms warm, a decode 23 ms against
2 ms), which would land in the run's TTFT / E2E tails and in any step-time profile fitted to
its steps.jsonl.

The requests visit each shape class of a run's steps (with the engine's own sizes):

    step  what it runs                                      requests
    1     a prefill of a full max_num_batched_tokens chunk  warmup-long (at most max_model_len - 1
                                                            tokens and what the cache holds)
    2, 3  a short prefill, then a decode at batch 1         warmup-short (seeded sampling)
    4     the prefills of k short prompts, in one step      warmup-batch-0 .. k-1 (greedy),
                                                            k = min(8, max_num_seqs - 1, what the
                                                            cache holds)
    5     a mixed step: k decodes and one short prefill     + warmup-late, added after step 4
    6-8   decodes at batch k

Smaller sizes (a budget under k short prompts, long_prefill_token_threshold, max_num_seqs = 1, a
tiny cache) make it more or fewer steps: the scheduler decides as it will in the run. With the
core in its own process (engine_client=mp / async_mp) the core steps as the requests reach it,
so steps 4-8 come out roughly so, not exactly. Prompts are distinct random ordinary token ids
(no EOS / BOS / pad / special token), so no warm-up request hits another's prefix. CUDA graphs
and torch.compile's sizes are warmed by the worker at start-up (Worker.initialize_cache): not
repeated here. `executor=sim` has nothing to warm and its virtual clock must not move: skipped.

Then the engine is as if fresh: no request left, the prefix cache emptied (the run gets no hit
from a warm-up prompt), the core's counters, step index and time origin reset
(EngineCore.reset_for_run, in the core's process for engine_client=mp), the engine's
recent_steps / recent_requests cleared. The loggers (JSONL, console, W&B, Prometheus) are
detached meanwhile, so they see no warm-up step or request. The global RNG is not drawn from:
greedy rows draw nothing, and a step whose sampled rows are all seeded draws from their own
generators only (lab/sampling/sampler.py), so a run's unseeded samples are the same with or
without the warm-up. Left behind, deliberately: the scheduler's finished-request ids (the
worker frees the warm-up's rows at the run's first step, as it would after any request) and the
entry of the `warmup` client in a fair queue's counters (a client with nothing waiting counts
for nobody).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lab.core.model_info import eos_token_ids
from lab.core.sampling_params import SamplingParams
from lab.core.stats import StepStats
from lab.metrics.memory import InMemoryLogger

if TYPE_CHECKING:
    from lab.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

PREFIX = "warmup-"  # every warm-up request id starts so (the engine is idle: none can collide)
CLIENT = "warmup"  # their client_id: a fair queue charges no workload client for them
SHORT_PROMPT = 16  # tokens of a short prompt
INTERPRETED_LONG_PROMPT = 64  # the long prefill when Triton kernels run in its interpreter
MAX_BATCH = 8  # the larger decode batch, at most
# tokens of each batch request: decodes enough that warmup-late, added when the batch's first
# tokens come back, lands among them even where a core process has run a step or two ahead
BATCH_TOKENS = 5
LOW_TOKEN_ID = 3  # ids below are special in most vocabularies (the synthetic workload's floor)


@dataclass(frozen=True)
class WarmupRequest:
    """One synthetic request of the warm-up, added once its phase has run `after` steps."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    after: int = 0


@dataclass(frozen=True)
class WarmUp:
    """What a warm-up did: its steps (their statistics, which no logger saw) and seconds."""

    seconds: float
    steps: tuple[StepStats, ...]

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def warm_up(engine: LLMEngine) -> WarmUp | None:
    """Run the warm-up (see the module docstring) through an idle engine and leave it as if
    fresh; None, and nothing done, when its executor runs no kernels (executor=sim). Logs one
    line: "warm-up: 8 steps in 0.41 s (not part of the run)". A step that raises fails the
    warm-up's requests (the engine stays usable) and the error propagates."""
    if not runs_kernels(engine):
        return None
    if engine.has_unfinished_requests():
        raise RuntimeError("warm_up() needs an idle engine: it runs before any request")
    start = time.perf_counter()
    trace = InMemoryLogger()
    loggers, engine.loggers = engine.loggers, [trace]  # the run's loggers see none of it
    phases = warmup_phases(engine)
    try:
        for phase in phases:
            _run_phase(engine, phase)
    except BaseException:  # end what is left of it; its outputs are nobody's
        engine.abort_request([r.request_id for phase in phases for r in phase])
        engine.take_pending()
        raise
    finally:
        engine.loggers = loggers
    engine.recent_steps.clear()
    engine.recent_requests.clear()
    if not engine.core.call_utility("reset_for_run"):
        raise RuntimeError("warm-up: the engine core could not start afresh (requests left?)")
    result = WarmUp(time.perf_counter() - start, tuple(trace.steps))
    log.info("warm-up: %d steps in %.2f s (not part of the run)", result.num_steps, result.seconds)
    return result


def warm_up_new_engine(engine: LLMEngine) -> WarmUp | None:
    """warm_up() when the engine's `warmup` knob is on, for a constructor that hands the engine
    back only once it started (LLM(...), lab serve): a warm-up that fails shuts the engine (its
    core process) down before the error propagates."""
    if not engine.cfg.get("warmup", True):  # (a config from before the knob: on, its default)
        return None
    try:
        return warm_up(engine)
    except BaseException:
        engine.shutdown()
        raise


def runs_kernels(engine: LLMEngine) -> bool:
    """Whether the engine's executor runs a model: not the simulator's; a core process always
    does (engine_client=mp refuses executor=sim)."""
    return engine.executor is None or engine.executor.runs_kernels


def warmup_phases(engine: LLMEngine) -> list[list[WarmupRequest]]:
    """The warm-up's requests, phase by phase (each phase runs until its requests finish)."""
    cfg = engine.cfg
    block_size, max_len = cfg.block_size, engine.max_model_len
    capacity = (engine.num_blocks - 1) * block_size  # tokens the KV cache holds
    rng = np.random.default_rng(0)
    pool = ordinary_token_ids(engine)

    def prompt(n: int) -> list[int]:
        return [int(t) for t in rng.choice(pool, size=max(1, n))]

    budget = cfg.max_num_batched_tokens
    long_len = min(budget, max_len - 1, capacity)
    if engine.triton_interpreted:  # nothing compiles in Triton's interpreter; a long prefill
        long_len = min(long_len, INTERPRETED_LONG_PROMPT)  # there costs seconds, not ms
    # the batch's requests: BATCH_TOKENS each, of which the last is never computed (no KV)
    per_request = -(-(min(SHORT_PROMPT, max_len - 1) + BATCH_TOKENS - 1) // block_size)
    fits = min(MAX_BATCH + 1, cfg.max_num_seqs, (engine.num_blocks - 1) // per_request)
    k = max(1, fits - 1)
    short_len = min(SHORT_PROMPT, max_len - 1, max(1, budget // k))  # k prefills in one step
    greedy = {"temperature": 0.0, "ignore_eos": True}
    batch = [WarmupRequest(f"{PREFIX}batch-{i}", prompt(short_len),
                           SamplingParams(max_tokens=BATCH_TOKENS, **greedy)) for i in range(k)]
    if fits >= 2:  # added once the batch has its first tokens: joins its decodes, a mixed step
        batch.append(WarmupRequest(f"{PREFIX}late", prompt(short_len),
                                   SamplingParams(max_tokens=1, **greedy), after=1))
    return [
        [WarmupRequest(f"{PREFIX}long", prompt(long_len), SamplingParams(max_tokens=1, **greedy))],
        [WarmupRequest(f"{PREFIX}short", prompt(short_len),
                       SamplingParams(max_tokens=2, temperature=1.0, seed=0, ignore_eos=True))],
        batch,
    ]


def ordinary_token_ids(engine: LLMEngine) -> np.ndarray:
    """Token ids a warm-up prompt may hold: the vocabulary (the tokenizer's part of it, when
    that is smaller) from LOW_TOKEN_ID on, without the EOS, BOS and pad ids and the tokenizer's
    special tokens (all ids from 0 on, should that leave none)."""
    hf = engine.hf_config
    vocab = engine.model_info.vocab_size
    special = set(eos_token_ids(hf))
    special.update(i for i in (getattr(hf, "bos_token_id", None),
                               getattr(hf, "pad_token_id", None)) if isinstance(i, int))
    tok = engine.tokenizer.hf if engine.tokenizer is not None else None
    if tok is not None:
        vocab = min(vocab, len(tok))
        special.update(tok.all_special_ids)
    ids = np.setdiff1d(np.arange(LOW_TOKEN_ID, vocab), np.fromiter(special, int, len(special)))
    return ids if ids.size else np.arange(vocab)


def _run_phase(engine: LLMEngine, phase: Sequence[WarmupRequest]) -> None:
    """Add the phase's requests as their `after` comes and step until every one finished."""
    waiting = sorted(phase, key=lambda r: r.after)
    steps = 0
    while waiting or engine.has_unfinished_requests():
        while waiting and waiting[0].after <= steps:
            r = waiting.pop(0)
            engine.add_request(r.prompt_token_ids, r.params, request_id=r.request_id,
                               client_id=CLIENT)
        engine.step()
        steps += 1
