"""The engine knobs of lab/conf/config.yaml: one table of what each may be, checked once a config is
composed — by run.py before it writes the run directory, and by LLMEngine for every other path
(the offline `LLM`, benchmarks, tests).

    validate_config(cfg)   # ValueError naming the setting and its allowed values, else None

A knob is a top-level key of lab/conf/config.yaml that is not a config group, or a key of one of its
blocks (`slo.ttft_s`). Only the keys lab/conf/config.yaml itself has are known: `+name=value` on the
command line adds a key that nothing reads, so it is refused with the list of knobs. Checks that
need a component's class (which block sizes the attention backend supports) or the machine
(whether CUDA is there for `device=cuda`) run here too, so the user meets the knob-named message
before anything is built; the components keep their own checks as a second line of defence.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from lab.config.compose import (
    declared_knobs,
    is_known_setting,
    nested_groups,
    unknown_setting_message,
)
from lab.distributed.config import BACKENDS
from lab.models.loader import DTYPES
from lab.sim.device import DEVICES


@dataclass(frozen=True)
class Knob:
    """One setting of lab/conf/config.yaml: its (dotted) name, what it may be, and the test."""

    name: str
    allowed: str  # the allowed values, as the error message states them
    ok: Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and v >= low


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _positive(v: Any) -> bool:
    return _is_number(v) and v > 0


def _power_of_two(v: Any) -> bool:
    return _is_int(v) and v >= 1 and v & (v - 1) == 0


def _device(v: Any) -> bool:
    return isinstance(v, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None


def _int_list(v: Any) -> bool:
    return (isinstance(v, Sequence) and not isinstance(v, str) and len(v) > 0
            and all(_int_at_least(1)(s) for s in v))


DTYPE_NAMES = ("auto", *DTYPES)

KNOBS: tuple[Knob, ...] = (
    Knob("max_num_seqs", "an integer >= 1 (most requests running at once)", _int_at_least(1)),
    Knob("max_num_batched_tokens", "an integer >= 1 (token budget of one step)",
         _int_at_least(1)),
    Knob("max_model_len", "null (the model's limit, capped by the KV cache) or an integer >= 2 "
         "(prompt + output tokens of one request)", _or_null(_int_at_least(2))),
    Knob("block_size", "a power of two >= 1 that the attention backend supports (tokens per KV "
         "block; 16 is the default)", _power_of_two),
    Knob("num_gpu_blocks", "null (size the KV cache from memory) or an integer >= 2 (block 0 is "
         "the null block)", _or_null(_int_at_least(2))),
    Knob("gpu_memory_utilization", "a number in (0, 1] (fraction of GPU memory)",
         lambda v: _positive(v) and v <= 1),
    Knob("cpu_kv_cache_gb", "null (room for one request of the model's context, at most 1 GiB) "
         "or a number of GiB > 0", _or_null(_positive)),
    Knob("enable_prefix_caching", "true or false", lambda v: isinstance(v, bool)),
    Knob("max_logprobs", "an integer >= 0, or -1 for no limit (the most logprobs / "
         "prompt_logprobs a request may ask for)", lambda v: _is_int(v) and v >= -1),
    Knob("long_prefill_token_threshold", "an integer >= 0 (0 = off)", _int_at_least(0)),
    Knob("seed", "an integer in [0, 2**63)", lambda v: _is_int(v) and 0 <= v < 2**63),
    Knob("device", "auto, cpu, cuda or cuda:N", _device),
    Knob("cpu_threads", "null (torch's default; in the core process of engine_client=async_mp: "
         "CPU cores - 1, one left to the server) or an integer >= 1 (torch threads of the engine core)",
         _or_null(_int_at_least(1))),
    Knob("engine_client", "inproc (the engine core in this thread), mp (in its own process, "
         "synchronous client) or async_mp (in its own process, asyncio client: lab serve's "
         "default)", lambda v: v in ("inproc", "mp", "async_mp")),
    Knob("async_scheduling", "true or false (schedule the next step while one runs: vLLM V1's "
         "async scheduling)", lambda v: isinstance(v, bool)),
    Knob("dtype", ", ".join(DTYPE_NAMES), lambda v: str(v).lower() in DTYPE_NAMES),
    Knob("tensor_parallel_size", "an integer >= 1 (ranks each layer is split over; > 1 with "
         "executor=multiproc or executor=ray)", _int_at_least(1)),
    Knob("expert_parallel", "true or false (MoE: whole experts per rank)",
         lambda v: isinstance(v, bool)),
    Knob("distributed_backend", f"one of {', '.join(BACKENDS)} (auto: nccl on CUDA, gloo on "
         "CPU)", lambda v: v in BACKENDS),
    Knob("enable_dbo", "true or false (micro-batching: two micro-batches per step, "
         "docs/ubatch.md)", lambda v: isinstance(v, bool)),
    Knob("dbo_decode_token_threshold", "an integer >= 2 (tokens from which enable_dbo splits a "
         "pure-decode step)", _int_at_least(2)),
    Knob("dbo_prefill_token_threshold", "an integer >= 2 (tokens from which enable_dbo splits a "
         "step with prefill tokens)", _int_at_least(2)),
    Knob("cudagraph_capture_sizes", "null (vLLM's decode sizes on CUDA, none on a CPU) or a "
         "list of integers >= 1 (decode batch sizes to pad to and capture)",
         lambda v: v is None or (isinstance(v, Sequence) and not isinstance(v, str)
                                 and len(v) > 0 and all(_int_at_least(1)(s) for s in v))),
    Knob("enforce_eager", "true or false (true: no CUDA graphs, no padding)",
         lambda v: isinstance(v, bool)),
    Knob("compile", "true or false (true: the forward through torch.compile, attention an "
         "opaque op; docs/compile.md)", lambda v: isinstance(v, bool)),
    Knob("compile_sizes", "null (one decode-sized warm-up step) or a list of integers >= 1 "
         "(token counts of the start-up warm-up steps; the first compiles)",
         _or_null(_int_list)),
    Knob("slo.ttft_s", "null (no bound) or a number of seconds > 0", _or_null(_positive)),
    Knob("slo.tpot_s", "null (no bound) or a number of seconds > 0", _or_null(_positive)),
    Knob("slo.e2e_s", "null (no bound) or a number of seconds > 0", _or_null(_positive)),
    Knob("sim.device", f"one of {', '.join(DEVICES)} (the device executor=sim simulates)",
         lambda v: isinstance(v, str) and v.lower() in DEVICES),
)


def validate_config(cfg: DictConfig) -> None:
    """Refuse unknown top-level keys and every knob outside its allowed values (ValueError)."""
    check_known_keys(cfg)
    for knob in KNOBS:
        value = OmegaConf.select(cfg, knob.name)
        if not knob.ok(value):
            raise ValueError(f"{knob.name}={_show(value)} is invalid: must be {knob.allowed}")
    get_class(cfg.attention._target_).check_block_size(cfg.block_size)
    from lab.platform import resolve_device

    resolve_device(cfg.device)
    check_parallel_executor(cfg)
    check_compile(cfg)


def check_compile(cfg: DictConfig) -> None:
    """compile=true runs one rank, and contradicts enforce_eager=true."""
    if not cfg.compile:
        return
    if cfg.enforce_eager:
        raise ValueError("compile=true is invalid with enforce_eager=true (every step eager): "
                         "drop one of them")
    if cfg.tensor_parallel_size > 1:
        raise ValueError(f"compile=true is invalid with tensor_parallel_size="
                         f"{cfg.tensor_parallel_size}: the compiled forward runs one rank; use "
                         "compile=false")


def check_parallel_executor(cfg: DictConfig) -> None:
    """tensor_parallel_size > 1 only with an executor that runs one worker per rank; NCCL only
    on CUDA."""
    get_class(cfg.executor._target_).check_tensor_parallel(cfg.tensor_parallel_size)
    from lab.platform import resolve_device

    if cfg.distributed_backend == "nccl" and resolve_device(cfg.device).type == "cpu":
        raise ValueError(f"distributed_backend=nccl is invalid with device={cfg.device} (the "
                         "CPU here): NCCL runs on CUDA only; use distributed_backend=gloo or auto")


def check_known_keys(cfg: DictConfig) -> None:
    """Every top-level key is a group or a knob of lab/conf/config.yaml; every key of a knob's block
    (slo, sim) is one lab/conf/config.yaml has, or a config group nested in it (sim.step_time)."""
    declared = declared_knobs()
    for key in cfg:
        if not is_known_setting(key):
            raise ValueError(unknown_setting_message(key, list(declared))
                             + " (a +key=value override adds a key that nothing reads)")
        if isinstance(declared.get(key), dict):
            extra = sorted(set(cfg[key] or {}) - set(declared[key]) - nested_groups(key))
            if extra:
                raise ValueError(f"unknown setting '{key}.{extra[0]}': the keys of {key} are "
                                 f"{', '.join(declared[key])}")


def _show(value: Any) -> str:
    """A value as the command line writes it: null, true, 16, 'cuda:x'."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def check_command_line(args: list[str]) -> str | None:
    """The refusal of the first plain `name=value` override whose top-level name is neither a
    config group nor a knob of lab/conf/config.yaml, or None. Run before Hydra parses the command
    line: Hydra's own error for it suggests `+name=value`, which adds a key nothing reads."""
    for arg in args:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        top = arg.split("=", 1)[0].split("@", 1)[0].split(".", 1)[0]
        if not is_known_setting(top):
            return unknown_setting_message(top, list(declared_knobs()))
    return None
