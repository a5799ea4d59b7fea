"""LLMEngine: builds the engine from a composed config and turns prompts into requests."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from lab.clock import Clock
from lab.config.validate import validate_knobs
from lab.core.protocol import CoreStatus, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from lab.core.request import RequestStatus
from lab.core.sampling_params import SamplingParams
from lab.core.stats import RequestStats, StepStats
from lab.engine.builder import build_core, logits_processor_classes, set_cpu_threads
from lab.engine.core import EngineCore
from lab.frontend.output_processor import OutputProcessor
from lab.frontend.outputs import RequestOutput
from lab.frontend.parallel_sampling import ParentRequest
from lab.frontend.processor import ProcessedRequest, Processor
from lab.frontend.tokenizer import load_tokenizer
from lab.metrics.base import StatLogger

if TYPE_CHECKING:
    from lab.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


class LLMEngine:
    """The engine seen from a user: add requests, step, collect outputs and statistics."""

    def __init__(
        self, cfg: DictConfig, loggers: list[StatLogger] | None = None, stats_window: int = 1000,
    ) -> None:
        validate_knobs(cfg)  # every knob named with its allowed values before anything starts
        self.cfg = cfg
        if cfg.engine_client in ("mp", "async_mp"):  # the core in its own process
            from lab.engine.client import AsyncMPClient, MPClient

            self.core = (MPClient if cfg.engine_client == "mp" else AsyncMPClient)(cfg)
            info = self.core.info
            self.executor, self.clock = None, Clock()  # the executor is the core process's
        else:
            set_cpu_threads(cfg.cpu_threads, "inproc")
            self.core, info = build_core(cfg)
            self.executor, self.clock = self.core.executor, self.core.executor.clock
        self.model_info = info.model_info
        self.hf_config = info.model_info.hf_config
        self.weight_bytes = info.model_info.weight_bytes  # parameters after quantization
        self.num_blocks, self.max_model_len = info.num_blocks, info.max_model_len
        self.kv_bytes_per_token = info.kv_bytes_per_token
        self.cpu_threads = info.cpu_threads  # the core's torch threads
        # whether this run's Triton kernels run in Triton's interpreter (slow: smaller workloads)
        self.triton_interpreted = info.model_info.triton_interpreted
        path = info.model_info.tokenizer_path
        self.tokenizer = load_tokenizer(path) if path else None
        self.processor = Processor(self.tokenizer, info.model_info, self.max_model_len,
                                   cfg.max_logprobs, logits_processor_classes(cfg))
        self.output_processor = OutputProcessor(self.tokenizer)
        self.loggers = list(loggers or [])
        # the latest records only: a long-lived engine must not grow; loggers keep the full trace
        self.recent_steps: deque[StepStats] = deque(maxlen=stats_window)
        self.recent_requests: deque[RequestStats] = deque(maxlen=stats_window)
        self._held: dict[str, list[EngineCoreRequest]] = {}  # n > 1: children after child 0
        self._pending: list[RequestOutput] = []  # finished outside step(): reported by the next
        self._ids = itertools.count()

    def shutdown(self) -> None:
        """Release what the engine holds outside this process (engine_client=mp: the core's
        process); in-process there is nothing to do."""
        self.core.shutdown()

    @property
    def scheduler(self) -> Scheduler:
        """The core's scheduler (engine_client=inproc only: with mp it lives in the core's
        process)."""
        if not isinstance(self.core, EngineCore):
            raise AttributeError("engine_client=mp: the scheduler lives in the engine-core "
                                 "process; its statistics reach the loggers")
        return self.core.scheduler

    @property
    def eos_token_id(self) -> int | None:
        return self.model_info.eos_token_id

    # -- requests ------------------------------------------------------------------------------
    def add_request(
        self, prompt: str | list[int], params: SamplingParams | dict | None = None,
        request_id: str | None = None, arrival_time: float | None = None, priority: int = 0,
        client_id: str | None = None,
    ) -> str:
        """Validate and queue a request; return its id. A bad one raises (ValueError /
        TypeError naming what is wrong) and changes nothing."""
        return self.add_requests([RequestSpec(prompt, params, request_id, arrival_time,
                                              priority, client_id)])[0]

    def add_requests(self, specs: Sequence[RequestSpec], label: str = "requests") -> list[str]:
        """Validate every request, then queue them all: all or nothing. An error names the
        request it refuses as `label[index]`. Returns the request ids."""
        batch: set[str] = set()  # ids this batch takes (not yet in the engine)
        ready = []
        for i, spec in enumerate(specs):
            try:
                ready.append(self._prepare(spec, batch))
            except (ValueError, TypeError) as e:
                if len(specs) == 1:
                    raise
                raise type(e)(f"{label}[{i}]: {e}") from None
            batch.add(ready[-1][0])
        for rid, processed, spec in ready:
            self._queue(rid, processed, spec)
        return [rid for rid, _, _ in ready]

    def _prepare(self, spec: RequestSpec, batch: set[str]) -> tuple[str, ProcessedRequest,
                                                                    RequestSpec]:
        processed = self.processor.process(spec.prompt, spec.params)
        validate_metadata(spec.priority, spec.client_id)
        rid = spec.request_id
        if rid is None:
            rid = self._fresh_id(batch)
        elif not isinstance(rid, str):
            raise TypeError(f"request_id={rid!r} must be a string")
        elif self._in_use(rid, batch):
            raise ValueError(f"request_id {rid!r} is already in use")
        return rid, processed, spec

    def _queue(self, rid: str, processed: ProcessedRequest, spec: RequestSpec) -> None:
        """Hand a validated request to the output processor and the core; n > 1 fans out into
        children, of which all but the first wait for its prefill (see parallel_sampling)."""
        arrival = self.clock.now() if spec.arrival_time is None else spec.arrival_time
        params = processed.params
        parent = ParentRequest(rid, params) if params.n > 1 else None
        children = [(rid, params)] if parent is None else [
            (cid, parent.child_params(i)) for i, cid in enumerate(parent.child_ids)]
        for i, (cid, cparams) in enumerate(children):
            self.output_processor.add_request(cid, processed.prompt, processed.prompt_token_ids,
                                              cparams, parent, i)
        core = [self.processor.core_request(cid, processed, cparams, arrival, spec.priority,
                                            spec.client_id) for cid, cparams in children]
        self.core.add_request(core[0])
        if len(core) > 1:
            self._held[core[0].request_id] = core[1:]

    def _fresh_id(self, batch: set[str]) -> str:
        """The next counter value no live request uses (a user may have taken "3")."""
        rid = str(next(self._ids))
        while self._in_use(rid, batch):
            rid = str(next(self._ids))
        return rid

    def _in_use(self, rid: str, batch: set[str]) -> bool:
        """Whether a live request, an unreported output or this batch holds `rid`."""
        return (rid in batch or self.output_processor.has_request(rid)
                or self.core.has_request(rid)
                or any(o.request_id == rid for o in self._pending))

    def abort_request(self, request_ids: list[str]) -> list[RequestOutput]:
        """Abort requests wherever they are; their blocks are freed at once. Returns their final
        outputs (finish reason `abort`), which the next step() reports too, so a step loop sees
        every request finish. A parallel-sampling parent's id aborts all its children."""
        engine_ids = self.output_processor.engine_ids(list(request_ids))
        # children still held back behind an aborted child 0 never reach the core: they end here
        held = [r for first in engine_ids for r in self._held.pop(first, [])]
        core_outs = self.core.abort_requests(engine_ids)
        core_outs += [EngineCoreOutput(r.request_id, [], finish_reason="abort") for r in held]
        outs = self._process(core_outs)
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
        """One engine step; returns the RequestOutputs of this step (per request, as its
        output_kind says: cumulative, delta or final only), after the final outputs of requests
        that finished outside a step (aborted, or failed by a step that raised).

        A step that raises re-raises here after failing exactly the requests it touched (finish
        reason `error`, blocks freed; see EngineCore.step); their outputs come with the next
        step(). The engine serves the next step as usual.
        """
        outputs = self.take_pending()
        if not self.core.has_unfinished_requests():
            return outputs
        try:
            result = self.core.step()
        except BaseException:
            self._pending = outputs + self._process(self.core.take_failed())
            raise
        return outputs + self.absorb(result)

    def take_pending(self) -> list[RequestOutput]:
        """The final outputs of requests that finished outside a step (step() reports them
        first; an asyncio frontend that reads the core itself takes them here)."""
        outputs, self._pending = self._pending, []
        return outputs

    def absorb(self, result: EngineCoreOutputs) -> list[RequestOutput]:
        """One core result -> RequestOutputs: its step statistics to the loggers, its outputs
        through the output processor (see _process). A failed step's result (`error` set)
        gives its requests' final outputs, finish reason `error`."""
        if result.step_stats is not None:
            self.recent_steps.append(result.step_stats)
            for logger in self.loggers:
                logger.on_step(result.step_stats)
        return self._process(result.outputs)

    def core_status(self) -> CoreStatus:
        """The core's requests and KV blocks in use now (over ZMQ for a core process)."""
        return self.core.call_utility("status")

    def _process(self, core_outputs: list[EngineCoreOutput]) -> list[RequestOutput]:
        """Core outputs -> RequestOutputs; stop requests whose text hit a stop string; record
        finished requests' statistics; release parallel-sampling children whose sibling 0 has
        computed the shared prompt."""
        processed = self.output_processor.process_outputs(core_outputs)
        finals = [o for o in core_outputs if o.stats is not None]
        if processed.reqs_to_stop:
            stopped = self.core.abort_requests(processed.reqs_to_stop, RequestStatus.FINISHED_STOPPED)
            # (a core process answers at once without statistics: its own final output,
            # with them, comes with a later step and is recorded then)
            finals += [o for o in stopped if o.stats is not None]
            by_id = {o.request_id: o.stats for o in stopped}
            for out in processed.request_outputs:
                out.metrics = by_id.get(out.request_id, out.metrics)
        for final in finals:
            self._record(final.stats)
        self._release_held(core_outputs)
        return processed.request_outputs

    def _record(self, stats: RequestStats) -> None:
        self.recent_requests.append(stats)
        for logger in self.loggers:
            logger.on_request(stats)

    def _release_held(self, core_outputs: list[EngineCoreOutput]) -> None:
        for out in core_outputs:
            if out.request_id in self._held and (out.new_token_ids or out.finished):
                for request in self._held.pop(out.request_id):
                    self.core.add_request(request)



@dataclass(frozen=True)
class RequestSpec:
    """One request as a caller gives it to `LLMEngine.add_requests`."""

    prompt: str | list[int]
    params: SamplingParams | dict | None = None
    request_id: str | None = None
    arrival_time: float | None = None
    priority: int = 0
    client_id: str | None = None



def validate_metadata(priority: object, client_id: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority={priority!r} is invalid: must be an integer "
                         "(lower values are served first under scheduler=priority)")
    if client_id is not None and not isinstance(client_id, str):
        raise ValueError(f"client_id={client_id!r} is invalid: must be a string or None")



