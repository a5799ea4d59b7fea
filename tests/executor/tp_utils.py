"""Shared by the executor tests: engines at tensor_parallel_size=2 kept for a module, the
greedy parity workload of tests/engine/parity_utils.py through one of them, and process checks.

One engine per model runs both parity prompt sets with MP_KNOBS: a budget of 16 tokens
(chunked prefill of the longer prompts), max_num_seqs=3 over prompts that share a 20-token
prefix (prefix-cache hits) and 24 KV blocks of 4 tokens (preemption): the three effects in one
run, as the engine_client=mp parity runs do."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from lab import LLM, SamplingParams
from tests.engine.parity_utils import (
    BASE,
    MAX_TOKENS,
    MP_KNOBS,
    ParityRun,
    blocks_for_groups,
    parity_prompts,
)

TP2 = dict(tensor_parallel_size=2, attention="torch", kernels="torch")


def make_llm(model: str, **knobs) -> LLM:
    """An LLM with the parity knobs (BASE | MP_KNOBS) and `knobs` (MP_KNOBS' blocks as many as
    the model's KV cache groups need, `blocks_for_groups`)."""
    return LLM(model, **blocks_for_groups(
        model, BASE | MP_KNOBS | dict(attention="torch", kernels="torch") | knobs))


@contextmanager
def lazy_engines(**knobs) -> Iterator[Callable[[str], LLM]]:
    """get(model) -> an LLM of that model with `knobs` (make_llm's), built on first use and
    kept until the block ends, when every one built is shut down."""
    built: dict[str, LLM] = {}

    def get(model: str) -> LLM:
        if model not in built:
            built[model] = make_llm(model, **knobs)
        return built[model]

    try:
        yield get
    finally:
        for llm in built.values():
            llm.engine.shutdown()


def parity_run(llm: LLM, sets: tuple[str, ...] = ("default", "prefix")) -> dict[str, ParityRun]:
    """Each prompt set in turn, greedy; the engine holds no request nor block after."""
    runs = {}
    for name in sets:
        before = len(llm.engine.recent_steps)
        prompts = parity_prompts(name)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
        runs[name] = ParityRun(prompts, [o.outputs[0].token_ids for o in outs],
                               list(llm.engine.recent_steps)[before:])
    status = llm.engine.core_status()
    assert (status.num_requests, status.num_used_blocks) == (0, 0), status
    return runs


def assert_parity(runs: dict[str, ParityRun], reference: dict[tuple[int, ...], list[int]]) -> None:
    """Every prompt's ids equal the reference's; chunked prefill, prefix hits and preemption
    all happened in the run."""
    for run in runs.values():
        for p, ids in zip(run.prompts, run.token_ids):
            assert ids == reference[tuple(p)], f"prompt of {len(p)} tokens"
    steps = [s for run in runs.values() for s in run.steps]
    # prompts of up to 58 tokens in steps of at most 16: the longer ones were chunked
    assert max(s.num_scheduled_tokens for s in steps) <= MP_KNOBS["max_num_batched_tokens"]
    assert sum(s.prefix_cache_hits for s in steps) > 0
    assert sum(s.num_preempted for s in steps) > 0


def ids_by_prompt(runs: dict[str, ParityRun]) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): ids for run in runs.values() for p, ids in zip(run.prompts, run.token_ids)}


def alive(pid: int) -> bool:
    """Whether a process of this pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """The pids still alive after waiting up to `timeout_s` for all to end."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    return [p for p in found if alive(p)]


def kill_rank_1_mid_decode(llm: LLM, match: str, within_s: float) -> None:
    """SIGKILL rank 1 while a request decodes: the engine's next steps raise RankFailedError
    matching `match` (`{pid}`: the killed rank's pid) within `within_s` seconds, and no rank is
    left."""
    import signal

    import pytest

    from lab.executor.distributed import RankFailedError

    pids = llm.engine.executor.pids
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    llm.engine.add_request(parity_prompts("default")[3], params)
    llm.engine.step()  # mid-run: the request is being decoded
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match=match.format(pid=pids[1])):
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    assert time.monotonic() - t0 < within_s
    assert wait_gone(pids) == []
