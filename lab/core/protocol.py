"""What crosses between the frontend (Processor / OutputProcessor) and the engine core: token
ids, sampling parameters, logprobs as plain lists, finish reasons, request and step statistics.
No text, no tokenizer, no tensors: the core can live in another process. Every type here is
plain data that `lab.engine.serial` encodes as MessagePack (msgspec) and decodes back equal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.core.logprobs import LogprobsLists
from lab.core.model_info import ModelInfo
from lab.core.sampling_params import SamplingParams
from lab.core.stats import RequestStats, StepStats


@dataclass(frozen=True)
class EngineCoreRequest:
    """A validated, tokenized request (built by `Processor`, queued by `EngineCore`)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams  # n == 1: a parallel-sampling parent is fanned out before
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0
    client_id: str | None = None


@dataclass
class EngineCoreOutput:
    """What one step (or an abort, or a failed step) produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: LogprobsLists | None = None  # of the new tokens, if the request asked
    new_prompt_logprobs: LogprobsLists | None = None  # prompt positions computed this step
    finish_reason: str | None = None  # stop | length | abort | error | ignored
    stop_reason: int | str | None = None  # the stop token id (the frontend: the stop string)
    num_cached_tokens: int = 0
    stats: RequestStats | None = None  # the finished request's life (finished outputs only)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    """One engine step's result: its requests' outputs and the step's statistics (which travel
    with the outputs, so loggers in the frontend see every step of a core in another process)."""

    outputs: list[EngineCoreOutput]
    step_stats: StepStats | None = None  # None: not a step (an abort's outputs)
    # the step raised in a core process: `outputs` are the requests it failed (reason error)
    error: str | None = None
    utility: UtilityResult | None = None  # the answer to a utility call (no step, no outputs)


@dataclass(frozen=True)
class UtilityCall:
    """Ask the core to run one of `EngineCore.UTILITIES` (e.g. "status") and send the result."""

    call_id: int
    method: str
    args: list[Any]


@dataclass(frozen=True)
class UtilityResult:
    """A utility call's result (plain data), or the error it raised."""

    call_id: int
    result: Any = None
    error: str | None = None


@dataclass(frozen=True)
class CoreStatus:
    """The core's state between steps, for clients and tests (`EngineCore.status`):
    `num_used_blocks` counts device KV blocks held by requests (evictable cached blocks are
    free), so 0 with no request means nothing leaked."""

    num_requests: int
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_blocks: int
    num_swapped_reqs: int


@dataclass(frozen=True)
class CoreInfo:
    """What the frontend learns from the core it built (or that a core process sends back)."""

    model_info: ModelInfo
    num_blocks: int
    max_model_len: int
    kv_bytes_per_token: int
    cpu_threads: int = 0  # the core's torch threads (lab.engine.builder.set_cpu_threads)
