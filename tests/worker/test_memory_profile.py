"""The KV budget from a profile run (lab/worker/memory.py), on a CPU through a fake device
memory: the worker runs one step of max_num_batched_tokens tokens between the peak reset and
its reading, and gets (utilization x total - resident - activations - outside torch) / bytes per
block blocks."""

from __future__ import annotations

import pytest

from lab.config.compose import compose_config
from lab.config.knobs import EngineKnobs
from lab.engine.builder import worker_config
from lab.worker.memory import DeviceMemory, MemoryProfile
from lab.worker.worker import Worker

MIB = 2**20


class FakeMemory(DeviceMemory):
    """A device whose allocator holds `resident` bytes and whose peak grows by `per_token`
    bytes for every token of the forwards run since the last reset (counted by a hook)."""

    def __init__(self, total: int, resident: int, per_token: int, outside: int) -> None:
        self._total, self.resident, self.per_token, self.outside = total, resident, per_token, outside
        self.tokens_since_reset: int | None = None
        self.calls: list[str] = []

    def watch(self, model) -> None:
        model.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        if self.tokens_since_reset is not None:
            self.tokens_since_reset = max(self.tokens_since_reset, args[0].numel())

    def total(self) -> int:
        return self._total

    def allocated(self) -> int:
        self.calls.append("allocated")
        return self.resident

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")
        self.tokens_since_reset = 0

    def peak_allocated(self) -> int:
        self.calls.append("peak_allocated")
        return self.resident + self.per_token * (self.tokens_since_reset or 0)

    def outside_torch(self) -> int:
        return self.outside


@pytest.fixture(scope="module")
def config():
    cfg = compose_config(["model=tiny_llama", "device=cpu", "max_num_batched_tokens=96",
                          "dtype=float32"])
    return worker_config(cfg)


def make_worker(config, memory: FakeMemory) -> Worker:
    worker = Worker(config, memory=memory)
    memory.watch(worker.model)
    return worker


def test_blocks_follow_the_budget_of_a_max_size_step(config):
    memory = FakeMemory(total=64 * MIB, resident=3 * MIB, per_token=20_000, outside=MIB)
    worker = make_worker(config, memory)
    blocks = worker.determine_num_blocks(EngineKnobs(gpu_memory_utilization=0.5))
    assert memory.tokens_since_reset == 96  # the profile step had max_num_batched_tokens tokens
    assert memory.calls == ["allocated", "reset_peak", "peak_allocated"]
    budget = int(0.5 * 64 * MIB - 3 * MIB - 96 * 20_000 - MIB)
    assert blocks == budget // worker.bytes_per_block
    profile = MemoryProfile(64 * MIB, 3 * MIB, 96 * 20_000, MIB)
    assert profile.kv_cache_bytes(0.5) == budget
    # graphs are one more term of the same budget
    assert MemoryProfile(64 * MIB, 3 * MIB, 96 * 20_000, MIB, graphs=MIB).kv_cache_bytes(0.5) \
        == budget - MIB


def test_no_room_for_the_cache_names_the_budget_and_the_fix(config):
    memory = FakeMemory(total=8 * MIB, resident=3 * MIB, per_token=20_000, outside=MIB)
    worker = make_worker(config, memory)
    with pytest.raises(RuntimeError, match=r"no memory left for the KV cache .*activations "
                                           r".*lower max_num_batched_tokens or raise "
                                           r"gpu_memory_utilization"):
        worker.determine_num_blocks(EngineKnobs(gpu_memory_utilization=0.5))
    # an explicit block count skips the profile
    assert worker.determine_num_blocks(EngineKnobs(num_gpu_blocks=7)) == 7


def test_a_cpu_worker_without_a_probe_sizes_from_cpu_kv_cache_gb(config):
    worker = Worker(config)
    assert worker.memory is None
    blocks = worker.determine_num_blocks(EngineKnobs(cpu_kv_cache_gb=0.001))
    assert blocks == int(0.001 * 2**30) // worker.bytes_per_block


def test_a_cpu_cache_is_sized_from_memory_for_the_requests_it_can_serve():
    """cpu_kv_cache_gb unset: room for cpu_kv_cache_requests (unset: max_num_seqs) requests of
    the model's whole context, at most gpu_memory_utilization of the memory available, as
    vLLM-CPU sizes its cache from memory; GiB when set."""
    from types import SimpleNamespace

    from lab.cache.sizing import cpu_kv_bytes

    cfg = SimpleNamespace(max_position_embeddings=2048)
    block = 8192  # bytes
    plenty = 2**40
    for knobs, blocks in ((EngineKnobs(max_num_seqs=4), 4 * 128 + 1),
                          (EngineKnobs(max_num_seqs=4, cpu_kv_cache_requests=1), 129)):
        assert cpu_kv_bytes(knobs, cfg, 16, block, available=plenty) == blocks * block
    capped = cpu_kv_bytes(EngineKnobs(), cfg, 16, block, available=100 * 2**20)
    assert capped == int(100 * 2**20 * EngineKnobs().gpu_memory_utilization)
    assert cpu_kv_bytes(EngineKnobs(cpu_kv_cache_gb=0.5), cfg, 16, block, 1) == 2**29


def test_decode_graphs_are_one_more_term_of_the_budget(monkeypatch):
    """With capture sizes, the worker captures the decode graphs once in a throw-away runner
    before the profile step and takes what they added to the device's used memory off the KV
    budget (a fake capture here: graphs exist on CUDA only)."""
    from lab.worker.model_runner import ModelRunner

    cfg = compose_config(["model=tiny_llama", "device=cpu", "max_num_batched_tokens=96",
                          "dtype=float32", "cudagraph_capture_sizes=[1,2,4]"])
    memory = FakeMemory(total=64 * MIB, resident=3 * MIB, per_token=20_000, outside=MIB)
    memory.graphs = 0
    monkeypatch.setattr(FakeMemory, "used", lambda self: self.resident + self.graphs,
                        raising=False)

    def capture(runner):
        memory.graphs = 2 * MIB
        return 3

    monkeypatch.setattr(ModelRunner, "capture_graphs", capture)
    worker = make_worker(worker_config(cfg), memory)
    blocks = worker.determine_num_blocks(EngineKnobs(gpu_memory_utilization=0.5))
    budget = int(0.5 * 64 * MIB - 3 * MIB - 96 * 20_000 - MIB - 2 * MIB)
    assert blocks == budget // worker.bytes_per_block
