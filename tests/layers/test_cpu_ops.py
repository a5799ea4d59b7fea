"""The C++ CPU kernels behind the kernels seam (lab/layers/cpu_ops.py): kernels=torch is the
PyTorch reference everywhere (nothing C++ built, loaded, packed or run); kernels=cpu builds its
kernels while the engine is constructed, from an empty build directory too, and no request
builds one; a kernel that cannot be built fails kernels=cpu's start and makes kernels=auto fall
back to the reference; fp32 linears take MKL's packed sgemm unless the ordered kernel is asked
for; only the LM head, not the input embedding, is packed."""

from __future__ import annotations

import logging

import pytest
import torch
from hydra.utils import instantiate

from lab import LLM, SamplingParams
from lab.attention.torch_backend import TorchAttentionBackend
from lab.config.compose import compose_config
from lab.kernels import cpu_argmax, cpu_ext, cpu_gemm, cpu_paged_decode, cpu_sgemm
from lab.kernels.cpu_ext import CPUExtension, CPUKernelUnavailable
from lab.layers.cpu_ops import CPUOps, OneDNNGemm
from lab.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from lab.models.loader import load_model
from lab.models.tiny import ensure_tiny_model
from tests.kv import SMALL_KV

KERNELS = (cpu_argmax, cpu_sgemm, cpu_gemm, cpu_paged_decode)
PROMPTS = [[3, 4, 5, 6, 7], [8, 9]]
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def real_modules() -> dict:
    """Every extension that applies here, loaded (built once per install)."""
    try:
        return {m.EXTENSION.stem: m.EXTENSION.load() for m in KERNELS if m.applies()}
    except CPUKernelUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def nothing_loaded(tmp_path, monkeypatch):
    """An empty TORCH_EXTENSIONS_DIR and no extension loaded in this process."""
    root = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    for module in KERNELS:
        monkeypatch.setattr(module.EXTENSION, "module", None)
    return root


def _ids(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def _worker(llm: LLM):
    return llm.engine.executor.worker


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_torch_is_the_reference_on_a_cpu(monkeypatch, dtype):
    """No lab C++ extension is built, loaded or run, and no layer holds a packed weight (bf16
    on an AMX CPU and fp32 alike); with attention=torch (attention=auto's attention=cpu has a
    C++ kernel of its own: its group, not kernels')."""
    def forbidden(*args, **kwargs):
        pytest.fail("kernels=torch built, loaded or ran a lab C++ kernel")

    monkeypatch.setattr(CPUExtension, "load", forbidden)
    monkeypatch.setattr(CPUExtension, "build", forbidden)
    monkeypatch.setattr(cpu_argmax, "argmax_rows", forbidden)
    llm = LLM("tiny_llama", kernels="torch", attention="torch", dtype=dtype, **SMALL_KV)
    assert len(_ids(llm)[0]) == GREEDY.max_tokens
    packed = [name for name, m in _worker(llm).model.named_modules()
              if getattr(m, "kernel", None) is not None
              or getattr(m, "packed_weight", None) is not None]
    assert packed == []


def test_a_fresh_build_directory_never_makes_a_request_wait(real_modules, nothing_loaded,
                                                            monkeypatch):
    """kernels=cpu with attention=cpu, from an empty build directory and nothing loaded: every
    kernel the run needs is built while the engine is constructed, into that directory; the
    requests build nothing, and their greedy picks run the C++ argmax."""
    builds: list[str] = []

    def compile_extension(name, source, cflags, build_dir):
        assert build_dir.parent == nothing_loaded
        builds.append(source.stem)
        return real_modules[source.stem]

    monkeypatch.setattr(cpu_ext, "compile_extension", compile_extension)
    llm = LLM("tiny_llama", kernels="cpu", attention="cpu", **SMALL_KV)
    at_start = sorted(builds)
    assert {"cpu_argmax", "cpu_paged_decode"} <= set(at_start)
    assert ("cpu_sgemm" in at_start) == cpu_sgemm.applies() and "cpu_gemm" not in at_start  # fp32
    picks = []
    real = cpu_argmax.argmax_rows
    monkeypatch.setattr(cpu_argmax, "argmax_rows", lambda x: picks.append(1) or real(x))
    _ids(llm)
    assert sorted(builds) == at_start and picks
    assert _worker(llm).runner.attn_backend.kernel_ok


def test_a_kernel_that_cannot_be_built_fails_kernels_cpu_and_auto_falls_back(
        nothing_loaded, monkeypatch, caplog):
    def no_compiler(*args):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(cpu_ext, "compile_extension", no_compiler)
    with pytest.raises(CPUKernelUnavailable,
                       match=r"kernels=cpu: (gemms\.fp32|argmax): .*no C\+\+ compiler.*kernels=torch"):
        LLM("tiny_llama", kernels="cpu", **SMALL_KV)
    with caplog.at_level(logging.WARNING, logger="lab.layers.cpu_ops"):
        auto = LLM("tiny_llama", **SMALL_KV)  # kernels=auto
    assert "kernels=cpu: argmax runs its PyTorch reference" in caplog.text
    assert _ids(auto) == _ids(LLM("tiny_llama", kernels="torch", **SMALL_KV))


def test_fp32_linears_take_the_blocked_kernel_then_mkl_unless_the_ordered_one_is_asked_for():
    if not cpu_sgemm.available():
        pytest.skip("torch has no MKL here (or the op could not be built)")
    w = torch.randn(512, 512, generator=torch.Generator().manual_seed(0)) / 512 ** 0.5
    x = torch.randn(16, 512)
    ops = instantiate(compose_config(["kernels=cpu"]).kernels)
    ops.setup(CPU, torch.float32)
    kernel, packed = ops.pack_linear(w)
    if cpu_sgemm.has_ordered():  # AVX-512: lab's kernel in blocks of 128, whatever the weight
        assert type(kernel) is cpu_sgemm.BlockedGemm and kernel.block == 128
        assert cpu_sgemm.describe(packed) == "ordered: 1 parts x blocks of 128"
    else:  # the next slot
        assert type(kernel) is cpu_sgemm.MKLGemm and cpu_sgemm.describe(packed) == "mkl"
    torch.testing.assert_close(kernel.gemm(x, packed, w), cpu_sgemm.gemm_ref(x, w), atol=1e-4,
                               rtol=1e-5)
    assert ops.pack_linear(torch.randn(64, 64)) == (None, None)  # below min_elements: F.linear
    no_avx512 = instantiate(compose_config(["kernels=cpu", "kernels.gemms.fp32=null"]).kernels)
    no_avx512.setup(CPU, torch.float32)
    kernel, packed = no_avx512.pack_linear(w)
    assert type(kernel) is cpu_sgemm.MKLGemm and cpu_sgemm.describe(packed) == "mkl"
    target = "kernels.gemms.fp32._target_=lab.kernels.cpu_sgemm.OrderedGemm"
    ordered = instantiate(compose_config(["kernels=cpu", target]).kernels)
    ordered.setup(CPU, torch.float32)
    kernel, packed = ordered.pack_linear(w)
    if cpu_sgemm.has_ordered():
        assert type(kernel) is cpu_sgemm.OrderedGemm and cpu_sgemm.describe(packed) != "mkl"
    torch.testing.assert_close(kernel.gemm(x, packed, w), cpu_sgemm.gemm_ref(x, w), atol=1e-4,
                               rtol=1e-5)


def test_the_lm_head_is_packed_and_the_input_embedding_is_not():
    ops = CPUOps({"onednn": OneDNNGemm()})
    ops.setup(CPU, torch.float32)
    model, _ = load_model(ensure_tiny_model("tiny_llama"), TorchAttentionBackend(), torch.float32,
                          "cpu", ops)
    heads = [m for m in model.modules() if isinstance(m, ParallelLMHead)]
    embeddings = [m for m in model.modules() if type(m) is VocabParallelEmbedding]
    assert heads and all(isinstance(m.kernel, OneDNNGemm) for m in heads)
    assert embeddings and all(getattr(m, "kernel", None) is None for m in embeddings)


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match="kernels=cpu runs on a CPU device, the run's is cuda"):
        CPUOps().setup(torch.device("cuda"), torch.float32)
    with pytest.raises(ValueError, match=r"kernels.gemms.fp32 is a object: give a PackedGemm"):
        CPUOps({"fp32": object()})
    with pytest.raises(ValueError, match="kernels.fallback='yes' is invalid: use true or false"):
        CPUOps(fallback="yes")
    with pytest.raises(ValueError, match="kernels.gemms=.* is invalid: give a mapping"):
        CPUOps([cpu_sgemm.MKLGemm()])
    with pytest.raises(ValueError, match="min_elements=-1 is invalid"):
        cpu_sgemm.MKLGemm(min_elements=-1)
    for block in (0, 1.5, True):
        with pytest.raises(ValueError, match=rf"block={block!r} is invalid: use an int >= 1"):
            cpu_sgemm.BlockedGemm(block=block)


def test_a_null_slot_runs_its_reference():
    ops = instantiate(compose_config(["kernels=cpu", "kernels.argmax=null",
                                      "kernels.gemms.fp32=null", "kernels.gemms.mkl=null",
                                      "kernels.gemms.onednn=null"]).kernels)
    ops.setup(CPU, torch.float32)
    assert not ops.argmax_ready and ops.active == {}
    assert ops.pack_linear(torch.randn(1024, 1024)) == (None, None)
