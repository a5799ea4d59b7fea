"""The devices the simulator can pretend to be (`sim.device`): peak dense FLOP/s, memory bandwidth,
memory size and host-link bandwidth.

GPU values are public spec-sheet numbers (NVIDIA data sheets, SXM parts, dense bf16 tensor-core
peak without sparsity; memory as the sheet states it, taken as GiB, close to what nvidia-smi
shows; host link: one direction of the PCIe slot). `cpu` is a rough guess at a small shared
x86 machine (2 AVX2 cores, fp32, DDR4): good for ordering runs on this machine, not for absolute
times; fit a `sim/step_time=profiled` model for those.
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


DEVICES: dict[str, DeviceSpec] = {
    # NVIDIA H100 SXM5 data sheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, 80 GB, PCIe Gen5 x16
    "h100": DeviceSpec("h100", 989e12, 3.35e12, 80 * GiB, 64e9,
                       source="NVIDIA H100 SXM5 data sheet"),
    # NVIDIA H200 SXM data sheet: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, 141 GB, PCIe Gen5 x16
    "h200": DeviceSpec("h200", 989e12, 4.8e12, 141 * GiB, 64e9,
                       source="NVIDIA H200 SXM data sheet"),
    # NVIDIA A100 80GB SXM data sheet: 312 TFLOP/s bf16 dense, 2.039 TB/s HBM2e, PCIe Gen4 x16
    "a100": DeviceSpec("a100", 312e12, 2.039e12, 80 * GiB, 32e9,
                       source="NVIDIA A100 80GB SXM data sheet"),
    # rough: 2 cores x ~25 GFLOP/s achieved fp32 (AVX2 FMA), ~10 GB/s DRAM, swap = a memcpy
    "cpu": DeviceSpec("cpu", 50e9, 10e9, 8 * GiB, 5e9, is_cpu=True,
                      source="rough values for a 2-core x86 VM (not measured)"),
}


def device_spec(device: str | DeviceSpec) -> DeviceSpec:
    """A DeviceSpec by name (h100, h200, a100, cpu), or the one given."""
    if isinstance(device, DeviceSpec):
        return device
    key = str(device).lower()
    if key not in DEVICES:
        raise ValueError(f"sim.device={device!r} is unknown: use one of {', '.join(DEVICES)}")
    return DEVICES[key]
