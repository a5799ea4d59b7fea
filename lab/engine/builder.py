"""The builder: a composed config -> the engine core (executor and its workers, KV cache,
scheduler with its policy and preemption strategy). `LLMEngine`, the engine-core process and
the benchmarks build through it; it decides nothing itself (every piece is the config's
`_target_`) beyond sizes derived from the knobs (KV blocks, max_model_len, swap blocks).
"""

from __future__ import annotations

import logging
import os

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from lab.cache.groups import KVCacheGroup, request_capacity
from lab.cache.hashing import make_block_hasher
from lab.config.knobs import EngineKnobs
from lab.config.validate import check_components
from lab.config.worker import WorkerConfig
from lab.core.model_info import model_context_limit
from lab.core.protocol import CoreInfo
from lab.engine.core import EngineCore, freeze_gc_heap
from lab.platform import auto_cpu_threads, busy_cores, usable_cpu_cores
from lab.scheduler.async_scheduler import AsyncScheduler
from lab.scheduler.scheduler import Scheduler, SchedulerConfig
from lab.speculative.base import SpecConfig

log = logging.getLogger(__name__)


def build_core(cfg: DictConfig) -> tuple[EngineCore, CoreInfo]:
    """The engine core of a composed config: executor (and its worker), KV cache, scheduler."""
    check_components(cfg)  # what the components and the machine allow, before anything is built
    wc = worker_config(cfg)
    knobs = wc.knobs
    executor = instantiate(cfg.executor)(config=wc)
    clock = executor.clock  # one clock for engine, core and scheduler
    info = executor.model_info()
    num_blocks = executor.determine_num_blocks(knobs)
    max_model_len = resolve_max_model_len(
        knobs.max_model_len, info.hf_config, num_blocks, knobs.block_size, info.kv_groups,
        knobs.max_num_batched_tokens)
    spec = SpecConfig.of(wc.speculative)
    kv = instantiate(cfg.cache)(num_blocks=num_blocks, max_model_len=max_model_len,
                                bytes_per_block=info.bytes_per_block, groups=info.kv_groups,
                                num_lookahead_tokens=spec.num_lookahead_tokens)
    config = SchedulerConfig(knobs.max_num_seqs, knobs.max_num_batched_tokens, max_model_len,
                             knobs.long_prefill_token_threshold, spec.num_speculative_tokens)
    scheduler_cls = AsyncScheduler if knobs.async_scheduling else Scheduler
    scheduler = scheduler_cls(config, kv, instantiate(cfg.scheduler),
                              instantiate(cfg.preemption), clock=clock.now)
    executor.initialize_cache(num_blocks, max_model_len, num_swap_blocks(scheduler))
    core = EngineCore(scheduler, executor, clock=clock.now,
                      block_hasher=make_block_hasher(knobs.block_size),
                      async_scheduling=knobs.async_scheduling)
    freeze_gc_heap()  # started (weights loaded, warmed up, compiled): what stays is static
    import torch

    return core, CoreInfo(info, num_blocks, max_model_len,
                          info.bytes_per_block // knobs.block_size, torch.get_num_threads())


def core_cpu_threads(knob: int | None, engine_client: str, busy: float | None = None) -> int:
    """The engine core's torch threads: the `cpu_threads` knob; unset, the cores free of other
    work at start (lab.platform.auto_cpu_threads), one fewer in the core of an async_mp
    frontend (a server: HTTP, detokenizing while the core steps), as vLLM-CPU reserves one for
    its API server: on a small machine a torch thread that shares its core with the frontend
    stalls every parallel region of the step. inproc and mp cores (whose frontend waits for
    each step's results) reserve none: with one core less, an mp core ran a compute-bound batch
    at half speed on 2 cores (lab.bench.ipc)."""
    if knob is not None:
        return knob
    return auto_cpu_threads(reserve=1 if engine_client == "async_mp" else 0, busy=busy)


def set_cpu_threads(knob: int | None, engine_client: str) -> int:
    """Set the engine core's torch threads (core_cpu_threads) and say how many, and why."""
    import torch

    omp = os.environ.get("OMP_NUM_THREADS")
    busy = None if knob is not None or omp else busy_cores()  # sampled once, for both
    n = core_cpu_threads(knob, engine_client, busy)
    why = ("cpu_threads" if knob is not None else f"OMP_NUM_THREADS={omp}" if omp else
           f"the cores free at start: other processes kept {busy:.1f} busy"
           + (", one left to the server" if engine_client == "async_mp" else "")
           + "; cpu_threads=N sets them")
    torch.set_num_threads(n)
    log.info("torch threads: %d of %d cores (%s)", n, usable_cpu_cores(), why)
    return n


def worker_config(cfg: DictConfig) -> WorkerConfig:
    """The worker's half of a composed engine config: the model, its components' options (plain
    data: each worker builds its own, in its process), the knobs."""
    return WorkerConfig(
        model_path=instantiate(cfg.model).path(), attention=option_spec(cfg.attention),
        kernels=option_spec(cfg.kernels), quant=option_spec(cfg.quant),
        kv_cache_dtype=cfg.cache.get("dtype", "auto"), kv_hybrid=cfg.cache.get("hybrid", True),
        logits_processors=tuple(option_spec(c) for c in (cfg.get("logits_processors") or {}).values()),
        speculative=option_spec(cfg.speculative) if cfg.get("speculative") else None,
        knobs=EngineKnobs.of(cfg))


def option_spec(node: DictConfig) -> dict:
    """An option's config as plain data, interpolations resolved: what instantiate() builds."""
    return OmegaConf.to_container(node, resolve=True)


def logits_processor_classes(cfg: DictConfig) -> tuple[type, ...]:
    """The configured logits processors' classes, in the listed order: what the frontend's
    Processor checks requests against (the workers build the processors themselves)."""
    return tuple(get_class(c._target_) for c in (cfg.get("logits_processors") or {}).values())


def num_swap_blocks(scheduler: Scheduler) -> int:
    """CPU blocks the worker must hold: the swap space, when the preemption strategy uses it."""
    if not scheduler.preemption.uses_swap_space:
        return 0
    n = scheduler.kv.num_swap_blocks
    if n == 0:
        raise ValueError(f"preemption={scheduler.preemption.name} needs a swap space: set "
                         "cache.swap_space_gb > 0 (GiB of CPU memory; it holds less than one "
                         "KV block now)")
    return n


def resolve_max_model_len(knob: int | None, hf_config, num_blocks: int, block_size: int,
                          groups: tuple[KVCacheGroup, ...] = (),
                          max_step_tokens: int | None = None) -> int:
    """The model's context limit, capped by what the KV cache can hold for one request (in
    every KV cache group at once: lab/cache/groups.py; a step computing at most
    `max_step_tokens` tokens)."""
    model_max = model_context_limit(hf_config)
    capacity = request_capacity(groups, num_blocks - 1, block_size,
                                max_step_tokens or model_max, model_max)
    if knob is None:
        return min(model_max, capacity)
    if knob > model_max:
        raise ValueError(f"max_model_len={knob} exceeds the model's context limit {model_max} "
                         "(max_position_embeddings)")
    if knob > capacity:
        raise ValueError(f"max_model_len={knob} does not fit in the KV cache ({num_blocks} blocks "
                         f"of {block_size} tokens hold {capacity}); the largest that fits is "
                         f"{capacity}: lower max_model_len or add KV blocks")
    return knob
