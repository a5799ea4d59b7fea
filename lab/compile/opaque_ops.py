"""Attention (and MoE) as opaque custom ops, so `torch.compile` traces the model but not them.

The compiled graph sees one `torch.ops.lab.attention` (or `lab.mla_attention`) call per layer:
a black box with a declared output shape (its fake implementation). What happens inside — the
backend's KV write, its paged gather or Triton kernels, the per-step metadata with its host
lists — runs eagerly, exactly as without compilation. So the graph depends on tensor shapes only
(the token count, marked dynamic), never on the step's requests, and is compiled once.

What the op needs besides its tensor arguments — the backend, the step's metadata and the
layers' KV caches — comes from the `StepContext` of the running step, which `step_context`
scopes around the compiled forward (per thread; outside a step the op refuses to run, and
`reset_step_context` clears one a failed test left behind):

    with step_context(StepContext(backend, metadata, kv_caches, mla_layers)):
        hidden = compiled_forward(input_ids, positions)      # layer i calls
            torch.ops.lab.attention(q, k, v, i, scale, ...)  #   -> backend.forward(i, q, k, v,
                                                             #        kv_caches[i], metadata, scale)

The KV cache is not an argument of the op: the op writes it as a side effect the graph does not
see (as vLLM's unified attention does), so functionalization never copies a cache. Ordering is
safe: layer i+1's op consumes what layer i's op returned.

`OpaqueAttention` is the backend a compiled model's attention layers hold instead of the real
one (lab/compile/compiler.py swaps it in): its `forward` / `forward_mla` have the backend's
signature and call the ops, ignoring the kv_cache and metadata they are handed.

LayerOps entries that cannot be traced run as opaque ops too (`OpaqueLayerOp`, each naming its
implementation by `module:function`): `lab::fused_moe` (the torch reference loops over the
experts a step routes tokens to, a data-dependent loop) and `lab::scaled_gemm` (int8 / fp8
GEMMs: integer and fp64 products that inductor's freezing mis-handles).
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from lab.attention.base import AttentionBackend, layer_metadata
from lab.layers.ops import LazyImpl


@dataclass
class StepContext:
    """What the attention ops of one step read besides their tensors."""

    backend: AttentionBackend
    metadata: object  # backend.build_metadata(...) of this step
    kv_caches: Sequence[torch.Tensor]  # one per layer
    # MLA models: layer index -> its attention module (`mla_weights()` gives the MLAWeights)
    mla_layers: Mapping[int, torch.nn.Module] = field(default_factory=dict)


class _Running(threading.local):
    """The step context of the forward running in this thread (engines in other threads, e.g.
    an async engine's core thread, have their own)."""

    ctx: StepContext | None = None


_RUNNING = _Running()


@contextmanager
def step_context(ctx: StepContext) -> Iterator[StepContext]:
    """Scope `ctx` to one forward; nested steps are refused (one model step at a time)."""
    if _RUNNING.ctx is not None:
        raise RuntimeError("a compiled forward is already running (nested step_context)")
    _RUNNING.ctx = ctx
    try:
        yield ctx
    finally:
        _RUNNING.ctx = None


def reset_step_context() -> None:
    """Forget a step context left behind in this thread (tests)."""
    _RUNNING.ctx = None


def current_step() -> StepContext:
    if _RUNNING.ctx is None:
        raise RuntimeError("a lab attention op was called outside a step: run the compiled "
                           "model through its forward (lab/compile), which sets the context")
    return _RUNNING.ctx


@torch.library.custom_op("lab::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int,
              scale: float, sliding_window: int | None, sinks: torch.Tensor | None,
              softcap: float | None) -> torch.Tensor:
    """The step's backend.forward for layer `layer_idx` (writes its KV cache) -> [T, H, D];
    the layer's attention features as the backend takes them (only those it uses; None: the
    layer has none). No argument has a default: inductor's C++ wrapper (cpp_wrapper, on the
    CPU) passes the dispatcher only the arguments a graph's call gave, and a schema default it
    left out was read past the end of that list (a segfault: bench_qwen3_06b fp32)."""
    ctx = current_step()
    features = {name: value for name, value in (("sliding_window", sliding_window),
                                                ("sinks", sinks), ("softcap", softcap))
                if value is not None}
    return ctx.backend.forward(layer_idx, q, k, v, ctx.kv_caches[layer_idx],
                               layer_metadata(ctx.metadata, layer_idx), scale, **features)


@attention.register_fake
def _attention_fake(q, k, v, layer_idx, scale, sliding_window, sinks, softcap):
    return torch.empty_like(q)


@torch.library.custom_op("lab::mla_attention", mutates_args=())
def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor,
                  k_pe: torch.Tensor, layer_idx: int, v_head_dim: int,
                  scale: float) -> torch.Tensor:
    """The step's backend.forward_mla for layer `layer_idx` (writes its latent cache)
    -> [T, H, v_head_dim]."""
    ctx = current_step()
    mla = ctx.mla_layers[layer_idx].mla_weights()
    return ctx.backend.forward_mla(layer_idx, q_nope, q_pe, kv_c, k_pe,
                                   ctx.kv_caches[layer_idx],
                                   layer_metadata(ctx.metadata, layer_idx), mla, scale)


@mla_attention.register_fake
def _mla_attention_fake(q_nope, q_pe, kv_c, k_pe, layer_idx, v_head_dim, scale):
    return q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], v_head_dim)


class OpaqueAttention:
    """Stands in for the AttentionBackend inside a compiled model: same call signature, routes
    every call through the custom ops (the real backend is the step context's)."""

    def __init__(self, backend: AttentionBackend) -> None:
        self.backend = backend
        self.name = f"opaque({backend.name})"

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale, *, sliding_window=None,
                sinks=None, softcap=None):
        return torch.ops.lab.attention(q, k, v, layer_idx, scale, sliding_window, sinks, softcap)

    def forward_mla(self, layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, mla, scale):
        return torch.ops.lab.mla_attention(q_nope, q_pe, kv_c, k_pe, layer_idx,
                                           mla.v_head_dim, scale)


@torch.library.custom_op("lab::fused_moe", mutates_args=())
def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, w13_scale: torch.Tensor | None,
              w2_scale: torch.Tensor | None, impl: str) -> torch.Tensor:
    """The `kernels` group's fused_moe (`impl`: its `module:function`, see LayerOps) as one
    opaque op: its torch reference loops over the experts a step routes to (data-dependent)."""
    return _resolve(impl)(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)


@fused_moe.register_fake
def _fused_moe_fake(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, impl):
    return torch.empty_like(x)


@functools.cache
def _resolve(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@torch.library.custom_op("lab::scaled_gemm", mutates_args=())
def scaled_gemm(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                w_scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype,
                impl: str) -> torch.Tensor:
    """A quantized GEMM of the `kernels` group (int8_gemm, fp8_gemm: `impl`) as one opaque op:
    (a_q [M, K] * a_scale) @ (w_q [N, K] * w_scale)^T + bias -> [M, N]. Traced, the int8
    reference's int64 product made inductor's freezing pack an int64 weight for oneDNN (an
    error); both stay opaque, whatever kernel implements them."""
    return _resolve(impl)(a_q, a_scale, w_q, w_scale, bias, out_dtype)


@scaled_gemm.register_fake
def _scaled_gemm_fake(a_q, a_scale, w_q, w_scale, bias, out_dtype, impl):
    return a_q.new_empty(*a_q.shape[:-1], w_q.shape[0], dtype=out_dtype)


class OpaqueLayerOp:
    """Stands in for one LayerOps entry in a compiled model: the same call (trailing optional
    arguments default to None), through a custom op that takes the implementation's
    `module:function` last. Eager callers get the same result, through the op."""

    def __init__(self, op, impl: LazyImpl, arity: int) -> None:
        self.op, self.impl, self.arity = op, impl, arity

    def __call__(self, *args):
        return self.op(*args, *([None] * (self.arity - len(args))), self.impl.path)
