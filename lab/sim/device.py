"""The devices the simulator can pretend to be (`sim.device`): peak dense FLOP/s, memory bandwidth,
memory size, host-link bandwidth, and the interconnect between the GPUs of one node that
tensor parallelism's all-reduces cross (lab/sim/comm.py).

GPU values are public spec-sheet numbers (NVIDIA data sheets, SXM parts, dense bf16 tensor-core
peak without sparsity; memory as the sheet states it, taken as GiB, close to what nvidia-smi
shows; host link: one direction of the PCIe slot). `cpu` is a rough guess at a small shared
x86 machine (2 AVX2 cores, fp32, DDR4): good for ordering runs on this machine, not for absolute
times; fit a `sim/step_time=profiled` model for those.

Interconnect (a ring all-reduce, lab/sim/comm.py: t = allreduce_latency_s
+ 2(n-1) allreduce_step_latency_s + 2(n-1)/n bytes / allreduce_bandwidth):

- allreduce_bandwidth: the bus bandwidth an all-reduce reaches (NCCL's busBw, nccl-tests
  doc/PERFORMANCE.md): one direction of a GPU's NVLink (the data sheets give the bidirectional
  total: NVLink 4 900 GB/s -> 450 GB/s, NVLink 3 600 GB/s -> 300 GB/s) x 0.8. The 0.8 is about
  what NCCL's own cost model has assumed of a ring on A100 (src/graph/tuning.cc capped sm80's
  ring busBw at 235 GB/s of the 300), used for every GPU here.
- allreduce_latency_s, allreduce_step_latency_s: NCCL's cost model of a ring all-reduce on
  NVLink with its low-latency protocol (src/graph/tuning.cc: baseLat ring/LL 6.6 us, hwLat
  NVLink ring/LL 0.6 us per step): 7.8 us at 2 GPUs, 15 us at 8. Kernel launches and the
  CUDA-graph question are not in it. Small messages take the LL latency and large ones the
  Simple protocol's bandwidth: the lower envelope NCCL's protocol choice approaches.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class DeviceSpec:
    """What a step-time model and the cache planner need to know about a device."""

    name: str
    peak_flops: float  # dense FLOP/s in the model dtype (bf16 tensor cores on a GPU)
    mem_bandwidth: float  # bytes/s of device memory
    memory_bytes: int
    host_link_bandwidth: float  # bytes/s between device and host memory (swap copies)
    is_cpu: bool = False
    source: str = ""
    # the interconnect of tensor parallelism (module docstring); 0: none (TP > 1 is refused)
    allreduce_bandwidth: float = 0.0  # bytes/s: an all-reduce's bus bandwidth (NCCL busBw)
    allreduce_latency_s: float = 0.0  # per all-reduce
    allreduce_step_latency_s: float = 0.0  # per ring step (2(n-1) of them)


NCCL_RING_LL = dict(allreduce_latency_s=6.6e-6, allreduce_step_latency_s=0.6e-6)
NCCL_SOURCE = ("; all-reduce: NVLink one direction x 0.8, NCCL's ring/LL latency model "
               "(src/graph/tuning.cc)")

# rough: gloo between 2 local processes on a shared 2-core VM (`python -m lab.sim.comm -n 2`):
# ~0.12 ms up to 64 KiB, ~1 GB/s bus bandwidth at 4-16 MiB; measure yours with the same sweep
CPU_GLOO = dict(allreduce_bandwidth=1e9, allreduce_latency_s=100e-6,
                allreduce_step_latency_s=10e-6)

DEVICES: dict[str, DeviceSpec] = {
    # NVIDIA H100 SXM5 data sheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, 80 GB, PCIe Gen5 x16;
    # NVLink 4 900 GB/s bidirectional -> 450 GB/s a direction x 0.8 = 360 GB/s bus bandwidth
    "h100": DeviceSpec("h100", 989e12, 3.35e12, 80 * GiB, 64e9,
                       source="NVIDIA H100 SXM5 data sheet" + NCCL_SOURCE,
                       allreduce_bandwidth=0.8 * 450e9, **NCCL_RING_LL),
    # NVIDIA H200 SXM data sheet: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, 141 GB, PCIe Gen5 x16;
    # NVLink 4 as the H100
    "h200": DeviceSpec("h200", 989e12, 4.8e12, 141 * GiB, 64e9,
                       source="NVIDIA H200 SXM data sheet" + NCCL_SOURCE,
                       allreduce_bandwidth=0.8 * 450e9, **NCCL_RING_LL),
    # NVIDIA A100 80GB SXM data sheet: 312 TFLOP/s bf16 dense, 2.039 TB/s HBM2e, PCIe Gen4 x16;
    # NVLink 3 600 GB/s bidirectional -> 300 GB/s a direction x 0.8 = 240 GB/s
    "a100": DeviceSpec("a100", 312e12, 2.039e12, 80 * GiB, 32e9,
                       source="NVIDIA A100 80GB SXM data sheet" + NCCL_SOURCE,
                       allreduce_bandwidth=0.8 * 300e9, **NCCL_RING_LL),
    # rough: 2 cores x ~25 GFLOP/s achieved fp32 (AVX2 FMA), ~10 GB/s DRAM, swap = a memcpy;
    # all-reduce: gloo between local processes (CPU_GLOO above)
    "cpu": DeviceSpec("cpu", 50e9, 10e9, 8 * GiB, 5e9, is_cpu=True,
                      source="rough values for a 2-core x86 VM (not measured); all-reduce: "
                             "rough, measure with the gloo sweep (python -m lab.sim.comm)",
                      **CPU_GLOO),
}


def device_spec(device: str | DeviceSpec) -> DeviceSpec:
    """A DeviceSpec by name (h100, h200, a100, cpu), or the one given."""
    if isinstance(device, DeviceSpec):
        return device
    key = str(device).lower()
    if key not in DEVICES:
        raise ValueError(f"sim.device={device!r} is unknown: use one of {', '.join(DEVICES)}")
    return DEVICES[key]
