"""The `kernels` group: TritonOps and TorchOps give the same model, and the configs instantiate."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from lab.config.compose import compose_config
from lab.layers.activation import SiluAndMul
from lab.layers.cpu_ops import CPUOps
from lab.layers.norm import RMSNorm
from lab.layers.ops import OPS, LayerOps, TorchOps, TritonOps, auto_ops
from lab.layers.rotary import RotaryEmbedding
from lab.models.loader import load_model
from lab.models.tiny import ensure_tiny_model
from tests.kernels.sm90 import compile_for_sm90
from tests.models.conftest import DenseCausalBackend, run_model
from tests.options import options, tiny_models

IDS = [0, 17, 42, 99, 3, 250, 7, 7, 311, 64, 5, 128, 200, 9]


@pytest.fixture(scope="module")
def tiny():
    return ensure_tiny_model  # the shared cache ($LAB_CACHE_DIR): generated once, not per session


def _logits(path, ops: LayerOps, dtype=torch.float32) -> torch.Tensor:
    model, _ = load_model(path, DenseCausalBackend(), dtype, "cpu", ops)
    return run_model(model, IDS)


@pytest.mark.parametrize("name", tiny_models("gqa"))  # MLA presets: tests/models/test_deepseek.py
def test_triton_ops_match_torch_ops(tiny, name):
    ref = _logits(tiny(name), TorchOps())
    torch.testing.assert_close(_logits(tiny(name), TritonOps()), ref, atol=1e-4, rtol=1e-4)


def test_triton_ops_match_torch_ops_fp16(tiny):
    ref = _logits(tiny("tiny_qwen3"), TorchOps(), torch.float16)
    out = _logits(tiny("tiny_qwen3"), TritonOps(), torch.float16)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_triton_ops_refuse_bf16_on_cpu(tiny):
    model, _ = load_model(tiny("tiny_llama"), DenseCausalBackend(), torch.bfloat16, "cpu", TritonOps())
    with pytest.raises(ValueError, match="bf16 is not supported by Triton's interpreter"):
        run_model(model, IDS)


def test_every_layer_holds_the_models_ops(tiny):
    ops = TritonOps()
    model, _ = load_model(tiny("tiny_qwen3"), DenseCausalBackend(), torch.float32, "cpu", ops)
    layers = [m for m in model.modules() if isinstance(m, (RMSNorm, RotaryEmbedding, SiluAndMul))]
    assert len(layers) == 2 * 5 + 2 and all(m.ops is ops for m in layers)
    default, _ = load_model(tiny("tiny_llama"), DenseCausalBackend(), torch.float32, "cpu")
    assert isinstance(default.ops, TorchOps)


def _positional(fn) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_each_op_binds_a_reference_and_a_kernel_of_one_signature(op):
    """One table row per op: both implementations exist and take the same positional args."""
    ref, tri = getattr(TorchOps(), op.name), getattr(TritonOps(), op.name)
    assert (ref.path, tri.path) == (op.reference, op.triton) and ref.__doc__ == op.doc
    assert _positional(ref.resolve()) == _positional(tri.resolve())


def test_auto_ops_follows_the_device():
    cpu = CPUOps()
    assert auto_ops("cpu", cpu) is cpu and isinstance(auto_ops("cpu"), TorchOps)
    assert isinstance(auto_ops("cuda:0", cpu), TritonOps)
    assert isinstance(auto_ops(), TritonOps if torch.cuda.is_available() else TorchOps)


ON_CPU = {"torch": TorchOps, "triton": TritonOps, "auto": CPUOps, "cpu": CPUOps}


@pytest.mark.parametrize("option", options("kernels"))
def test_kernels_configs_instantiate(option):
    ops = instantiate(compose_config([f"kernels={option}", "device=cpu"]).kernels)
    assert isinstance(ops, ON_CPU.get(option, LayerOps))


def test_auto_config_reads_the_run_device():
    """On a CPU, auto is kernels=cpu's option falling back to the references where a kernel
    cannot be built; on CUDA, Triton."""
    ops = instantiate(compose_config(["device=cpu"]).kernels)
    assert isinstance(ops, CPUOps) and ops.fallback
    explicit = instantiate(compose_config(["kernels=cpu"]).kernels)
    assert repr(ops) == repr(explicit).replace("fallback=False", "fallback=True")
    assert isinstance(instantiate(compose_config(["device=cuda"]).kernels), TritonOps)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter switch is for CPU-only hosts")
def test_importing_kernels_changes_no_environment_and_the_switch_rewraps_earlier_imports():
    """Importing lab.kernels (and kernel modules, and the references' users) leaves os.environ
    as it was; `use_interpreter_without_cuda()`, called after triton.language (torch._dynamo
    imports it) and a kernel module were imported, still makes that kernel run (tl.sum too)."""
    code = (
        "import os, triton.language, torch\n"
        "before = dict(os.environ)\n"
        "import lab.kernels, lab.kernels.rmsnorm, lab.layers.ops, lab.attention.torch_backend\n"
        "assert dict(os.environ) == before, 'an import changed os.environ'\n"
        "from lab.kernels import use_interpreter_without_cuda, warn_if_interpreted\n"
        "assert use_interpreter_without_cuda() and os.environ['TRITON_INTERPRET'] == '1'\n"
        "from lab.kernels.rmsnorm import rms_norm, rms_norm_ref\n"
        "x, w = torch.randn(3, 48), torch.rand(48)\n"
        "torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))\n"
        "assert warn_if_interpreted()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("Triton's interpreter") == 1  # one warning line, when asked


_SM90_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lab.kernels.rmsnorm import _rms_norm_kernel
from lab.kernels.rotary import _rotary_kernel
from lab.kernels.silu_and_mul import _silu_and_mul_kernel

def compile_sm90(fn, consts, dt, warps, special=()):
    sig = {}
    for p in fn.params:
        n = p.name
        sig[n] = ("constexpr" if p.is_constexpr else "*i64" if n == "pos_ptr"
                  else "*fp32" if n in ("cos_ptr", "sin_ptr") else f"*{dt}" if n.endswith("_ptr")
                  else "fp32" if n == "eps" else "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig) if sig[n] != "constexpr"
             and n not in special}
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps})
    assert "ld.global.v4" in k.asm["ptx"], (fn.__name__, consts, "no 128-bit loads")

for dt in ("bf16", "fp16", "fp32"):
    for res, bm, bn, warps in ((True, 1, 4096, 8), (False, 16, 128, 4)):  # the wrappers' choices
        compile_sm90(_rms_norm_kernel, dict(HAS_RESIDUAL=res, BLOCK_M=bm, BLOCK_N=bn), dt, warps,
                     ("n_rows", "group"))
    compile_sm90(_silu_and_mul_kernel, dict(BLOCK=1024), dt, 4)
    for neox in (True, False):
        compile_sm90(_rotary_kernel, dict(HEAD_DIM=128, IS_NEOX=neox, BLOCK_H=32, BLOCK_R=64,
                                          BLOCK_P=0), dt, 8, ("n_q_heads", "n_kv_heads"))
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu-marked tests run the kernels there")
def test_kernels_compile_for_h200():
    """Compile (not interpret) the three kernels for sm_90 with the wheel's ptxas: compiled-mode
    errors and lost 128-bit vectorisation show up on a CPU-only host too."""
    compile_for_sm90(_SM90_COMPILE)
