"""The opaque custom ops of compile=true (lab/compile/opaque_ops.py): they call what the step
context names, their fake implementations agree with the real ones (torch.library.opcheck:
schema, fake tensors, AOT dispatch), and they refuse to run outside a step; plus the warm-up
sizes and the knobs of lab/compile."""

import pytest
import torch

from lab.attention.base import AttentionBackend
from lab.compile import warmup_sizes
from lab.compile.opaque_ops import StepContext, reset_step_context, step_context
from lab.config.compose import compose_config
from lab.config.validate import validate_config


class EchoBackend(AttentionBackend):
    """Attention stand-in: out = q * scale + layer_idx (forward_mla: | q_nope | q_pe | heads'
    first V channels + the latent's mean), so a test sees the op forward its arguments."""

    name = "echo"

    def kv_cache_spec(self, spec, block_size, dtype):
        raise NotImplementedError

    def forward(self, layer_idx, q, k, v, kv_cache, metadata, scale):
        assert kv_cache == f"cache{layer_idx}" and metadata == "md"
        return q * scale + layer_idx

    def forward_mla(self, layer_idx, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, mla, scale):
        assert mla == f"mla{layer_idx}"
        return q_nope[..., :2] * scale + kv_c.mean(-1)[:, None, None]


class MLALayer:
    def __init__(self, idx):
        self.idx = idx

    def mla_weights(self):
        return f"mla{self.idx}"


def context() -> StepContext:
    return StepContext(EchoBackend(), "md", ["cache0", "cache1"], {1: MLALayer(1)})


@pytest.fixture(autouse=True)
def _clean_context():
    yield
    reset_step_context()


def test_attention_op_forwards_to_the_step_backend_and_its_fake_agrees():
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    with step_context(context()):
        out = torch.ops.lab.attention(q, k, v, 1, 0.5, None, None, None)
        torch.testing.assert_close(out, q * 0.5 + 1)
        torch.library.opcheck(torch.ops.lab.attention, (q, k, v, 1, 0.5, None, None, None))


@pytest.mark.parametrize("op", ["attention", "mla_attention", "fused_moe", "scaled_gemm"])
def test_no_opaque_op_argument_has_a_default(op):
    """Inductor's C++ wrapper hands the dispatcher only the arguments a graph's call passed; a
    defaulted argument it left out was read past that list: bench_qwen3_06b fp32 compiled
    (kernels=auto) segfaulted in its first step while lab::attention's window, sinks and soft
    cap had defaults. Every argument of every lab op is given by its caller instead."""
    schema = getattr(torch.ops.lab, op).default._schema
    assert [a.name for a in schema.arguments if a.has_default_value()] == []


def test_mla_attention_op_forwards_to_the_step_backend_and_its_fake_agrees():
    q_nope, q_pe = torch.randn(3, 4, 6), torch.randn(3, 4, 2)
    kv_c, k_pe = torch.randn(3, 5), torch.randn(3, 2)
    with step_context(context()):
        out = torch.ops.lab.mla_attention(q_nope, q_pe, kv_c, k_pe, 1, 2, 0.5)
        assert out.shape == (3, 4, 2)
        torch.library.opcheck(torch.ops.lab.mla_attention, (q_nope, q_pe, kv_c, k_pe, 1, 2, 0.5))


def test_fused_moe_op_runs_the_named_implementation_and_its_fake_agrees():
    from lab.kernels.fused_moe import fused_moe_ref

    g = torch.Generator().manual_seed(0)
    x, w13, w2 = torch.randn(5, 8, generator=g), torch.randn(3, 12, 8, generator=g), \
        torch.randn(3, 8, 6, generator=g)
    weights, ids = torch.rand(5, 2, generator=g), torch.randint(0, 3, (5, 2), generator=g)
    args = (x, w13, w2, weights, ids, None, None, "lab.kernels.fused_moe:fused_moe_ref")
    torch.testing.assert_close(torch.ops.lab.fused_moe(*args),
                               fused_moe_ref(x, w13, w2, weights, ids))
    torch.library.opcheck(torch.ops.lab.fused_moe, args)


def test_scaled_gemm_op_runs_the_named_implementation_and_its_fake_agrees():
    from lab.kernels.int8_gemm import int8_gemm_ref

    g = torch.Generator().manual_seed(0)
    a_q = torch.randint(-127, 128, (3, 16), generator=g, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (5, 16), generator=g, dtype=torch.int8)
    a_scale, w_scale = torch.rand(3, 1, generator=g), torch.rand(5, generator=g)
    args = (a_q, a_scale, w_q, w_scale, None, torch.float32, "lab.kernels.int8_gemm:int8_gemm_ref")
    torch.testing.assert_close(torch.ops.lab.scaled_gemm(*args),
                               int8_gemm_ref(a_q, a_scale, w_q, w_scale, None, torch.float32))
    torch.library.opcheck(torch.ops.lab.scaled_gemm, args)


def test_the_attention_op_refuses_to_run_outside_a_step_and_steps_do_not_nest():
    q = torch.randn(2, 1, 4)
    with pytest.raises(RuntimeError, match="outside a step"):
        torch.ops.lab.attention(q, q, q, 0, 1.0, None, None, None)
    with step_context(context()), pytest.raises(RuntimeError, match="nested"):
        with step_context(context()):
            pass


def test_warmup_sizes_default_to_one_decode_sized_step_within_the_budgets():
    assert warmup_sizes(None, 256, 2048) == (16,)
    assert warmup_sizes(None, 4, 2048) == (4,)
    assert warmup_sizes(None, 256, 8) == (8,)
    assert warmup_sizes([32, 1, 4096], 256, 2048) == (32, 1)  # above the token budget: dropped


def test_warmup_sizes_reach_every_graph():
    """With a second graph for steps of >= 256 tokens, a step of 256 compiles it unless a
    compile size already falls in its range (or the budget keeps every step below it)."""
    assert warmup_sizes(None, 256, 2048, (1, 256)) == (16, 256)
    assert warmup_sizes([16, 512], 256, 2048, (1, 256)) == (16, 512)
    assert warmup_sizes([512], 256, 2048, (1, 256)) == (512, 1)
    assert warmup_sizes(None, 256, 200, (1, 256)) == (16,)


def test_cpu_options_split_steps_at_the_large_step_size_with_the_budget_as_its_hint():
    from lab.compile.compiler import LARGE_STEP_TOKENS, CompileOptions

    cpu = CompileOptions.for_device("cpu", 8192)
    assert (cpu.size_hint, cpu.large_steps_from, cpu.large_size_hint) == (
        None, LARGE_STEP_TOKENS, 8192)
    assert CompileOptions.for_device("cpu", LARGE_STEP_TOKENS).large_steps_from is None
    assert CompileOptions.for_device("cpu").large_steps_from is None
    assert CompileOptions.for_device("cuda", 8192).large_steps_from is None


@pytest.mark.parametrize(("overrides", "message"), [
    (["compile=maybe"], "^compile='maybe' is invalid: must be null \\(auto: .* or true or false"),
    (["compile_sizes=[0]"], "^compile_sizes=\\[0\\] is invalid: must be null"),
    (["compile=true", "enforce_eager=true"], "^compile=true is invalid with enforce_eager"),
    (["compile=true", "tensor_parallel_size=2", "executor=multiproc"],
     "^compile=true is invalid with tensor_parallel_size=2"),
])
def test_bad_compile_knobs_are_refused_naming_them(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_config(compose_config(overrides))
