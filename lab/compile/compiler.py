"""`compile=true`: the model's forward through `torch.compile`, attention left opaque.

    compiled = compile_model(model, backend, CompileOptions.for_device(device))  # after loading
    hidden = model(input_ids, positions, kv_caches, metadata)   # the same call as eager

`compile_model` points every attention layer at an `OpaqueAttention` (the custom ops of
lab.compile.opaque_ops.py) and replaces the model's `forward` by a `CompiledForward`, which
scopes the step's backend, metadata and KV caches around one call of the compiled function

    (input_ids [T], positions [T]) -> hidden [T, hidden]          T: one symbolic size

The token count T is marked *unbacked* dynamic (no 0/1 specialisation), so the first call
compiles one graph that serves every later step, decode, prefill or mixed, T = 1 included.
Since nothing else can change between steps, dynamo's guards are skipped (their check cost
time every step: docs/compile.md), and each CompiledForward keeps its graph apart from any other
compiled model's (`isolate_recompiles`; on a torch without it, torch 2.11 on the GPU image,
each instance compiles a copy of the traced function with a code object of its own, where
dynamo keeps its cache), so two engines in one process never share one.

Linear layers trace as F.linear (lab/layers/linear.py): on CPU inductor's freezing packs their
weights for oneDNN itself and fuses the pointwise op after each GEMM (SiLU, residual add).
"""

from __future__ import annotations

import inspect
import logging
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.torch_version import TorchVersion

from lab.attention.base import AttentionBackend
from lab.compile.opaque_ops import OpaqueAttention, OpaqueLayerOp, StepContext, step_context
from lab.layers.ops import OPS, LayerOps, LazyImpl

log = logging.getLogger(__name__)

# what vLLM-CPU patches too: no per-call size / NaN asserts, GEMM epilogues fused
COMMON_INDUCTOR_OPTIONS: dict[str, Any] = {
    "size_asserts": False,
    "nan_asserts": False,
    "epilogue_fusion": True,
}
# CPU (each measured on bench_llama's decode forward: docs/compile.md): freezing turns the
# weights into constants, packed for oneDNN and fused with their epilogues (without it, fp32
# GEMMs go to MKL sgemm on unpacked weights, slower); cpp_wrapper calls the kernels from C++
# instead of a Python wrapper; cpp.min_chunk_size at ATen's grain size keeps a fused kernel on
# one thread where eager's op would be (an OpenMP region per small decode kernel costs a thread
# wake-up at 2 threads). max_autotune buys little for minutes of autotuning.
CPU_INDUCTOR_OPTIONS: dict[str, Any] = {**COMMON_INDUCTOR_OPTIONS, "freezing": True,
                                        "cpp_wrapper": True, "cpp.min_chunk_size": 32768}


@dataclass
class CompileOptions:
    """How the forward is compiled: the torch.compile backend ("inductor"; "eager" or
    "aot_eager" trace without generating code: cheap, for tests), inductor's config patches,
    and the size hint of the symbolic token count (None: the first call's size)."""

    backend: str = "inductor"
    inductor: dict[str, Any] = field(default_factory=lambda: dict(COMMON_INDUCTOR_OPTIONS))
    size_hint: int | None = None
    # steps of at least `large_steps_from` tokens run a second graph, compiled with
    # `large_size_hint` (None: one graph for every step)
    large_steps_from: int | None = None
    large_size_hint: int | None = None

    @classmethod
    def for_device(cls, device: torch.device | str, max_num_batched_tokens: int | None = None,
                   **kwargs: Any) -> CompileOptions:
        """The options for a model on `device`. CPU: with freezing, on a torch whose oneDNN
        weight packing takes the unbacked token count (2.13, not 2.11, where freezing stays off
        and the linears run as MKL GEMMs); and where the step's token budget
        (`max_num_batched_tokens`) exceeds LARGE_STEP_TOKENS, a second graph for the steps
        above it (`large_steps_from`), compiled with the budget as its size hint."""
        cpu = torch.device(device).type == "cpu"
        inductor = dict(CPU_INDUCTOR_OPTIONS if cpu else COMMON_INDUCTOR_OPTIONS)
        if cpu and not freezing_takes_unbacked_sizes():
            log.warning("compile=true on torch %s: inductor's freezing is off on the CPU (its "
                        "oneDNN weight packing fails on the symbolic token count before 2.13)",
                        torch.__version__)
            inductor["freezing"] = False
        if cpu and max_num_batched_tokens is not None and max_num_batched_tokens > LARGE_STEP_TOKENS:
            kwargs.setdefault("large_steps_from", LARGE_STEP_TOKENS)
            kwargs.setdefault("large_size_hint", max_num_batched_tokens)
        return cls(inductor=inductor, **kwargs)


# CPU: inductor decides each fused kernel's threading once, at compile time, from the size hint
# (cpp.min_chunk_size above). A decode-sized hint keeps every elementwise kernel on one thread,
# as decode steps want (an OpenMP region per small kernel costs a thread wake-up each), but
# then a prefill's norms, rotary and SiLU over thousands of rows run on one thread too. So steps
# of at least this many tokens run a second graph with the budget as its hint (both effects
# measured: docs/compile.md, "Two graphs on the CPU").
LARGE_STEP_TOKENS = 256


def install_opaque_attention(model: nn.Module, backend: AttentionBackend) -> dict[int, nn.Module]:
    """Point every attention layer of `model` (a module holding the AttentionBackend as
    `backend`, and its `layer_idx`) at one OpaqueAttention; returns the MLA layers (those with
    `mla_weights`) by layer index."""
    opaque = OpaqueAttention(backend)
    layers = [m for m in model.modules()
              if isinstance(getattr(m, "backend", None), AttentionBackend)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layer holding the backend "
                         "as `backend`: compile=true cannot make its attention opaque")
    for module in layers:
        module.backend = opaque
    mla_layers = {m.layer_idx: m for m in layers if hasattr(m, "mla_weights")}
    for module in mla_layers.values():
        module.mla_weights()  # built now: the trace does not check them (see DeepseekAttention)
    return mla_layers


# LayerOps traced from their torch references whatever `kernels` says: inductor generates the
# fused kernels (C++ on CPU, Triton on CUDA), as vLLM turns its custom ops off under compile
TRACED_REFERENCES = ("rms_norm", "rotary", "silu_and_mul")


def prepare_layer_ops(ops: LayerOps) -> None:
    """Point the model's LayerOps at what the trace needs: the torch references of
    TRACED_REFERENCES, the untraceable ops through opaque ops (lab/compile/opaque_ops.py); and
    import every implementation now (dynamo cannot trace the lazy import of a first call)."""
    for op in OPS:
        if op.name in TRACED_REFERENCES and getattr(ops, op.name).path != op.reference:
            log.info("compile=true: %s traced from its torch reference (inductor fuses it)",
                     op.name)
            setattr(ops, op.name, LazyImpl(op, "torch"))
    ops.resolve_all()
    for name, (custom_op, arity) in opaque_layer_ops().items():
        impl = getattr(ops, name)
        if isinstance(impl, LazyImpl):
            setattr(ops, name, OpaqueLayerOp(custom_op, impl, arity))


def opaque_layer_ops() -> dict[str, tuple[Any, int]]:
    """The LayerOps entries a compiled model calls through opaque ops: name -> (op, arity)."""
    return {"fused_moe": (torch.ops.lab.fused_moe, 7),
            "int8_gemm": (torch.ops.lab.scaled_gemm, 6),
            "fp8_gemm": (torch.ops.lab.scaled_gemm, 6)}


def check_torch() -> None:
    """compile=true needs torch.compiler.skip_all_guards_unsafe and
    mark_unbacked(shape_id=, hint_override=) (torch 2.11 has them): RuntimeError naming the torch
    version when one is missing."""
    unbacked = inspect.signature(torch._dynamo.decorators.mark_unbacked).parameters
    have = (hasattr(torch.compiler, "skip_all_guards_unsafe")
            and "shape_id" in unbacked and "hint_override" in unbacked)
    if not have:
        raise RuntimeError(f"compile=true needs a newer torch than {torch.__version__} "
                           "(torch.compiler.skip_all_guards_unsafe, mark_unbacked(shape_id=); "
                           "built on 2.13, runs on 2.11); use compile=false")


def freezing_takes_unbacked_sizes() -> bool:
    """Whether inductor's CPU freezing (its oneDNN weight packing) accepts the unbacked token
    count: torch 2.13 does; 2.11 raises GuardOnDataDependentSymNode in pack_linear_weight. No
    feature to probe for, so the version decides."""
    return TorchVersion(torch.__version__) >= "2.13"


def can_isolate_recompiles() -> bool:
    """Whether torch.compile takes isolate_recompiles= (torch 2.13; not 2.11)."""
    return "isolate_recompiles" in inspect.signature(torch.compile).parameters


def own_code_copy(method, tag: str):
    """`method` (bound) as a function whose code object is new, named `tag`. Dynamo keeps its
    compiled entries on the code object and counts them against one recompile limit (8): on a
    code object shared by every CompiledForward, the ninth model compiled in a process would
    fail to compile. A copy per instance keeps each graph apart where torch.compile has no
    isolate_recompiles."""
    fn = method.__func__
    copy = types.FunctionType(fn.__code__.replace(co_name=tag), fn.__globals__, tag,
                              fn.__defaults__, fn.__closure__)
    return types.MethodType(copy, method.__self__)


@dataclass
class Graph:
    """One compiled graph of a CompiledForward: the steps of at least `min_tokens` tokens (up
    to the next graph's) run it; `size_hint` is its first call's hint (None: that call's size)."""

    min_tokens: int
    size_hint: int | None
    fn: Any  # torch.compile's wrapper: compiles on its first call
    compiled: bool = False


class CompiledForward:
    """The compiled model's forward, with the eager forward's signature
    `(input_ids, positions, kv_caches, attn_metadata) -> hidden`. One graph serves every step,
    or two where the options split the steps by size (`large_steps_from`: each graph is
    compiled, with its own size hint, on the first step of its sizes). `num_compiles` counts
    the graphs compiled (`num_graphs` once every graph has run: no step recompiles)."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, options: CompileOptions):
        check_torch()
        self.eager_forward = model.forward  # the class's forward, bound to the model
        self.backend = backend
        self.options = options
        self.mla_layers = install_opaque_attention(model, backend)
        prepare_layer_ops(model.ops)
        self.layer_slots = [None] * model.num_layers  # caches reach the ops through the context
        self.num_compiles = 0
        self.graphs = [Graph(1, options.size_hint, self._compiled(0))]
        if options.large_steps_from is not None:
            self.graphs.append(Graph(options.large_steps_from, options.large_size_hint,
                                     self._compiled(1)))

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    def _compiled(self, index: int):
        """A torch.compile of the traced forward whose compiled entries are its own."""
        isolate = can_isolate_recompiles()
        fn = self._graph if isolate else own_code_copy(self._graph, f"_graph_{id(self):x}_{index}")
        return torch.compile(
            fn, fullgraph=True, dynamic=False, backend=self._compile_graph,
            options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe},
            **({"isolate_recompiles": True} if isolate else {}))

    def _graph(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.eager_forward(input_ids, positions, self.layer_slots, None)

    def _compile_graph(self, gm: torch.fx.GraphModule, example_inputs):
        self.num_compiles += 1
        if self.options.backend != "inductor":
            return torch._dynamo.lookup_backend(self.options.backend)(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches, attn_metadata) -> torch.Tensor:
        large = input_ids.shape[0] >= self.graphs[-1].min_tokens
        graph = self.graphs[-1] if large else self.graphs[0]
        with step_context(StepContext(self.backend, attn_metadata, kv_caches, self.mla_layers)):
            if graph.compiled:
                return graph.fn(input_ids, positions)
            out = self._first_call(graph.fn, graph.size_hint, input_ids, positions)
            graph.compiled = True
            return out

    def _first_call(self, compiled, size_hint: int | None, input_ids: torch.Tensor,
                    positions: torch.Tensor) -> torch.Tensor:
        """Compile: T symbolic (one shared unbacked size) with `size_hint` as inductor's hint
        (None: this call's size), inductor's config patched while dynamo traces (it reads
        `freezing` there to make the parameters constants)."""
        hint = size_hint or input_ids.shape[0]
        for t in (input_ids, positions):
            torch._dynamo.decorators.mark_unbacked(t, 0, hint_override=hint, shape_id="tokens")
        with torch._inductor.config.patch(self.options.inductor):
            return compiled(input_ids, positions)


DEFAULT_WARMUP_TOKENS = 16  # a decode batch: inductor packs the GEMM weights for this size


def warmup_sizes(sizes: Sequence[int] | None, max_num_seqs: int, max_num_batched_tokens: int,
                 graph_starts: Sequence[int] = (1,)) -> tuple[int, ...]:
    """The token counts of the start-up warm-up steps (`compile_sizes`): the first step of each
    graph's sizes compiles it (`graph_starts`: the fewest tokens each graph of
    CompiledForward.graphs takes), the others run it once; None: one step of a decode-sized
    batch, min(16, max_num_seqs, max_num_batched_tokens). Sizes above max_num_batched_tokens
    (no step is larger) are dropped; a graph no size reaches gets a step of its first size."""
    kept = tuple(int(s) for s in sizes or () if 1 <= int(s) <= max_num_batched_tokens)
    kept = kept or (min(DEFAULT_WARMUP_TOKENS, max_num_seqs, max_num_batched_tokens),)
    ends = [*graph_starts[1:], max_num_batched_tokens + 1]
    missing = tuple(lo for lo, hi in zip(graph_starts, ends)
                    if lo <= max_num_batched_tokens and not any(lo <= s < hi for s in kept))
    return kept + missing


def compile_model(model: nn.Module, backend: AttentionBackend,
                  options: CompileOptions | None = None) -> CompiledForward:
    """Compile `model` in place: its forward becomes a CompiledForward (returned), which
    compiles on its first call. The model's attention runs through the custom ops from now on,
    so the eager forward is gone with it."""
    compiled = CompiledForward(model, backend, options or CompileOptions())
    model.forward = compiled
    return compiled
