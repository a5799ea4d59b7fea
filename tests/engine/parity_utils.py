"""Shared helpers of the engine parity tests: greedy token ids through `LLM` must equal
transformers' `generate` on the same weights, in four modes: default; chunked prefill with a
budget smaller than the prompts; prefix caching over shared prefixes (hits > 0); and a KV cache
small enough that preemption happens (preemptions > 0). A fifth mode, "swap" (ALL_MODES), preempts
by swapping the victims' blocks out to the CPU and back (preemption=swap).

Each mode runs over both engine clients (the `engine_client` fixture, tests/engine/conftest.py):
inproc builds one engine per mode with the mode's knobs; mp runs every mode's prompts through
one core process per model (`mp_parity_runs`), with the knobs of chunked, prefix and preempt
together (MP_KNOBS), because a core process costs ~6 CPU-s to start (torch import, model load):
four per model would add ~2 CPU-minutes to the suite. Each mode's check (ids, and its
statistic, which mp sends back with the outputs) holds on its prompts' part of that run."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lab import LLM, SamplingParams
from lab.cache.groups import group_layers, max_blocks_per_request
from lab.config.knobs import EngineKnobs
from lab.core.stats import StepStats
from lab.models.registry import arch_spec
from lab.models.tiny import ensure_tiny_model
from tests.kv import SMALL_KV

MAX_TOKENS = 24
BASE = dict(dtype="float32", device="cpu", block_size=8, **SMALL_KV)
MODES = {
    "default": dict(),
    "chunked": dict(max_num_batched_tokens=16),
    # blocks are shared once computed (after their step): admit a few at a time so later
    # prompts find the shared prefix of earlier ones
    "prefix": dict(max_num_seqs=3),
    "preempt": dict(num_gpu_blocks=24, block_size=4, max_model_len=64),
}
# preemption=swap: the preempt mode's cache, each victim's blocks parked in a CPU swap space
# (cache.swap_space_gb: thousands of the tiny models' blocks) and copied back when it resumes
ALL_MODES = MODES | {"swap": MODES["preempt"] | {"preemption": "swap",
                                                  "cache.swap_space_gb": 0.01}}
# engine_client=mp: the knobs of chunked, prefix and preempt at once; max_model_len holds the
# longest prefix prompt (58 tokens) and its 24 new tokens in 22 of the 23 usable blocks
MP_KNOBS = MODES["chunked"] | MODES["prefix"] | MODES["preempt"] | dict(max_model_len=88)


def mp_on_the_first_only(engine_client: str, case: str, first: str, what: str) -> None:
    """Skip the mp run of every `case` but the `first` (a model, a backend): the core process
    runs the same code as inproc does, checked once (each mp run costs a process start in the
    suite's CPU budget)."""
    if engine_client == "mp" and case != first:
        pytest.skip(f"an mp core process runs the same {what}: checked on the first "
                    f"({first}; each mp run costs a process start in the suite's CPU budget)")


def prompt_set(mode: str) -> str:
    """Which prompts a mode runs: "prefix" (shared prefixes) or "default"."""
    return "prefix" if mode == "prefix" else "default"


def parity_prompts(mode: str) -> list[list[int]]:
    """Ten prompts of 1..38 tokens; in "prefix" mode each starts with the same 20 tokens."""
    g = torch.Generator().manual_seed(7)
    lengths = [3, 9, 17, 30, 5, 38, 12, 21, 1, 26]
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in lengths]
    if mode == "prefix":
        shared = torch.randint(3, 500, (20,), generator=g).tolist()
        prompts = [shared + p for p in prompts]
    return prompts


def hf_greedy_outputs(model_name: str) -> dict[tuple[int, ...], list[int]]:
    """transformers' greedy continuations of every parity prompt, one prompt at a time (no
    padding effects), keyed by the prompt."""
    path = ensure_tiny_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = {}
    for mode in ("default", "prefix"):
        for p in parity_prompts(mode):
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                                 attention_mask=torch.ones_like(ids))
            out[tuple(p)] = gen[0, len(p):].tolist()
    return out


@dataclass
class ParityRun:
    """One prompt set through an engine: each prompt's greedy ids and the steps it took."""

    prompts: list[list[int]]
    token_ids: list[list[int]]
    steps: list[StepStats]


def kv_groups(model_name: str, hybrid: bool = True) -> tuple:
    """The preset's KV cache groups (lab/cache/groups.py): one unless its layers mix kinds."""
    cfg = AutoConfig.from_pretrained(ensure_tiny_model(model_name))
    return group_layers(arch_spec(cfg).layer_attention_specs(cfg), hybrid)


def blocks_for_groups(model_name: str, knobs: dict) -> dict:
    """`knobs` with num_gpu_blocks (a count sized for one full-attention group: a request of
    max_model_len and a couple to spare, so requests preempt each other) replaced, for a model
    with sliding-window KV cache groups, by what a request of max_model_len holds over its
    groups plus two: the same pressure, as a window's blocks are freed."""
    if knobs.get("num_gpu_blocks") is None:
        return knobs
    groups = kv_groups(model_name, knobs.get("cache.hybrid", True))
    if all(g.spec.sliding_window is None for g in groups):
        return knobs
    step = knobs.get("max_num_batched_tokens", EngineKnobs().max_num_batched_tokens)
    need = max_blocks_per_request(groups, knobs["max_model_len"], knobs["block_size"], step)
    return knobs | {"num_gpu_blocks": need + 2}


def run_parity(model_name: str, sets: list[str], **knobs) -> dict[str, ParityRun]:
    """Run each prompt set ("default", "prefix") in turn through one LLM (BASE + `knobs`, which
    may name the engine_client; num_gpu_blocks as for one KV cache group, `blocks_for_groups`);
    assert that the core holds no request and no KV block after, and shut the engine down (an
    mp core process ends)."""
    llm = LLM(model_name, **blocks_for_groups(model_name, BASE | knobs))
    try:
        runs = {}
        for name in sets:
            before = len(llm.engine.recent_steps)
            prompts = parity_prompts(name)
            outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
            assert [o.prompt_token_ids for o in outs] == prompts
            runs[name] = ParityRun(prompts, [o.outputs[0].token_ids for o in outs],
                                   list(llm.engine.recent_steps)[before:])
        status = llm.engine.core_status()  # over ZMQ from an mp core process
        assert (status.num_requests, status.num_used_blocks) == (0, 0), status
        return runs
    finally:
        llm.engine.shutdown()


def mp_parity_runs(model_name: str, **knobs) -> dict[str, ParityRun]:
    """Both prompt sets through one engine_client=mp core process with MP_KNOBS (+ `knobs`)."""
    return run_parity(model_name, ["default", "prefix"], engine_client="mp",
                      **(MP_KNOBS | knobs))


def model_name_fixture(models: list[str], slow: tuple[str, ...] = ()):
    """A module-scoped `model_name` fixture over `models` (assign it to that name); the models
    in `slow` run only in the heavy profile (`-m slow`)."""
    params = [pytest.param(m, marks=pytest.mark.slow) if m in slow else m for m in models]

    @pytest.fixture(scope="module", params=params)
    def model_name(request):
        return request.param

    return model_name


def parity_fixtures(models: list[str], **knobs):
    """A parity module's module-scoped fixtures over `models`: `model_name`, `hf_outputs`
    (transformers' greedy continuations, one prompt at a time: no padding effects) and
    `mp_runs` (mp_parity_runs with `knobs`); assign them to those names there."""
    model_name = model_name_fixture(models)

    @pytest.fixture(scope="module")
    def hf_outputs(model_name):
        return hf_greedy_outputs(model_name)

    @pytest.fixture(scope="module")
    def mp_runs(model_name):
        return mp_parity_runs(model_name, **knobs)

    return model_name, hf_outputs, mp_runs


def check_greedy_parity(model_name: str, hf_outputs: dict, mode: str, engine_client: str,
                        mp_runs: dict[str, ParityRun] | None = None, **knobs) -> None:
    """Assert the mode's prompts gave transformers' ids and the mode's effect happened.
    inproc: run them now (BASE + the mode's knobs + `knobs`); mp: take them from `mp_runs`
    (`mp_parity_runs` of this model: a test module's fixture, so one process per model)."""
    if engine_client == "mp":
        run = mp_runs[prompt_set(mode)]
    else:
        assert engine_client == "inproc", engine_client
        name = prompt_set(mode)
        run = run_parity(model_name, [name], **(ALL_MODES[mode] | knobs))[name]
    for p, ids in zip(run.prompts, run.token_ids):
        assert ids == hf_outputs[tuple(p)], f"prompt of {len(p)} tokens"
    steps = run.steps
    if mode == "prefix":
        assert sum(s.prefix_cache_hits for s in steps) > 0
    if mode in ("preempt", "swap"):
        assert sum(s.num_preempted for s in steps) > 0
    if mode == "swap":
        assert sum(s.swap_out_blocks for s in steps) > 0
    if mode == "chunked":
        assert max(s.num_scheduled_tokens for s in steps) <= 16
