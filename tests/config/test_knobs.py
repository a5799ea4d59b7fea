"""Every engine knob is checked where the config is composed, with a message naming the knob and
its allowed values (from its one declaration, lab/config/knobs.py); unknown keys are refused with
the list of knobs (lab/config/validate.py)."""

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from lab.config.compose import CONF_DIR, compose_config
from lab.config.plugins import declared_knobs
from lab.config.validate import validate_config
from lab.engine.llm_engine import LLMEngine
from lab.platform import resolve_device
from tests.options import backends

BAD = [  # (override, the allowed values the message states)
    ("max_num_seqs=0", "integer >= 1"),
    ("max_num_batched_tokens=-5", "integer >= 1"),
    ("max_model_len=1", "integer >= 2"),
    ("block_size=0", "power of two"),
    ("block_size=-16", "power of two"),
    ("block_size=3", "power of two"),
    ("block_size=16.0", "power of two"),
    ("num_gpu_blocks=1", "integer >= 2"),
    ("gpu_memory_utilization=0", "(0, 1]"),
    ("gpu_memory_utilization=1.5", "(0, 1]"),
    ("cpu_kv_cache_gb=0", "GiB > 0"),
    ("cpu_kv_cache_gb=-1", "GiB > 0"),
    ("enable_prefix_caching=maybe", "true or false"),
    ("long_prefill_token_threshold=-1", "integer >= 0"),
    ("seed=-1", "[0, 2**63)"),
    ("seed=true", "[0, 2**63)"),
    ("device=tpu", "auto, cpu, cuda or cuda:N"),
    ("device=cuda:x", "auto, cpu, cuda or cuda:N"),
    ("dtype=float64", "auto, float32"),
    ("slo.ttft_s=0", "seconds > 0"),
    ("slo.tpot_s=-0.1", "seconds > 0"),
    ("slo.e2e_s=soon", "seconds > 0"),
    ("tensor_parallel_size=0", "integer >= 1"),
    ("expert_parallel=2", "true or false"),
    ("distributed_backend=mpi", "auto, gloo, nccl"),
    ("enable_dbo=yes", "true or false"),
    ("dbo_decode_token_threshold=1", "integer >= 2"),
    ("dbo_prefill_token_threshold=0", "integer >= 2"),
    # tensor parallelism needs an executor with one worker per rank; NCCL needs CUDA
    ("tensor_parallel_size=2", "executor=multiproc"),
    ("distributed_backend=nccl", "CUDA only"),
]


@pytest.mark.parametrize(("override", "allowed"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_knob_is_refused_naming_it_and_its_range(override, allowed):
    name, value = override.split("=")
    cfg = compose_config([override])
    with pytest.raises(ValueError, match=f"^{name}=") as e:
        validate_config(cfg)
    assert allowed in str(e.value) and value in str(e.value)


def test_every_declared_knob_is_composed_with_its_default_and_passes_its_rule():
    cfg = compose_config()
    for knob in declared_knobs():
        assert OmegaConf.select(cfg, knob.name) == (
            list(knob.default) if isinstance(knob.default, tuple) else knob.default), knob.name
        assert knob.ok(knob.default), knob.name
    validate_config(cfg)


def test_config_yaml_declares_no_knob():
    """One declaration per knob: lab/conf/config.yaml holds the defaults list and Hydra's own
    settings only; the knobs' defaults come from their declarations."""
    raw = OmegaConf.load(CONF_DIR / "config.yaml")
    assert set(raw) == {"defaults", "hydra"}


@pytest.mark.parametrize("attention", backends())
def test_the_attention_backend_names_the_block_sizes_it_supports(attention):
    backend = get_class(compose_config([f"attention={attention}"]).attention._target_)
    assert 16 in backend.block_sizes
    validate_config(compose_config([f"attention={attention}", "block_size=4"]))
    with pytest.raises(ValueError, match=f"block_size=512 is invalid for attention={attention}:"
                                         " it supports block sizes 1, 2, 4"):
        validate_config(compose_config([f"attention={attention}", "block_size=512"]))


@pytest.mark.parametrize("override", ["+not_a_knob=1", "+slo.not_a_bound=1"])
def test_a_key_added_on_the_command_line_is_refused(override):
    cfg = compose_config([override])
    with pytest.raises(ValueError, match="unknown setting .*not_a") as e:
        validate_config(cfg)
    assert "max_num_seqs" in str(e.value) or "ttft_s" in str(e.value)


def test_the_engine_validates_before_building_anything():
    with pytest.raises(ValueError, match="^block_size=0 is invalid"):
        LLMEngine(compose_config(["block_size=0", "model=hf", "model.path=/nonexistent"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_on_a_machine_without_it_says_so_and_how_to_use_the_cpu(device):
    with pytest.raises(ValueError, match=f"device='{device}' is invalid: CUDA is unavailable") as e:
        validate_config(compose_config([f"device={device}"]))
    assert "device=cpu" in str(e.value) and "device=auto" in str(e.value)
    assert resolve_device("cpu").type == "cpu" and resolve_device("auto").type == "cpu"


def test_a_cuda_index_past_the_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device='cuda:2' is invalid: this machine has 2 CUDA "
                                         r"device\(s\), cuda:0 .. cuda:1"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_a_rank_device_on_cuda_always_has_an_index(monkeypatch):
    """torch 2.11's torch.cuda.set_device refuses a bare 'cuda' (every CUDA engine failed to
    start on the H200): a rank's device carries its index, rank modulo the visible GPUs."""
    from lab.platform import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert rank_device("cuda", 0, 1) == torch.device("cuda", 0)
    assert rank_device("auto", 0, 1) == torch.device("cuda", 0)
    assert [rank_device("cuda", r, 4).index for r in range(4)] == [0, 1, 0, 1]
    assert rank_device("cuda:1", 0, 1) == torch.device("cuda", 1)
    assert rank_device("cpu", 1, 2) == torch.device("cpu")
