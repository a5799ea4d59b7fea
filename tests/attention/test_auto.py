"""attention=auto (the default, lab/attention/auto.py): attention=cpu on a CPU, triton_mla for an
MLA model on CUDA, triton_flash for any other there; the worker completes the option with its
device and the model; the summary's header names the choice; config checks ask every backend
it may choose."""

import pytest
import torch
from transformers import AutoConfig

from lab import LLM, SamplingParams
from lab.attention.auto import backend_classes, build_backend, choose_backend, has_mla
from lab.attention.cpu_backend import CPUAttentionBackend
from lab.attention.torch_backend import TorchAttentionBackend
from lab.config.compose import compose_config, set_knobs
from lab.config.validate import validate_config
from lab.engine.replay import run_setup
from lab.models.tiny import ensure_tiny_model

AUTO = {"_target_": "lab.attention.auto.auto_backend", "_partial_": True}


def hf_config(name: str):
    return AutoConfig.from_pretrained(ensure_tiny_model(name))


def test_the_choice_by_device_and_model():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert choose_backend(cpu, mla=False).endswith("CPUAttentionBackend")
    assert choose_backend(cpu, mla=True).endswith("CPUAttentionBackend")  # torch's MLA path
    assert choose_backend(cuda, mla=False).endswith("TritonFlashBackend")
    assert choose_backend(cuda, mla=True).endswith("TritonMLABackend")


def test_mla_is_read_from_the_model():
    assert not has_mla(hf_config("tiny_llama"))
    assert has_mla(hf_config("tiny_deepseek"))


def test_the_worker_completes_auto_and_keeps_a_named_option():
    cpu = torch.device("cpu")
    assert type(build_backend(AUTO, cpu, hf_config("tiny_deepseek"))) is CPUAttentionBackend
    named = {"_target_": "lab.attention.torch_backend.TorchAttentionBackend"}
    assert type(build_backend(named, cpu, hf_config("tiny_llama"))) is TorchAttentionBackend


def test_config_checks_ask_every_backend_auto_may_choose():
    assert len(backend_classes(AUTO["_target_"])) == 3
    cfg = set_knobs(compose_config(), {"block_size": 256})
    with pytest.raises(ValueError, match="block_size=256 is invalid for attention=cpu"):
        validate_config(cfg)


def test_the_default_engine_runs_attention_cpu_and_says_so():
    llm = LLM("tiny_llama", dtype="float32", block_size=8)
    assert type(llm.engine.executor.worker.attn_backend) is CPUAttentionBackend
    assert run_setup(llm.engine)["attention"] == "cpu (auto)"
    torch_llm = LLM("tiny_llama", dtype="float32", block_size=8, attention="torch")
    assert run_setup(torch_llm.engine)["attention"] == "torch"
    prompts = [[5, 9, 17, 3, 44], [7] * 12]
    sp = SamplingParams(temperature=0, max_tokens=6)
    assert ([o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
            == [o.outputs[0].token_ids for o in torch_llm.generate(prompts, sp)])
