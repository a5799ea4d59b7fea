"""The builder: a composed config -> the engine core (executor and its workers, KV cache,
scheduler with its policy and preemption strategy). `LLMEngine`, the engine-core process and
the benchmarks build through it; it decides nothing itself (every piece is the config's
`_target_`) beyond sizes derived from the knobs (KV blocks, max_model_len, swap blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from lab.cache.hashing import make_block_hasher
from lab.cache.sizing import CacheSizing
from lab.core.model_info import ModelInfo, model_context_limit
from lab.distributed.config import ParallelConfig
from lab.engine.core import EngineCore, freeze_gc_heap
from lab.platform import usable_cpu_cores
from lab.scheduler.async_scheduler import AsyncScheduler
from lab.scheduler.scheduler import Scheduler, SchedulerConfig
from lab.worker.config import WorkerConfig


@dataclass(frozen=True)
class CoreInfo:
    """What the frontend learns from the core it built (or that a core process sends back)."""

    model_info: ModelInfo
    num_blocks: int
    max_model_len: int
    kv_bytes_per_token: int
    triton_interpreted: bool


def build_core(cfg: DictConfig) -> tuple[EngineCore, CoreInfo]:
    """The engine core of a composed config: executor (and its worker), KV cache, scheduler."""
    import_module("lab.kernels").use_interpreter_without_cuda()  # before any kernel is launched
    wc = worker_config(cfg)
    executor = instantiate(cfg.executor)(config=wc)
    interpreted = bool(executor.runs_kernels and uses_triton(wc) and (
        import_module("lab.kernels").warn_if_interpreted()))
    clock = executor.clock  # one clock for engine, core and scheduler
    info = executor.model_info()
    num_blocks = executor.determine_num_blocks(CacheSizing(
        cfg.num_gpu_blocks, cfg.gpu_memory_utilization, cfg.cpu_kv_cache_gb))
    max_model_len = resolve_max_model_len(
        cfg.max_model_len, info.hf_config, num_blocks, cfg.block_size)
    kv = instantiate(cfg.cache)(num_blocks=num_blocks, max_model_len=max_model_len,
                                bytes_per_block=info.bytes_per_block)
    config = SchedulerConfig(cfg.max_num_seqs, cfg.max_num_batched_tokens, max_model_len,
                             cfg.long_prefill_token_threshold)
    scheduler_cls = AsyncScheduler if cfg.async_scheduling else Scheduler
    scheduler = scheduler_cls(config, kv, instantiate(cfg.scheduler),
                              instantiate(cfg.preemption), clock=clock.now)
    executor.initialize_cache(num_blocks, max_model_len, num_swap_blocks(scheduler))
    core = EngineCore(scheduler, executor, clock=clock.now,
                      block_hasher=make_block_hasher(cfg.block_size),
                      async_scheduling=cfg.async_scheduling)
    freeze_gc_heap()  # started (weights loaded, warmed up, compiled): what stays is static
    return core, CoreInfo(info, num_blocks, max_model_len,
                          info.bytes_per_block // cfg.block_size, interpreted)


def set_cpu_threads(knob: int | None, engine_client: str) -> None:
    """torch's CPU threads for the engine core: the `cpu_threads` knob; unset, the core of an
    async_mp frontend (a server: HTTP, detokenizing while the core steps) leaves it one core,
    as vLLM-CPU reserves one for its API server — on a small machine, a torch thread that
    shares its core with the frontend stalls every parallel region of the step — and inproc
    and mp (whose frontend waits for each step's results) keep torch's default: with one core
    less, an mp core ran a compute-bound batch at half speed on 2 cores (lab.bench.ipc)."""
    n = knob if knob is not None else (
        cpu_threads_for_server_core() if engine_client == "async_mp" else None)
    if n is not None:
        torch.set_num_threads(n)


def cpu_threads_for_server_core() -> int:
    return max(1, usable_cpu_cores() - 1)


def uses_triton(wc: WorkerConfig) -> bool:
    """Whether the worker launches Triton kernels: its attention backend or its layer ops say so
    (a triton_* backend; kernels=triton, or auto on CUDA)."""
    return wc.attention.uses_triton or wc.kernels.uses_triton


def worker_config(cfg: DictConfig) -> WorkerConfig:
    """The worker's half of a composed engine config."""
    return WorkerConfig(
        model_path=instantiate(cfg.model).path(), attention=instantiate(cfg.attention),
        kernels=instantiate(cfg.kernels), quant=instantiate(cfg.quant), device=cfg.device,
        dtype=cfg.dtype, block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens, seed=cfg.seed,
        kv_cache_dtype=cfg.cache.get("dtype", "auto"),
        logits_processors=logits_processor_factories(cfg),
        parallel=ParallelConfig(tensor_parallel_size=cfg.tensor_parallel_size,
                                backend=cfg.distributed_backend),
        expert_parallel=cfg.expert_parallel, enable_dbo=cfg.enable_dbo,
        dbo_decode_token_threshold=cfg.dbo_decode_token_threshold,
        dbo_prefill_token_threshold=cfg.dbo_prefill_token_threshold,
        cudagraph_capture_sizes=capture_sizes_knob(cfg), enforce_eager=cfg.enforce_eager,
        compile=cfg.compile, compile_sizes=compile_sizes_knob(cfg))


def compile_sizes_knob(cfg: DictConfig) -> tuple[int, ...] | None:
    """The compile_sizes knob as a tuple (None: one decode-sized warm-up step)."""
    sizes = cfg.compile_sizes
    return None if sizes is None else tuple(int(s) for s in sizes)


def capture_sizes_knob(cfg: DictConfig) -> tuple[int, ...] | None:
    """The cudagraph_capture_sizes knob as a tuple (None: the device's default)."""
    sizes = cfg.cudagraph_capture_sizes
    return None if sizes is None else tuple(int(s) for s in sizes)


def logits_processor_factories(cfg: DictConfig) -> tuple:
    """The configured logits processors as factories (Hydra partials), in the listed order."""
    return tuple(instantiate(c) for c in (cfg.get("logits_processors") or {}).values())


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


def resolve_max_model_len(knob: int | None, hf_config, num_blocks: int, block_size: int) -> int:
    """The model's context limit, capped by what the KV cache can hold for one request."""
    model_max = model_context_limit(hf_config)
    capacity = (num_blocks - 1) * block_size
    if knob is None:
        return min(model_max, capacity)
    if knob > model_max:
        raise ValueError(f"max_model_len={knob} exceeds the model's context limit {model_max} "
                         "(max_position_embeddings, or the sliding window, which lab does not "
                         "apply, so generations stay exact only within it)")
    if knob > capacity:
        raise ValueError(f"max_model_len={knob} does not fit in the KV cache ({num_blocks} blocks "
                         f"of {block_size} tokens hold {capacity}); the largest that fits is "
                         f"{capacity}: lower max_model_len or add KV blocks")
    return knob
