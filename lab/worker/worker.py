"""Worker: owns the device, the model and its KV cache; sizes the cache from memory.

One worker per rank: `Worker(config, rank, init_method)` joins the engine's process group when
`config.parallel` has more than one rank (every rank's worker is built at once, by the
multiproc or ray executor, with the same `init_method`), loads its shard of the model with its
TP group, and sizes its KV cache from its own per-rank spec (its share of the KV heads). A world
of one rank (executor=uniproc) builds no process group at all.
"""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate

from lab.attention.auto import build_backend
from lab.attention.base import KVCache, KVCacheSpec, kv_cache_torch_dtype
from lab.cache.groups import (
    SLIDING_WINDOW,
    KVCacheGroup,
    describe_groups,
    group_layers,
    layer_group_index,
    layer_tensor_index,
    num_tensors,
)
from lab.cache.sizing import CacheSizing, cpu_kv_bytes
from lab.compile import CompiledForward, CompileOptions, compile_model, warmup_sizes
from lab.compile.policy import should_compile
from lab.config.worker import WorkerConfig
from lab.core.model_info import ModelInfo, eos_token_ids, max_positions
from lab.core.sampling_params import SamplingParams
from lab.core.step import ModelRunnerOutput, NewRequestData, SchedulerOutput
from lab.distributed.parallel_state import (
    ParallelState,
    destroy_parallel_state,
    init_parallel_state,
    single_process_state,
)
from lab.kernels import use_interpreter_without_cuda, warn_if_interpreted
from lab.layers.ops import LayerOps
from lab.logits_processors.base import LogitsProcessorContext
from lab.models.loader import load_model, resolve_dtype
from lab.platform import rank_device
from lab.quant.base import weight_bytes
from lab.speculative.base import Proposer, ProposerContext, SpecConfig
from lab.worker.cudagraph import resolve_capture_sizes
from lab.worker.memory import CudaMemory, DeviceMemory, profile_memory
from lab.worker.model_runner import ModelRunner
from lab.worker.swap import BlockSwapper

log = logging.getLogger(__name__)


class Worker:
    """Loads the model (its rank's shard) on its device and runs steps through its ModelRunner."""

    def __init__(self, config: WorkerConfig, rank: int = 0, init_method: str | None = None,
                 memory: DeviceMemory | None = None, cpu_threads: int | None = None) -> None:
        """`memory`: the device allocator the KV budget is profiled on (None: CudaMemory on
        CUDA; a CPU sizes its cache from cpu_kv_cache_gb instead); tests pass a fake.
        `cpu_threads`: torch's threads when this worker runs on the CPU (a rank's share of the
        cores; None keeps torch's setting)."""
        use_interpreter_without_cuda()  # Triton's interpreter where there is no CUDA
        self.config = config
        self.rank = rank
        self.device = rank_device(config.knobs.device, rank, config.parallel.world_size)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        self.memory = memory if memory is not None else (
            CudaMemory(self.device) if self.device.type == "cuda" else None)
        self.state = self._join_group(init_method)
        self.kv_cache_dtype = config.kv_cache_dtype  # cache.dtype: auto (the model's) | fp8
        torch.manual_seed(config.knobs.seed)
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(config.model_path)
        # the components, built here from their options (in this rank's process); attention=auto
        # chooses by the device and the model (lab/attention/auto.py)
        self.attn_backend = build_backend(config.attention, self.device, hf_config)
        self.block_size = config.knobs.block_size
        self.max_num_seqs = config.knobs.max_num_seqs
        self.max_num_batched_tokens = config.knobs.max_num_batched_tokens
        self.cudagraph_sizes = resolve_capture_sizes(
            config.knobs.cudagraph_capture_sizes, config.knobs.enforce_eager, self.device,
            config.knobs.max_num_seqs, config.knobs.max_num_batched_tokens)
        self.hf_config = None
        self.dtype = None
        self.model = None
        self.ops = instantiate(config.kernels)
        self.quant = instantiate(config.quant)
        self.weight_bytes = 0
        # whether this worker's Triton kernels run in Triton's interpreter (slow: no CUDA)
        self.triton_interpreted = bool((self.attn_backend.uses_triton or self.ops.uses_triton)
                                       and warn_if_interpreted())
        self._load(config.model_path, hf_config, config.knobs.dtype, self.ops)
        self.kv_groups = group_layers(self.model.layer_specs, config.kv_hybrid)
        if len(self.kv_groups) > 1:
            log.info("KV cache: %s", describe_groups(self.kv_groups))
        self.compiled = self._compile_if_asked()
        self.proposer = self._build_proposer()
        self.runner: ModelRunner | None = None

    def _compile_if_asked(self) -> CompiledForward | None:
        """The model through torch.compile when the compile knob says so (null: auto, by
        lab/compile/policy.py), else None (eager); the choice is logged."""
        knobs = self.config.knobs
        num_params = sum(p.numel() for p in self.model.parameters())
        wanted, why = should_compile(knobs.compile, self.device, num_params,
                                     self.config.parallel.world_size, knobs.enforce_eager)
        log.info("%s", why)
        if not wanted:
            return None
        return compile_model(self.model, self.attn_backend, CompileOptions.for_device(
            self.device, knobs.max_num_batched_tokens))

    def _build_proposer(self) -> Proposer | None:
        """The speculative option's proposer (lab/speculative), built with the target's
        context; None when speculation is off."""
        option = self.config.speculative
        if not SpecConfig.of(option).num_speculative_tokens:
            return None
        check_proposer_groups(get_class(option["_target_"]), self.kv_groups,
                              (self.hf_config.architectures or ["the target"])[0])
        context = ProposerContext(
            max_model_len=max_positions(self.hf_config), vocab_size=self.hf_config.vocab_size,
            block_size=self.block_size, device=self.device, dtype=self.dtype,
            model_path=self.config.model_path, model=self.model, attn_backend=self.attn_backend,
            ops=self.ops)
        return instantiate(option)(context=context)

    def _join_group(self, init_method: str | None) -> ParallelState:
        """This rank's process groups (a state of one rank when the world has one)."""
        parallel = self.config.parallel
        if parallel.world_size == 1:
            return single_process_state()
        if init_method is None:
            raise ValueError(f"a worker of a world of {parallel.world_size} ranks needs the "
                             "group's init_method (the executor's rendezvous address)")
        return init_parallel_state(parallel, self.rank, init_method, self.device)

    def shutdown(self) -> None:
        """Leave the process group (idempotent; nothing to do for a world of one)."""
        destroy_parallel_state(self.state)

    def _load(self, model_path: Path, hf_config, dtype: str, ops: LayerOps) -> None:
        self.dtype = resolve_dtype(dtype, hf_config, self.device)
        self._set_up_kernels(ops)
        self.model, self.hf_config = load_model(
            model_path, self.attn_backend, self.dtype, self.device, ops, self.quant,
            tp=self.state.tp, expert_parallel=self.config.knobs.expert_parallel,
            hf_config=hf_config)
        self.weight_bytes = weight_bytes(self.model)
        log.info("model weights: %.2f MiB (quant=%s)", self.weight_bytes / 2**20,
                 getattr(self.quant, "name", "none"))

    def _set_up_kernels(self, ops: LayerOps) -> None:
        """Build or load every kernel the kernels option and the attention backend need (lab's
        C++ CPU kernels: lab/kernels/cpu_ext.py), before the model loads and so before the
        engine reports ready: no request waits for a build."""
        start = time.perf_counter()
        ops.setup(self.device, self.dtype)
        self.attn_backend.setup(self.device)
        log.debug("kernels set up in %.1f s", time.perf_counter() - start)

    def model_info(self) -> ModelInfo:
        return ModelInfo.of(self.hf_config, self.bytes_per_block, self.weight_bytes,
                            self.config.model_path, self.triton_interpreted, self.kv_groups,
                            self.attn_backend.name, self.compiled is not None)

    @property
    def kv_spec(self) -> KVCacheSpec:
        dtype = kv_cache_torch_dtype(self.kv_cache_dtype, self.dtype)
        return self.attn_backend.kv_cache_spec(self.model.attention_spec, self.block_size, dtype)

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block: its page in each KV tensor (one per layer of a KV cache group,
        lab/cache/groups.py; this rank's share of the heads), and in the proposer's own (a
        draft model's KV lives in the target's blocks: lab/speculative/model_proposer.py)."""
        own = (self.proposer.kv_page_bytes(self.block_size, self.kv_spec.dtype)
               if self.proposer is not None else 0)
        return self.kv_spec.page_bytes * num_tensors(self.kv_groups) + own

    def determine_num_blocks(self, sizing: CacheSizing) -> int:
        if sizing.num_gpu_blocks is not None:
            return sizing.num_gpu_blocks
        budget = ""
        if self.memory is not None:
            profile = profile_memory(
                self.memory, lambda: self._dummy_forward(self.max_num_batched_tokens),
                graphs=self._graph_memory())
            available = profile.kv_cache_bytes(sizing.gpu_memory_utilization)
            budget = f" = {profile.describe(sizing.gpu_memory_utilization)}"
            log.info("KV cache budget: %.2f GiB%s", available / 2**30, budget)
        else:
            available = cpu_kv_bytes(sizing, self.hf_config, self.block_size,
                                     self.bytes_per_block)
        num_blocks = available // self.bytes_per_block
        if num_blocks < 2:
            fix = ("lower max_num_batched_tokens or raise gpu_memory_utilization"
                   if self.memory is not None else "raise cpu_kv_cache_gb")
            raise RuntimeError(
                f"no memory left for the KV cache ({available / 2**30:.4f} GiB available"
                f"{budget}; {self.bytes_per_block} bytes per block, 2 blocks at least); {fix}"
            )
        return int(num_blocks)

    def _graph_memory(self) -> int:
        """Bytes the decode CUDA graphs take: captured once in a throw-away runner (a 2-block
        cache, the model's longest context) and released; 0 when none are captured."""
        if not self.cudagraph_sizes:
            return 0
        before = self.memory.used()
        runner = self._make_runner(2, max_positions(self.hf_config), self.max_num_batched_tokens)
        graph_bytes = self.memory.used() - before if runner.capture_graphs() else 0
        del runner
        gc.collect()
        log.info("CUDA graphs of decode sizes %s: %.2f GiB", list(self.cudagraph_sizes),
                 graph_bytes / 2**30)
        return max(graph_bytes, 0)

    def _dummy_forward(self, num_tokens: int) -> None:
        num_blocks = -(-num_tokens // self.block_size) + 1
        runner = self._make_runner(num_blocks, max_model_len=num_tokens + 1,
                                   max_num_tokens=num_tokens)
        blocks = list(range(1, num_blocks))
        req = NewRequestData("profile", [0] * num_tokens, SamplingParams(temperature=0),
                             tuple(blocks for _ in self.kv_groups), 0)
        runner.execute_model(SchedulerOutput(
            scheduled_new_reqs=[req], num_scheduled_tokens={"profile": num_tokens},
            total_num_scheduled_tokens=num_tokens))

    def _make_runner(self, num_blocks: int, max_model_len: int,
                     max_num_tokens: int | None = None,
                     proposer: Proposer | None = None) -> ModelRunner:
        runner = ModelRunner(self.model, self.attn_backend, self.device, self.block_size,
                             self.max_num_seqs, max_model_len, self._logits_processors(),
                             tp=self.state.tp,
                             max_num_tokens=max_num_tokens or self.max_num_batched_tokens,
                             cudagraph_sizes=self.cudagraph_sizes, ubatch=self.config.knobs,
                             ops=self.ops,
                             layer_groups=layer_group_index(self.kv_groups)
                             if len(self.kv_groups) > 1 else None, proposer=proposer)
        runner.initialize_cache(self._allocate_cache(num_blocks), num_blocks=num_blocks)
        return runner

    def _allocate_cache(self, num_blocks: int) -> KVCache:
        """The KV tensors of the groups' shared layout (lab/cache/groups.py), as the model reads
        them: layer i's is the tensor of its position in its group."""
        cache = self.attn_backend.allocate_kv_cache(self.kv_spec, num_blocks,
                                                    num_tensors(self.kv_groups), self.device)
        cache.layers = [cache.layers[j] for j in layer_tensor_index(self.kv_groups)]
        return cache

    def _logits_processors(self) -> list:
        """One instance of each configured processor, for one runner."""
        context = LogitsProcessorContext(
            vocab_size=self.hf_config.vocab_size, max_num_reqs=self.max_num_seqs,
            device=self.device, eos_token_ids=tuple(eos_token_ids(self.hf_config)))
        return [instantiate(option)(context=context) for option in self.config.logits_processors]

    def initialize_cache(
        self, num_blocks: int, max_model_len: int, num_swap_blocks: int = 0
    ) -> None:
        """Allocate the device KV cache, and a CPU swap space of `num_swap_blocks` blocks."""
        self.runner = self._make_runner(num_blocks, max_model_len, proposer=self.proposer)
        if self.compiled is not None:
            self._warm_up_compiled()
        if self.runner.capture_graphs():
            log.info("captured the decode CUDA graphs of sizes %s",
                     sorted(self.runner.padded.graphs))
        if num_swap_blocks > 0:
            tensors = list({id(t): t for t in self.runner.kv_caches}.values())  # each once
            self.runner.swapper = BlockSwapper(tensors, self.kv_spec, num_swap_blocks,
                                               self.ops.copy_blocks)
            own = self.proposer.kv_cache() if self.proposer is not None else None
            if own is not None:  # a draft's KV in the same blocks moves with them
                self.runner.swapper.add_caches(*own)

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(sched)

    def _warm_up_compiled(self) -> None:
        """compile=true: the warm-up steps (compile_sizes) before serving, so no request pays
        for the compile (the first one compiles the graph every later step reuses)."""
        start = time.perf_counter()
        sizes = warmup_sizes(self.config.knobs.compile_sizes, self.max_num_seqs,
                             self.max_num_batched_tokens, [g.min_tokens for g in self.compiled.graphs])
        for num_tokens in sizes:
            self._dummy_forward(num_tokens)
        log.info("compiled and warmed up (%s tokens) in %.1f s",
                 ", ".join(map(str, sizes)), time.perf_counter() - start)


def check_proposer_groups(proposer: type[Proposer], groups: tuple[KVCacheGroup, ...],
                          model: str) -> None:
    """A proposer that keeps its KV in the target's blocks (`needs_lookahead`) pages it by KV
    cache group 0, which must keep every block of a request: refuse a sliding-window group 0
    (every layer of the target has a window), naming its layers."""
    if not proposer.needs_lookahead or groups[0].spec.kind != SLIDING_WINDOW:
        return
    layers = sorted(i for g in groups if g.spec.kind == SLIDING_WINDOW for i in g.layers)
    raise ValueError(
        f"speculative={proposer.name} keeps its KV in the blocks of the target's KV cache group "
        f"0, which must be full attention; every layer of {model} has a sliding "
        f"window (layers {', '.join(map(str, layers))}: {groups[0].spec.describe()}), whose "
        "blocks leave the cache: set cache.hybrid=false (one full-attention group)")
