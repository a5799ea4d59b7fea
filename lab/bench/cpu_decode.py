"""attention=cpu's paged decode kernel on a decode step's whole KV stream, one process.

    python -m lab.bench.cpu_decode                              # bench_qwen3_06b, bf16
    python -m lab.bench.cpu_decode --preset bench_llama --dtype float32
    python -m lab.bench.cpu_decode --batches 16x192 1x2048      # requests x keys each

For each batch (B requests of L keys), the median time of one decode step's attention over
every layer of the preset (`lab/kernels/cpu_paged_decode.py`, one call per layer, each layer
its own cache), with GB/s = the K and V bytes the step reads / time. The caches are copied until
the stream passes `--stream-mb` (default 450 MB, more than this VM's share of L3), and the
copies are called in turn, so every call reads from DRAM as a served decode step does. A
request's blocks are interleaved with the others' as the engine hands them out when requests
decode together (block j of every request, then block j + 1). `--portable` times the plain C++
loops too. Correctness is tests/kernels/test_cpu_paged_decode.py; here the vector and the
portable results are also checked against each other before anything is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lab.kernels import cpu_paged_decode as kernel

PRESETS = {  # name -> (layers, query heads, KV heads, head_dim), from lab/conf/model/bench_*.yaml
    "bench_llama": (4, 8, 2, 64),
    "bench_qwen3_06b": (12, 16, 8, 128),
}
BLOCK = 16


def step_inputs(batch: int, keys: int, heads: int, kv_heads: int, dim: int, dtype):
    """q, k, v, slots (nothing written), the block table and seq_lens of one decode step, and
    the number of cache blocks it needs."""
    per_req = -(-keys // BLOCK)
    table = (torch.arange(per_req)[None, :] * batch + torch.arange(batch)[:, None] + 1).int()
    q = torch.randn(batch, heads, dim).to(dtype)
    k = torch.randn(batch, kv_heads, dim).to(dtype)
    slots = torch.full((batch,), -1, dtype=torch.int64)
    seq_lens = torch.full((batch,), keys, dtype=torch.int32)
    return (q, k, k.clone(), slots, table, seq_lens), batch * per_req + 1


def run(preset: str, dtype, batch: int, keys: int, stream_mb: float, repeats: int,
        portable: bool) -> dict[str, float]:
    layers, heads, kv_heads, dim = PRESETS[preset]
    (q, k, v, slots, table, seq_lens), blocks = step_inputs(batch, keys, heads, kv_heads, dim,
                                                            dtype)
    cache_bytes = 2 * blocks * BLOCK * kv_heads * dim * q.element_size()
    copies = max(1, int(stream_mb * 1e6 // (layers * cache_bytes)))
    caches = [torch.randn(2, blocks, BLOCK, kv_heads, dim).to(dtype)
              for _ in range(layers * copies)]
    scale = dim ** -0.5

    def step(c: torch.Tensor, vector: bool) -> torch.Tensor:
        return kernel.paged_decode(q, k, v, c, slots, table, seq_lens, batch, batch, scale,
                                   portable=not vector)

    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(step(caches[0], True), step(caches[0], False), atol=tol, rtol=tol)
    impls = {"vector": True, **({"portable": False} if portable else {})}
    times: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(repeats):
        for name, vector in impls.items():
            t = time.perf_counter()
            for c in caches:
                step(c, vector)
            times[name].append((time.perf_counter() - t) / copies)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="bench_qwen3_06b")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--batches", nargs="+", default=["16x192", "16x256", "4x512", "1x2048"],
                   help="BxL: B requests of L keys each")
    p.add_argument("--stream-mb", type=float, default=450.0)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--portable", action="store_true", help="time the portable loops too")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    kernel.load()  # built (or loaded) before anything is timed
    layers, _, kv_heads, dim = PRESETS[args.preset]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.preset} "
          f"({layers} layers), {args.dtype}; ms per step (GB/s of K and V read)")
    for spec in args.batches:
        batch, keys = (int(x) for x in spec.split("x"))
        res = run(args.preset, dtype, batch, keys, args.stream_mb, args.repeats, args.portable)
        gb = 2 * layers * batch * keys * kv_heads * dim * dtype.itemsize / 1e9
        cols = "  ".join(f"{name} {sec * 1e3:7.2f} ms ({gb / sec:5.1f})"
                         for name, sec in res.items())
        print(f"{batch:3d} requests x {keys:5d} keys  {cols}", flush=True)


if __name__ == "__main__":
    main()
