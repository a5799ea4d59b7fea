"""Greedy token ids with attention=triton_mla (fp32; Triton's interpreter on CPU) equal those of
attention=torch and of transformers, for tiny DeepSeek-V2 (with q_lora), V2-Lite (without) and V3,
in one run that forces chunked prefill (a 16-token budget: mixed prefill + decode steps go
through both paths), prefix-cache hits (shared prefixes) and preemption (a tiny cache), with
decode splits forced so the LSE merge runs. `kernels=triton` also puts norms, rotary and the
fused MoE through Triton (`-m slow`). The Triton run goes over both engine clients (inproc,
and mp on the first model: the interpreter runs in the core process); the attention=torch and
transformers references are computed once per model."""

import pytest
import torch

from lab import LLM
from tests.engine.parity_utils import mp_on_the_first_only
from tests.engine.test_triton_flash_parity import check_backend_parity, model_fixtures
from tests.options import tiny_models

MODELS = tiny_models("mla")


# V2-Lite (no q_lora) and V3 (its router) differ from V2 outside the MLA kernels, and match
# transformers with attention=torch in tests/engine/test_deepseek_parity.py: `-m slow` here
model_name, reference = model_fixtures(MODELS, slow=tuple(MODELS[1:]))


def test_triton_mla_matches_torch_and_transformers(model_name, reference, engine_client):
    """mp (a core process) on the first model only: the interpreter runs the same kernels
    there. The other ops are PyTorch's here (kernels=torch); the next test puts them through
    Triton too."""
    mp_on_the_first_only(engine_client, model_name, MODELS[0], "kernels")
    check_backend_parity(model_name, "triton_mla", "torch", engine_client, reference)


@pytest.mark.slow
def test_triton_mla_with_triton_ops_matches(model_name, reference):
    """kernels=triton (norms, rotary, the fused MoE) as well: every op of the run in Triton's
    interpreter. `-m slow` (~15 CPU-s): the Triton norms, rotary and fused MoE keep
    transformers' logits on V2 and V3 in
    tests/models/test_deepseek.py::test_triton_ops_match_transformers, and the engine run above
    differs from this one only in the ops it calls."""
    check_backend_parity(model_name, "triton_mla", "triton", "inproc", reference)


def test_backends_refuse_the_other_kind_naming_the_alternative():
    with pytest.raises(ValueError, match="triton_mla"):
        LLM("tiny_deepseek", attention="triton_flash")
    with pytest.raises(ValueError, match="triton_mla does not support 'gqa'.*triton_flash"):
        LLM("tiny_llama", attention="triton_mla")


def test_triton_mla_refuses_bf16_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("bf16 runs on CUDA")
    with pytest.raises(ValueError, match="bfloat16"):
        LLM("tiny_deepseek", attention="triton_mla", dtype="bfloat16")
