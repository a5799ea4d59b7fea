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
~0.2 ms a step on a 2-core CPU), and each CompiledForward keeps its graph apart from any other
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
# CPU (bench_llama decode forward, batch 16, docs/compile.md): freezing turns the weights into
# constants, packed for oneDNN and fused with their epilogues (without it, fp32 GEMMs go to MKL
# sgemm on unpacked weights: 25% slower); cpp_wrapper calls the kernels from C++ instead of a
# Python wrapper (4-5% faster); cpp.min_chunk_size at ATen's grain size keeps a fused kernel
# on one thread where eager's op would be (an OpenMP region per small decode kernel cost 17%
# at 2 threads, OMP_WAIT_POLICY=PASSIVE). max_autotune buys ~1% for minutes of autotuning.
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

    @classmethod
    def for_device(cls, device: torch.device | str, **kwargs: Any) -> CompileOptions:
        """The options for a model on `device` (CPU: with freezing, on a torch whose oneDNN
        weight packing takes the unbacked token count: 2.13, not 2.11, where freezing stays off
        and the linears run as MKL GEMMs)."""
        cpu = torch.device(device).type == "cpu"
        inductor = dict(CPU_INDUCTOR_OPTIONS if cpu else COMMON_INDUCTOR_OPTIONS)
        if cpu and not freezing_takes_unbacked_sizes():
            log.warning("compile=true on torch %s: inductor's freezing is off on the CPU (its "
                        "oneDNN weight packing fails on the symbolic token count before 2.13)",
                        torch.__version__)
            inductor["freezing"] = False
        return cls(inductor=inductor, **kwargs)


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


class CompiledForward:
    """The compiled model's forward, with the eager forward's signature
    `(input_ids, positions, kv_caches, attn_metadata) -> hidden`. `num_compiles` counts the
    graphs it compiled (1 once it has run: no step recompiles)."""

    def __init__(self, model: nn.Module, backend: AttentionBackend, options: CompileOptions):
        check_torch()
        self.eager_forward = model.forward  # the class's forward, bound to the model
        self.backend = backend
        self.options = options
        self.mla_layers = install_opaque_attention(model, backend)
        prepare_layer_ops(model.ops)
        self.layer_slots = [None] * model.num_layers  # caches reach the ops through the context
        self.num_compiles = 0
        isolate = can_isolate_recompiles()
        self.compiled = torch.compile(
            self._graph if isolate else own_code_copy(self._graph, f"_graph_{id(self):x}"),
            fullgraph=True, dynamic=False, backend=self._compile_graph,
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
        with step_context(StepContext(self.backend, attn_metadata, kv_caches, self.mla_layers)):
            if self.num_compiles:
                return self.compiled(input_ids, positions)
            return self._first_call(input_ids, positions)

    def _first_call(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Compile: T symbolic (one shared unbacked size), inductor's config patched while
        dynamo traces (it reads `freezing` there to make the parameters constants)."""
        hint = self.options.size_hint or input_ids.shape[0]
        for t in (input_ids, positions):
            torch._dynamo.decorators.mark_unbacked(t, 0, hint_override=hint, shape_id="tokens")
        with torch._inductor.config.patch(self.options.inductor):
            return self.compiled(input_ids, positions)


DEFAULT_WARMUP_TOKENS = 16  # a decode batch: inductor packs the GEMM weights for this size


def warmup_sizes(sizes: Sequence[int] | None, max_num_seqs: int,
                 max_num_batched_tokens: int) -> tuple[int, ...]:
    """The token counts of the start-up warm-up steps (`compile_sizes`): the first compiles the
    graph (and is its size hint), the others run it once; None: one step of a decode-sized
    batch, min(16, max_num_seqs, max_num_batched_tokens). Sizes above max_num_batched_tokens
    (no step is larger) are dropped."""
    if sizes is None:
        return (min(DEFAULT_WARMUP_TOKENS, max_num_seqs, max_num_batched_tokens),)
    kept = tuple(int(s) for s in sizes if 1 <= int(s) <= max_num_batched_tokens)
    return kept or (min(DEFAULT_WARMUP_TOKENS, max_num_seqs, max_num_batched_tokens),)


def compile_model(model: nn.Module, backend: AttentionBackend,
                  options: CompileOptions | None = None) -> CompiledForward:
    """Compile `model` in place: its forward becomes a CompiledForward (returned), which
    compiles on its first call. The model's attention runs through the custom ops from now on,
    so the eager forward is gone with it."""
    compiled = CompiledForward(model, backend, options or CompileOptions())
    model.forward = compiled
    return compiled
