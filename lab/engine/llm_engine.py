"""LLMEngine: builds the engine from a composed config and turns prompts into requests."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module

from hydra.utils import instantiate
from omegaconf import DictConfig

from lab.cache.hashing import make_block_hasher
from lab.engine.core import EngineCore
from lab.engine.knobs import validate_config
from lab.engine.outputs import CompletionOutput, RequestOutput
from lab.engine.request import Request
from lab.metrics.base import StatLogger
from lab.metrics.stats import RequestStats, StepStats
from lab.models.tokenizer import load_tokenizer
from lab.sampling.params import SamplingParams, as_sampling_params
from lab.scheduler.scheduler import Scheduler, SchedulerConfig
from lab.worker.config import WorkerConfig
from lab.worker.worker import CacheSizing

log = logging.getLogger(__name__)


class LLMEngine:
    """The engine seen from a user: add requests, step, collect outputs and statistics."""

    def __init__(
        self, cfg: DictConfig, loggers: list[StatLogger] | None = None, stats_window: int = 1000,
    ) -> None:
        validate_config(cfg)  # every knob named with its allowed values before anything is built
        self.cfg = cfg
        wc = worker_config(cfg)
        self.executor = instantiate(cfg.executor)(config=wc)
        # whether this run's Triton kernels run in Triton's interpreter (slow: smaller workloads)
        self.triton_interpreted = self.executor.runs_kernels and uses_triton(wc) and (
            import_module("lab.kernels").warn_if_interpreted())
        self.clock = self.executor.clock  # one clock for engine, core and scheduler
        info = self.model_info = self.executor.model_info()
        self.hf_config = info.hf_config
        self.weight_bytes = info.weight_bytes  # parameters after quantization
        self.num_blocks = self.executor.determine_num_blocks(CacheSizing(
            cfg.num_gpu_blocks, cfg.gpu_memory_utilization, cfg.cpu_kv_cache_gb))
        self.max_model_len = resolve_max_model_len(
            cfg.max_model_len, self.hf_config, self.num_blocks, cfg.block_size)
        self.kv_bytes_per_token = info.bytes_per_block // cfg.block_size
        scheduler = self._build_scheduler(cfg, info.bytes_per_block)
        self.executor.initialize_cache(
            self.num_blocks, self.max_model_len, num_swap_blocks(scheduler))
        self.core = EngineCore(scheduler, self.executor, clock=self.clock.now)
        self.tokenizer = load_tokenizer(info.tokenizer_path) if info.tokenizer_path else None
        self.block_hasher = make_block_hasher(cfg.block_size)
        self.loggers = list(loggers or [])
        # the latest records only: a long-lived engine must not grow; loggers keep the full trace
        self.recent_steps: deque[StepStats] = deque(maxlen=stats_window)
        self.recent_requests: deque[RequestStats] = deque(maxlen=stats_window)
        self._prompts: dict[str, str | None] = {}
        self._pending: list[RequestOutput] = []  # finished outside step(): reported by the next
        self._ids = itertools.count()

    def _build_scheduler(self, cfg: DictConfig, bytes_per_block: int) -> Scheduler:
        kv = instantiate(cfg.cache)(num_blocks=self.num_blocks, max_model_len=self.max_model_len,
                                    bytes_per_block=bytes_per_block)
        config = SchedulerConfig(
            cfg.max_num_seqs, cfg.max_num_batched_tokens, self.max_model_len,
            cfg.long_prefill_token_threshold)
        return Scheduler(config, kv, instantiate(cfg.scheduler), instantiate(cfg.preemption),
                         clock=self.clock.now)

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def eos_token_id(self) -> int | None:
        return self.model_info.eos_token_id

    # -- requests ------------------------------------------------------------------------------
    def add_request(
        self, prompt: str | list[int], params: SamplingParams | dict | None = None,
        request_id: str | None = None, arrival_time: float | None = None, priority: int = 0,
        client_id: str | None = None,
    ) -> Request:
        """Validate and queue a request; a bad one raises (ValueError / TypeError naming what is
        wrong) and changes nothing."""
        return self.add_requests([RequestSpec(prompt, params, request_id, arrival_time,
                                              priority, client_id)])[0]

    def add_requests(self, specs: Sequence[RequestSpec], label: str = "requests") -> list[Request]:
        """Validate every request, then queue them all: all or nothing. An error names the
        request it refuses as `label[index]`."""
        batch: set[str] = set()  # ids this batch takes (not yet in the scheduler)
        reqs = []
        for i, spec in enumerate(specs):
            try:
                reqs.append(self._make_request(spec, batch))
            except (ValueError, TypeError) as e:
                if len(specs) == 1:
                    raise
                raise type(e)(f"{label}[{i}]: {e}") from None
            batch.add(reqs[-1].request_id)
        for req, spec in zip(reqs, specs):
            self._prompts[req.request_id] = spec.prompt if isinstance(spec.prompt, str) else None
            self.core.add_request(req)
        return reqs

    def _make_request(self, spec: RequestSpec, batch: set[str]) -> Request:
        ids = self._encode(spec.prompt) if isinstance(spec.prompt, str) else spec.prompt
        ids = self._validate_prompt(ids)
        params = SamplingParams() if spec.params is None else as_sampling_params(spec.params)
        validate_metadata(spec.priority, spec.client_id)
        rid = spec.request_id
        if rid is None:
            rid = self._fresh_id(batch)
        elif not isinstance(rid, str):
            raise TypeError(f"request_id={rid!r} must be a string")
        elif self._in_use(rid, batch):
            raise ValueError(f"request_id {rid!r} is already in use")
        arrival = self.clock.now() if spec.arrival_time is None else spec.arrival_time
        return Request(rid, ids, params, self.eos_token_id, arrival, priority=spec.priority,
                       client_id=spec.client_id, block_hasher=self.block_hasher)

    def _encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this engine's model has no tokenizer (a config-only model under "
                             "executor=sim): give prompts as lists of token ids")
        return self.tokenizer.encode(prompt)

    def _fresh_id(self, batch: set[str]) -> str:
        """The next counter value no live request uses (a user may have taken "3")."""
        rid = str(next(self._ids))
        while self._in_use(rid, batch):
            rid = str(next(self._ids))
        return rid

    def _in_use(self, rid: str, batch: set[str]) -> bool:
        """Whether a live request, an unreported output or this batch holds `rid`."""
        return (rid in batch or rid in self.scheduler.requests
                or any(o.request_id == rid for o in self._pending))

    def _validate_prompt(self, ids: object) -> list[int]:
        vocab = self.model_info.vocab_size
        if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
            raise TypeError(f"a prompt must be a string or a list of token ids, not "
                            f"{type(ids).__name__}")
        ids = list(ids)
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens but max_model_len={self.max_model_len} leaves no "
                "room for an output token; shorten the prompt or raise max_model_len")
        return ids

    def abort_request(self, request_ids: list[str]) -> list[RequestOutput]:
        """Abort requests wherever they are; their blocks are freed at once. Returns their final
        outputs (finish reason `abort`), which the next step() reports too, so a step loop sees
        every request finish."""
        outs = [self._finish(r) for r in self.core.abort_requests(list(request_ids))]
        self._pending.extend(outs)
        return outs

    def has_unfinished_requests(self) -> bool:
        """Requests still running or waiting, or final outputs step() has not reported yet."""
        return bool(self._pending) or self.core.has_unfinished_requests()

    def take_outputs(self, request_ids: set[str]) -> list[RequestOutput]:
        """Remove (and return) the not yet reported outputs of these requests."""
        mine = [o for o in self._pending if o.request_id in request_ids]
        self._pending = [o for o in self._pending if o.request_id not in request_ids]
        return mine

    def defer_outputs(self, outputs: list[RequestOutput]) -> None:
        """Hand final outputs back so that the next step() reports them (to their owner)."""
        self._pending.extend(outputs)

    # -- steps ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; returns an output for every request that got a token this step,
        after the final outputs of requests that finished outside a step (aborted, or failed by
        a step that raised).

        A step that raises re-raises here after failing exactly the requests it touched (finish
        reason `error`, blocks freed; see EngineCore.step); their outputs come with the next
        step(). The engine serves the next step as usual.
        """
        outputs, self._pending = self._pending, []
        if not self.core.has_unfinished_requests():
            return outputs
        try:
            updated, stats = self.core.step()
        except BaseException:
            self._pending = outputs + [self._finish(r) for r in self.core.take_failed()]
            raise
        self.recent_steps.append(stats)
        for logger in self.loggers:
            logger.on_step(stats)
        return outputs + [self._finish(r) if r.is_finished else self._output(r) for r in updated]

    def _finish(self, req: Request) -> RequestOutput:
        stats = RequestStats.from_request(req, self.core.origin)
        self.recent_requests.append(stats)
        for logger in self.loggers:
            logger.on_request(stats)
        out = self._output(req)
        out.metrics = stats
        self._prompts.pop(req.request_id, None)
        return out

    def _output(self, req: Request) -> RequestOutput:
        done = req.is_finished
        skip = req.sampling_params.skip_special_tokens
        text = self._decode(req.output_token_ids, skip) if done else ""
        completion = CompletionOutput(0, text, list(req.output_token_ids), req.finish_reason,
                                      req.stop_reason)
        return RequestOutput(req.request_id, self._prompts.get(req.request_id),
                             req.prompt_token_ids, [completion], finished=done)


    def _decode(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


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
        kv_cache_dtype=cfg.cache.get("dtype", "auto"))


@dataclass(frozen=True)
class RequestSpec:
    """One request as a caller gives it to `LLMEngine.add_requests`."""

    prompt: str | list[int]
    params: SamplingParams | dict | None = None
    request_id: str | None = None
    arrival_time: float | None = None
    priority: int = 0
    client_id: str | None = None


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


def validate_metadata(priority: object, client_id: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority={priority!r} is invalid: must be an integer "
                         "(lower values are served first under scheduler=priority)")
    if client_id is not None and not isinstance(client_id, str):
        raise ValueError(f"client_id={client_id!r} is invalid: must be a string or None")


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


def model_context_limit(hf_config) -> int:
    """max_position_embeddings, capped by an active sliding window (lab attends to the full
    context, which equals sliding-window attention only while sequences fit in the window)."""
    limit = getattr(hf_config, "max_position_embeddings", None) or 2048
    window = getattr(hf_config, "sliding_window", None)
    if window and getattr(hf_config, "use_sliding_window", True):
        limit = min(limit, window)
    return limit
