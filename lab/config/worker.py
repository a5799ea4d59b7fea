"""WorkerConfig: everything a worker needs to load its model and run steps, built once by the
engine from the composed config and handed to the executor (which builds its worker(s) from it).

Plain data (no torch import), frozen: a worker cannot change what the engine decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.distributed.config import ParallelConfig


@dataclass(frozen=True)
class WorkerConfig:
    """The worker's half of the engine config."""

    model_path: Path
    attention: Any  # AttentionBackend (lab/conf/attention)
    kernels: Any  # LayerOps (lab/conf/kernels)
    quant: Any = None  # QuantConfig (lab/conf/quant); None = unquantized
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    seed: int = 0
    kv_cache_dtype: str = "auto"  # cache.dtype: auto (the model's) | fp8
    # lab/conf/logits_processors: factories (Hydra partials) called with a LogitsProcessorContext
    logits_processors: tuple[Any, ...] = ()
    # how the model is split over ranks (tensor_parallel_size, distributed_backend knobs);
    # world size 1: one worker, no process group
    parallel: ParallelConfig = ParallelConfig()
    expert_parallel: bool = False  # MoE: whole experts per rank instead of a slice of each
    # decode batch sizes padded to and captured as CUDA graphs (lab/worker/cudagraph.py); None:
    # vLLM's default sizes on CUDA, none on a CPU; enforce_eager: never pad or capture
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    enforce_eager: bool = False
    # compile=true (lab/compile): the forward through torch.compile, compiled at start-up by
    # warm-up steps of `compile_sizes` tokens (None: one decode-sized step)
    compile: bool = False
    compile_sizes: tuple[int, ...] | None = None
    # micro-batching (lab/worker/ubatch.py): split a step of at least the threshold's tokens
    enable_dbo: bool = False
    dbo_decode_token_threshold: int = 32
    dbo_prefill_token_threshold: int = 512
