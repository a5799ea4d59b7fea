"""Replaying a workload through the engine on its clock (arrivals at their offsets): real time,
or the simulator's virtual time under `executor=sim`. With the `warmup` knob (on by default) the
engine is warmed up first (lab/engine/warmup.py), before the clock starts: the run's records
and its summary count none of it, save `warmup_seconds` / `warmup_steps`."""

from __future__ import annotations

import logging
from pathlib import Path

from lab.engine.llm_engine import LLMEngine
from lab.engine.warmup import warm_up
from lab.metrics.memory import InMemoryLogger
from lab.metrics.stats import SLO, RunSummary, summarize
from lab.workloads.base import WorkloadRequest

log = logging.getLogger(__name__)


def replay(engine: LLMEngine, requests: list[WorkloadRequest]) -> RunSummary:
    """Warm the engine up (the `warmup` knob; not under executor=sim), then feed requests at
    their arrival offsets, step until all finish, return the summary.

    A request the engine rejects (e.g. too long) is logged and skipped; the others run on.
    Goodput is measured against the config's `slo:` block.
    """
    slo = SLO.from_config(engine.cfg.get("slo"))  # refuse a bad block before the run
    warm = warm_up(engine) if engine.cfg.get("warmup", True) else None
    trace = InMemoryLogger()  # the run's records (the engine itself keeps only the latest)
    engine.loggers.append(trace)
    try:
        wall, rejected = _replay(engine, requests)
    finally:
        engine.loggers.remove(trace)
    if rejected:
        log.warning("%d request(s) were rejected", rejected)
    summary = summarize(trace.steps, trace.requests, wall, slo)
    summary.num_rejected = rejected
    if warm is not None:
        summary.warmup_seconds, summary.warmup_steps = warm.seconds, warm.num_steps
    record_engine(summary, engine)
    return summary


def record_engine(summary: RunSummary, engine: LLMEngine) -> None:
    """What a summary says of the engine that ran: its KV cache (blocks, block size, bytes per
    token, groups), its weights and, when the executor is in this process, how its time is
    measured. The run.py replay and `lab serve`'s loggers both record it."""
    summary.num_kv_blocks = engine.num_blocks - 1
    summary.kv_block_size = engine.cfg.block_size
    summary.kv_bytes_per_token = engine.kv_bytes_per_token
    summary.kv_cache_groups = [g.spec.describe() for g in engine.model_info.kv_groups]
    summary.weight_bytes = engine.weight_bytes
    if engine.executor is not None:
        summary.timing = engine.executor.timing()
    summary.setup = run_setup(engine)


COMPONENTS = ("attention", "kernels", "quant", "scheduler", "preemption", "executor")


def run_setup(engine: LLMEngine) -> dict[str, str]:
    """What ran, as a summary's header names it: the model, dtype, device, each component
    (its `name`, else its target's), the engine client, the core's torch threads and the
    commit (the composed config, so a model an option switched to is the one named)."""
    from hydra.utils import get_object
    from omegaconf import OmegaConf

    from lab.config.dtypes import resolve_dtype_name
    from lab.platform import resolve_device, source_commit
    from lab.speculative.base import SpecConfig

    cfg = engine.cfg
    model = cfg.model.get("name") or Path(str(cfg.model.get("path"))).name
    device = resolve_device(cfg.device)
    setup = {"model": str(model),
             "dtype": resolve_dtype_name(cfg.dtype, engine.hf_config, device.type),
             "device": str(device)}
    for group in COMPONENTS:
        target = cfg[group]._target_
        setup[group] = str(getattr(get_object(target), "name", "") or target.rsplit(".", 1)[-1])
    built = engine.model_info.attention_backend  # attention=auto's choice is the worker's
    if built and built != setup["attention"]:
        setup["attention"] = f"{built} (auto)" if cfg.attention.get("_partial_") else built
    if getattr(get_object(cfg.executor._target_), "runs_kernels", True):
        setup["compile"] = "on" if engine.model_info.compiled else "off"
    threads = engine.cpu_threads
    spec = SpecConfig.of(OmegaConf.to_container(cfg.speculative, resolve=True)
                         if cfg.get("speculative") else None)
    setup["speculative"] = (f"{spec.name} k={spec.num_speculative_tokens}"
                            if spec.num_speculative_tokens else "none")
    setup |= {"engine_client": str(cfg.engine_client), "threads": str(threads),
              "commit": source_commit()}
    return setup


def _replay(engine: LLMEngine, requests: list[WorkloadRequest]) -> tuple[float, int]:
    """Submit at arrival times and step until done: (wall seconds, requests rejected)."""
    clock = engine.clock  # wall time, or the simulator's virtual time
    pending = sorted(requests, key=lambda r: r.arrival_time)
    start = clock.now()
    i, rejected = 0, 0
    while i < len(pending) or engine.has_unfinished_requests():
        now = clock.now()  # arrivals compared as absolute times: sleep_until reaches them
        while i < len(pending) and start + pending[i].arrival_time <= now:
            rejected += _submit(engine, pending[i], start)
            i += 1
        if engine.has_unfinished_requests():
            engine.step()
        elif i < len(pending):
            clock.sleep_until(start + pending[i].arrival_time)
    return clock.now() - start, rejected


def _submit(engine: LLMEngine, wr: WorkloadRequest, start: float) -> int:
    try:
        engine.add_request(wr.prompt_token_ids, wr.sampling_params, request_id=wr.request_id,
                           arrival_time=start + wr.arrival_time, priority=wr.priority,
                           client_id=wr.client_id)
        return 0
    except (ValueError, TypeError) as e:
        log.error("request %s rejected: %s", wr.request_id, e)
        return 1
