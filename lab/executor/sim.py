"""`executor=sim`: the project's answer to Vidur — the same scheduler, cache manager, policies and
statistics, driven by a step-time model instead of a GPU.

No weights are loaded: the model is its config.json (a tiny embedded model, any checkpoint, or a
config-only directory such as those `python -m lab.sim.configs` writes). The executor

- describes the model from its config (lab/sim/model_shape.py): its KV cache groups as the
  worker forms them (lab/cache/groups.py: its layers' sliding windows on one rank, grouped
  under cache.hybrid), KV bytes per block in the run's KV dtype as the worker lays them out
  (a page of block_size tokens in each of the groups' `num_tensors` KV tensors), weight bytes
  (quantized linears at 1 or 0.5 bytes), the tokenizer when the directory has one;
- plans the cache as the simulated device would: `num_gpu_blocks` when set; on `sim.device=cpu`
  the real CPU worker's rule (lab.worker.worker.cpu_kv_bytes); on a GPU memory x
  gpu_memory_utilization - weights - an activation estimate;
- executes a step by returning a token for every request whose prompt is caught up (a
  deterministic function of the request id and its length that is never the EOS nor one of the
  request's stop tokens, so outputs end by max_tokens) and advancing its virtual clock by the
  step-time model's prediction plus the swap copies at the device's host-link bandwidth;
- with a `speculative` option of k drafts, proposes k placeholder drafts per request that
  emitted (the same token rule at the next positions), accepts a verification's drafts at the
  `sim.spec` knobs' rate (seeded by `seed`) and returns the accepted ones + 1 token, and prices
  the proposer's forwards (lab/sim/spec.py).

With `tensor_parallel_size` > 1 it simulates one rank of the split model, as the real
executors report rank 0's (lab/executor/distributed.py): KV bytes per block, weight bytes and
the cache plan are one rank's (ModelShape.from_hf_config(cfg, tp, expert_parallel)), the
step-time model predicts one rank's compute, and each step adds its collectives
(SimTarget.comm_seconds, lab/sim/comm.py): the device's ring all-reduce, or a measured table
(`sim.allreduce=PATH`, written by `python -m lab.sim.comm`).

    python run.py executor=sim                                  # tiny_llama on a simulated H100
    python run.py executor=sim model=hf model.path=DIR sim.device=h200 sim/step_time=roofline
    python run.py executor=sim model=hf model.path=DIR tensor_parallel_size=4
    python run.py executor=sim speculative=ngram sim.spec.acceptance_rate=0.8
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from lab.cache.groups import (
    KVCacheGroup,
    describe_groups,
    group_layers,
    max_blocks_per_request,
    num_tensors,
)
from lab.cache.sizing import CacheSizing, cpu_kv_bytes
from lab.clock import VirtualClock
from lab.config.dtypes import DTYPE_BYTES, resolve_dtype_name
from lab.config.knob import build
from lab.config.worker import WorkerConfig
from lab.core.model_info import ModelInfo, eos_token_ids
from lab.core.step import ModelRunnerOutput, SchedulerOutput
from lab.executor.base import Executor
from lab.models.registry import arch_spec
from lab.sim.comm import AllReduceModel, MeasuredAllReduce
from lab.sim.device import DeviceSpec, device_spec
from lab.sim.knobs import SimSpecKnobs
from lab.sim.model_shape import QUANT_WEIGHT_BYTES, ModelShape
from lab.sim.spec import SimSpeculation, draft_shape
from lab.sim.step_time import SimTarget, StepTimeModel
from lab.speculative.base import SpecConfig

log = logging.getLogger(__name__)


@dataclass
class _SimState:
    num_tokens: int
    num_computed: int
    forbidden: frozenset[int]  # token ids the rule must not produce (EOS, stop tokens)
    end: int  # the length at which it finishes: prompt + max_tokens (outputs never stop early)
    speculates: bool = True  # it may get drafts (no configured logits processor acts on it)


class SimExecutor(Executor):
    """Executes SchedulerOutputs without a model, on a virtual clock."""

    runs_kernels = False
    supports_tensor_parallel = True  # simulated: one rank's share plus the collectives

    def __init__(
        self, config: WorkerConfig, step_time: StepTimeModel, device: str | DeviceSpec = "h100",
        allreduce: str | AllReduceModel | None = None, spec: Mapping | None = None,
    ) -> None:
        """`allreduce`: the all-reduce between the ranks at tensor_parallel_size > 1: None for
        the device's ring model, a model, or the path of a measured table's JSON. `spec`: the
        `sim.spec` knobs (speculative decoding, lab/sim/spec.py; their defaults when None)."""
        from transformers import AutoConfig  # imported late: the bench imports this module

        self.config = config
        self.device = device_spec(device)
        self.hf_config = AutoConfig.from_pretrained(config.model_path)
        if isinstance(allreduce, str | Path):
            allreduce = MeasuredAllReduce.load(allreduce)
        self.target = sim_target(self.hf_config, self.device, config, allreduce)
        self.step_time = step_time.bind(self.target)
        self.clock = VirtualClock()
        self.kv_groups = kv_cache_groups(self.hf_config, config)
        self.bytes_per_block = (self.target.kv_bytes_per_token_per_layer * config.knobs.block_size
                                * num_tensors(self.kv_groups))
        self.num_blocks = 0
        self.max_model_len = 0
        self._last_step_end: float | None = None  # the first step comes after idle
        self.states: dict[str, _SimState] = {}
        self.eos_ids = frozenset(eos_token_ids(self.hf_config))
        self.speculation = sim_speculation(config, build(SimSpecKnobs, dict(spec or {})))
        # the configured logits processors' classes: a request one acts on gets no drafts
        self.processors = processor_classes(config) if self.speculation is not None else ()
        tp = self.target.tensor_parallel_size
        log.info("simulating %s on %s (%s)%s: %.2f GiB of weights, %d KV bytes per token%s",
                 Path(config.model_path).name, self.device.name, self.step_time.describe(),
                 f" x {tp} ranks ({self.target.allreduce!r})" if tp > 1 else "",
                 self.target.weight_bytes / 2**30, self.target.kv_bytes_per_token,
                 " per rank" if tp > 1 else "")
        if len(self.kv_groups) > 1 or self.kv_groups[0].spec.sliding_window is not None:
            log.info("KV cache: %s", describe_groups(self.kv_groups))

    def timing(self) -> str:
        tp = self.target.tensor_parallel_size
        ranks = f" x {tp} ranks" if tp > 1 else ""
        return f"simulated {self.device.name}{ranks}: {self.step_time.describe()}"

    def model_info(self) -> ModelInfo:
        path = Path(self.config.model_path)  # a config-only directory has no tokenizer
        return ModelInfo.of(self.hf_config, self.bytes_per_block, self.target.weight_bytes,
                            path if (path / "tokenizer.json").is_file() else None,
                            kv_groups=self.kv_groups)

    # -- the cache --------------------------------------------------------------------------
    def determine_num_blocks(self, sizing: CacheSizing) -> int:
        if sizing.num_gpu_blocks is not None:
            return sizing.num_gpu_blocks
        if self.device.is_cpu:
            available = cpu_kv_bytes(sizing, self.hf_config, self.config.knobs.block_size,
                                     self.bytes_per_block)
        else:
            available = gpu_kv_bytes(self.target, sizing.gpu_memory_utilization,
                                     self.config.knobs.max_num_batched_tokens, self.config.knobs.max_num_seqs)
        num_blocks = available // self.bytes_per_block
        if num_blocks < 2:
            raise RuntimeError(
                f"no memory left for the KV cache on the simulated {self.device.name} "
                f"({available / 2**30:.4f} GiB available, {self.bytes_per_block} bytes per "
                "block, 2 blocks at least): a larger sim.device, a smaller model, quant, or "
                "num_gpu_blocks")
        cap = self._max_useful_blocks()
        if num_blocks > cap:
            log.info("KV cache: %d blocks fit; simulating %d (max_num_seqs x the model's "
                     "context)", num_blocks, cap)
        return int(min(num_blocks, cap))

    def _max_useful_blocks(self) -> int:
        """max_num_seqs requests of the model's full context, each holding its blocks in every
        KV cache group (a sliding-window group only its window's), + the null block: a
        simulated tiny model on a large GPU would get millions of blocks that no step can use
        (they could only hold more prefix cache), and building their pool takes most of the
        run."""
        from lab.core.model_info import model_context_limit

        knobs = self.config.knobs
        per_request = max_blocks_per_request(self.kv_groups, model_context_limit(self.hf_config),
                                             knobs.block_size, knobs.max_num_batched_tokens)
        return knobs.max_num_seqs * per_request + 1

    def initialize_cache(
        self, num_blocks: int, max_model_len: int, num_swap_blocks: int = 0
    ) -> None:
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len

    # -- steps ------------------------------------------------------------------------------
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(sched)
        out = ModelRunnerOutput()
        finishing = 0
        for rid, n in sched.num_scheduled_tokens.items():
            state = self.states[rid]
            state.num_computed += n
            if state.num_computed >= state.num_tokens:
                out.sampled_token_ids[rid] = self._emit(rid, state,
                                                        sched.scheduled_spec_decode_tokens)
                finishing += state.num_tokens >= self._end(state)
        drafting = self._propose(out)
        idle = self.clock.now() != self._last_step_end  # it slept until an arrival
        self.clock.advance(self.step_seconds(sched, finishing, idle) + self.draft_seconds(drafting))
        self._last_step_end = self.clock.now()
        return out

    def _end(self, state: _SimState) -> int:
        """The length at which a request finishes: prompt + max_tokens, or the context limit."""
        return min(state.end, self.max_model_len or state.end)

    def _emit(self, rid: str, state: _SimState, drafts: dict[str, list[int]]) -> list[int]:
        """The tokens a request whose prompt is caught up emits: one, or after verifying its
        s drafts the accepted a of them + 1 (the rejected s - a computed tokens step back)."""
        num_drafts = len(drafts.get(rid, ()))
        accepted = self.speculation.acceptance.draw(num_drafts) if num_drafts else 0
        tokens = [self._token(rid, state, state.num_tokens + i) for i in range(accepted + 1)]
        state.num_tokens += len(tokens)
        state.num_computed -= num_drafts - accepted
        return tokens

    def _propose(self, out: ModelRunnerOutput) -> list[tuple[int, int]]:
        """Drafts for the next step of every request that emitted (none for those a logits
        processor acts on, or whose context or max_tokens is reached): the token rule at the
        positions after its last token. (length, drafts) of each request that got drafts."""
        if self.speculation is None:
            return []
        drafting = []
        for rid in out.sampled_token_ids:
            state = self.states[rid]
            n = self.speculation.num_drafts(state.num_tokens, state.end, self.max_model_len)
            if n and state.speculates:
                out.spec_token_ids[rid] = [self._token(rid, state, state.num_tokens + i)
                                           for i in range(n)]
                drafting.append((state.num_tokens, n))
        return drafting

    def draft_seconds(self, drafting: list[tuple[int, int]]) -> float:
        """The proposer's forwards for the requests that got drafts ((length, drafts) each):
        sim.spec.draft_cost_ratio x a target decode step over them, once per draft position
        (the most drafts any of them got); 0 for ngram."""
        spec = self.speculation
        if not drafting or spec is None or spec.draft_cost_ratio == 0:
            return 0.0
        shape = draft_shape([length for length, _ in drafting])
        comm = 0.0 if self.step_time.includes_comm else self.target.comm_seconds(shape)
        forwards = max(n for _, n in drafting)
        return spec.draft_cost_ratio * forwards * (self.step_time.predict(shape) + comm)

    def step_seconds(self, sched: SchedulerOutput, finishing: int = 0,
                     after_idle: bool = False) -> float:
        """The step's predicted time (`finishing`: requests its tokens finish, whose outputs and
        frees the engine's CPU pays for; `after_idle`: the engine waited for an arrival before
        it), its tensor-parallel collectives (0 at TP=1) and its swap copies over the host link
        (each rank copies its own blocks over its own link)."""
        shape = sched.shape
        if finishing or after_idle:
            shape = replace(shape, num_finished_reqs=finishing, after_idle=after_idle)
        swapped = (shape.swap_in_blocks + shape.swap_out_blocks) * self.bytes_per_block
        comm = 0.0 if self.step_time.includes_comm else self.target.comm_seconds(shape)
        return (self.step_time.predict(shape) + comm
                + swapped / self.device.host_link_bandwidth)

    def _update_states(self, sched: SchedulerOutput) -> None:
        for rid in sched.finished_req_ids:
            self.states.pop(rid, None)
        for new in sched.scheduled_new_reqs:
            forbidden = self.eos_ids | frozenset(new.sampling_params.stop_token_ids)
            max_tokens = new.sampling_params.max_tokens
            length = len(new.prompt_token_ids)
            self.states[new.req_id] = _SimState(
                length, new.num_computed_tokens, forbidden,
                length + max_tokens if max_tokens is not None else 1 << 62,
                self.speculation is not None and self._speculates(new.sampling_params))
        for cached in sched.scheduled_cached_reqs:
            self.states[cached.req_id].num_computed = cached.num_computed_tokens

    def _speculates(self, params) -> bool:
        """Whether a request may get drafts: no configured logits processor acts on it (the
        real runner's rule, LogitsProcessor.speculates)."""
        return all(cls.speculates(params) for cls in self.processors)

    def _token(self, rid: str, state: _SimState, length: int) -> int:
        """A token id from (request id, length) that is none of the request's stop tokens: the
        token at position `length` (a draft for a later position is the one it would emit)."""
        vocab = self.hf_config.vocab_size
        salt = 0
        while True:
            token = zlib.crc32(f"{rid}:{length}:{salt}".encode()) % vocab
            if token not in state.forbidden:
                return token
            salt += 1


def sim_speculation(config: WorkerConfig, knobs: SimSpecKnobs) -> SimSpeculation | None:
    """The run's speculation under the simulator (None: the speculative option is off), seeded
    by the run's seed. A model-based proposer simulated at draft_cost_ratio 0 is logged: its
    forwards are then free."""
    spec = SpecConfig.of(config.speculative)
    speculation = SimSpeculation.of(spec.num_speculative_tokens, knobs, config.knobs.seed)
    if speculation is not None and spec.num_lookahead_tokens and not knobs.draft_cost_ratio:
        log.warning("speculative=%s runs a draft model, priced at nothing: set "
                    "sim.spec.draft_cost_ratio (its forward / the target's decode step)",
                    spec.name)
    return speculation


def processor_classes(config: WorkerConfig) -> tuple[type, ...]:
    """The classes of the run's logits processors (the frontend has imported them already)."""
    from hydra.utils import get_class

    return tuple(get_class(p["_target_"]) for p in config.logits_processors)


def sim_target(hf_config, device: DeviceSpec, config: WorkerConfig,
               allreduce: AllReduceModel | None = None) -> SimTarget:
    """The model's shape and byte widths as the run would have them on `device`: dtype auto is
    fp32 on the cpu and the checkpoint's dtype on a GPU; cache.dtype fp8 stores 1-byte KV;
    quant fp8/int8 (or an fp8 checkpoint) store 1-byte linear weights, w4a16 half a byte. With
    tensor_parallel_size > 1, one rank's shape (expert_parallel: whole experts per rank)."""
    dtype = resolve_dtype_name(config.knobs.dtype, hf_config, "cpu" if device.is_cpu else "cuda")
    dtype_bytes = DTYPE_BYTES[dtype]
    kv_bytes = 1 if config.kv_cache_dtype == "fp8" else dtype_bytes
    shape = ModelShape.from_hf_config(hf_config, config.knobs.tensor_parallel_size,
                                      config.knobs.expert_parallel)
    return SimTarget(shape, device, dtype_bytes,
                     linear_weight_bytes(hf_config, config.quant, dtype_bytes), kv_bytes,
                     allreduce)


def kv_cache_groups(hf_config, config: WorkerConfig) -> tuple[KVCacheGroup, ...]:
    """The model's KV cache groups as the worker forms them (lab/worker/worker.py): its
    layers' AttentionSpecs on one of tensor_parallel_size ranks, from the config alone,
    grouped with cache.hybrid (lab/cache/groups.py)."""
    specs = arch_spec(hf_config).layer_attention_specs(hf_config,
                                                       config.knobs.tensor_parallel_size)
    return group_layers(specs, config.kv_hybrid)


def linear_weight_bytes(hf_config, quant: dict | None, dtype_bytes: float) -> float:
    """Bytes per linear weight: the `quant` option's (by its class, QUANT_WEIGHT_BYTES), else the
    checkpoint's own quantization_config (an fp8 checkpoint), else the model dtype's."""
    target = (quant or {}).get("_target_", "")
    if target.rsplit(".", 1)[-1] in QUANT_WEIGHT_BYTES:
        return QUANT_WEIGHT_BYTES[target.rsplit(".", 1)[-1]]
    checkpoint = getattr(hf_config, "quantization_config", None) or {}
    if not isinstance(checkpoint, dict):
        checkpoint = checkpoint.to_dict()
    return QUANT_WEIGHT_BYTES.get(checkpoint.get("quant_method", "none"), dtype_bytes)


def gpu_kv_bytes(target: SimTarget, utilization: float, max_tokens: int, max_seqs: int) -> int:
    """What a GPU worker would leave for the KV cache: memory x utilization - weights - the
    activations of a max-size step (the worker's profile run measures these: lab/worker/memory.py);
    with tensor parallelism, one rank's GPU and share."""
    activations = target.model.activation_bytes(max_tokens, max_seqs, target.dtype_bytes)
    return int(target.device.memory_bytes * utilization - target.weight_bytes - activations)
