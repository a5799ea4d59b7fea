"""The CPU's GEMMs at decode batch sizes: kernels=cpu's GEMMs against oneDNN and F.linear, one
process.

    python -m lab.bench.cpu_gemm                       # bench_llama and bench_qwen3_06b shapes
    python -m lab.bench.cpu_gemm --rows 1 16 64 256    # row counts (tokens in the step)
    python -m lab.bench.cpu_gemm --dtype float32       # fp32: lab's op on its blocked kernel
                                                       # (the default), MKL's packing and the
                                                       # ordered kernel (opt-in)

For each linear of the two bench presets (qkv, o, gate_up, down, LM head: [N, K] from their
configs) and each row count, the median time of one call of

    amx       bf16 only: lab/kernels/cpu_gemm.py (kernels=cpu's bf16 slot; packed once; above
              64 rows it is oneDNN inside the op)
    blocked   fp32 only, AVX-512 builds: lab/kernels/cpu_sgemm.py's kernel summing K in blocks
              of 128 (kernels=cpu's fp32 slot, BlockedGemm; from 128 rows at::linear inside
              the op)
    mkl       fp32 only: the same op on MKL's packed sgemm (the slot `mkl`, MKLGemm: CPUs
              without AVX-512)
    ordered   fp32 only: the same op as pack() chooses (the opt-in OrderedGemm: its ordered
              AVX-512 kernel where that gives F.linear's bits, else MKL's packed sgemm)
    onednn    torch.ops.mkldnn._linear_pointwise on a weight prepacked for oneDNN (kernels=cpu's
              onednn slot, eager, and what inductor's freezing calls, compile=true)
    F.linear  ATen's linear on the dense weight (kernels=torch)

over `--weights` copies of the weight called in turn (4: a layer's weights stay in L3, as in
bench_llama; the "cold" row per preset runs every linear of every layer in turn, the step's
whole weight stream, as a decode step does), with GB/s = weight bytes / time; in fp32 a
second table gives each one's error against the float64 product (which order sums closer). The
implementations take turns round by round (so a change of the machine's load falls on all of
them alike) and each reports its median round. Correctness is
the kernel's tests (tests/kernels/test_cpu_gemm.py); here each result is also checked against
F.linear in fp32 (max error relative to the largest output) before it is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lab.kernels import cpu_gemm, cpu_sgemm

SHAPES = {  # name -> [(linear, N, K)], from lab/conf/model/bench_*.yaml
    "bench_llama": [("qkv", 768, 512), ("o", 512, 512), ("gate_up", 2816, 512),
                    ("down", 512, 1408), ("lm_head", 16384, 512)],
    "bench_qwen3_06b": [("qkv", 4096, 1024), ("o", 1024, 2048), ("gate_up", 6144, 1024),
                        ("down", 1024, 3072), ("lm_head", 16384, 1024)],
}
LAYERS = {"bench_llama": 4, "bench_qwen3_06b": 12}


def _median_times(fns: dict, calls: int, repeats: int) -> dict[str, float]:
    """Seconds per call of each of `fns` (each runs `calls` calls): two warm-up rounds, then
    `repeats` rounds, each timing every implementation once, in turn (so a change of the
    machine's load falls on all of them alike); the median round of each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats + 2):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            if round_ >= 2:
                times[name].append((time.perf_counter() - t) / calls)
    return {name: statistics.median(ts) for name, ts in times.items()}


def lab_columns(dtype: torch.dtype) -> tuple[str, ...]:
    """lab's columns, its default first: amx (bf16); blocked (AVX-512 builds), mkl, ordered."""
    if dtype == torch.bfloat16:
        return ("amx",)
    return ("blocked", "mkl", "ordered") if cpu_sgemm.has_ordered() else ("mkl", "ordered")


def _lab_impls(weights: list[torch.Tensor]) -> dict:
    """lab's C++ GEMMs for these weights (lab_columns)."""
    if weights[0].dtype == torch.bfloat16:
        amx = [cpu_gemm.pack(w) for w in weights]
        return {"amx": lambda x, i: cpu_gemm.gemm(x, amx[i], weights[i])}
    packs = {"blocked": cpu_sgemm.BlockedGemm().pack, "mkl": cpu_sgemm.pack_mkl,
             "ordered": cpu_sgemm.pack}
    packed = {name: [packs[name](w) for w in weights] for name in lab_columns(torch.float32)}
    return {name: (lambda x, i, ps=ps: cpu_sgemm.gemm(x, ps[i], weights[i]))
            for name, ps in packed.items()}


def _impls(weights: list[torch.Tensor], rows: int) -> dict:
    """Every implementation timed (module docstring), lab's default first."""
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    return {
        **_lab_impls(weights),
        "onednn": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none",
                                                                  [], ""),
        "F.linear": lambda x, i: F.linear(x, weights[i]),
    }


def bench_linear(n: int, k: int, rows: int, copies: int, repeats: int,
                 dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Seconds per call of each implementation, `copies` weights [n, k] called in turn."""
    weights = [torch.randn(n, k).to(dtype) for _ in range(copies)]
    x = torch.randn(rows, k).to(dtype)
    want = F.linear(x.float(), weights[0].float())
    impls = _impls(weights, rows)
    for name, fn in impls.items():
        err = (fn(x, 0).float() - want).abs().max() / want.abs().max()
        if err > 1e-2:
            raise AssertionError(f"{name}: relative error {err:.2e} for [{n}, {k}] x {rows} rows")
    return _median_times({name: lambda fn=fn: [fn(x, i) for i in range(copies)]
                          for name, fn in impls.items()}, copies, repeats)


def bench_step(preset: str, rows: int, repeats: int,
               dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Seconds per decode step's linears (every layer's, LM head excluded), weights cold."""
    shapes = SHAPES[preset][:-1]
    layers = [[torch.randn(n, k).to(dtype) for _, n, k in shapes]
              for _ in range(LAYERS[preset])]
    xs = [torch.randn(rows, k).to(dtype) for _, _, k in shapes]
    flat = [w for layer in layers for w in layer]

    def step(fn) -> None:
        for i in range(len(flat)):
            fn(xs[i % len(shapes)], i)

    return _median_times({name: lambda fn=fn: step(fn) for name, fn in _impls(flat, rows).items()},
                         1, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--weights", type=int, default=4, help="weight copies called in turn")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--presets", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="bf16: the AMX kernel; fp32: lab's blocked kernel, MKL's packed "
                        "sgemm and the ordered kernel, then their errors against float64")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if dtype == torch.bfloat16 and not cpu_gemm.available():
        raise SystemExit("the AMX kernel is not available here (no AMX-BF16, or no compiler)")
    if dtype == torch.float32 and not cpu_sgemm.available():
        raise SystemExit("MKL's packed sgemm is not available here (no MKL, or no compiler)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}; us per "
          "call (GB/s of weight read); ratios: time / time")
    names = [*lab_columns(dtype), "onednn", "F.linear"]
    ratios = "  ".join(f"{a}/{b}" for a, b in _ratios(names))
    print(f"{'preset':16s} {'linear':8s} {'[N, K]':>12s} {'rows':>5s}"
          + "".join(f" {n:>15s}" for n in names) + f"  {ratios}")
    for preset in args.presets:
        for rows in args.rows:
            for name, n, k in SHAPES[preset]:
                t = bench_linear(n, k, rows, args.weights, args.repeats, dtype)
                _row(preset, name, f"[{n}, {k}]", rows, t, n * k * dtype.itemsize)
            t = bench_step(preset, rows, max(3, args.repeats // 4), dtype)
            size = sum(n * k * dtype.itemsize for _, n, k in SHAPES[preset][:-1]) * LAYERS[preset]
            _row(preset, "cold", f"{LAYERS[preset]} layers", rows, t, size)
    if dtype == torch.float32:
        print_accuracy(args.presets, args.rows, names)


def accuracy(n: int, k: int, rows: int, names: list[str]) -> dict[str, float]:
    """Each fp32 implementation's max |y - y64| / max |y64| against the float64 product, on a
    weight scaled as a model's (N(0, 1/K)) and N(0, 1) rows."""
    g = torch.Generator().manual_seed(n + k + rows)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    x = torch.randn(rows, k, generator=g)
    want = x.double() @ w.double().T
    impls = _impls([w], rows)
    return {name: ((impls[name](x, 0).double() - want).abs().max() / want.abs().max()).item()
            for name in names}


def print_accuracy(presets: list[str], rows: list[int], names: list[str]) -> None:
    """accuracy() of every fp32 linear of `presets` at each row count, one table."""
    print("\nerror against the float64 product: max |y - y64| / max |y64|")
    print(f"{'preset':16s} {'linear':8s} {'[N, K]':>12s} {'rows':>5s}"
          + "".join(f" {n:>10s}" for n in names))
    for preset in presets:
        for r in rows:
            for name, n, k in SHAPES[preset]:
                err = accuracy(n, k, r, names)
                print(f"{preset:16s} {name:8s} {f'[{n}, {k}]':>12s} {r:5d}"
                      + "".join(f" {err[m]:10.2e}" for m in names))


def _ratios(names: list[str]) -> list[tuple[str, str]]:
    """The columns compared: lab's default against oneDNN, F.linear and (fp32) MKL's packing."""
    pairs = [(names[0], "onednn"), (names[0], "F.linear")]
    return pairs + ([(names[0], "mkl")] if "mkl" in names[1:] else [])


def _row(preset: str, name: str, shape: str, rows: int, t: dict[str, float], nbytes: int):
    cells = "".join(f" {t[k] * 1e6:8.1f} ({nbytes / t[k] / 1e9:3.0f})" for k in t)
    ratios = "".join(f"  {t[a] / t[b]:{len(a) + len(b) + 1}.2f}" for a, b in _ratios(list(t)))
    print(f"{preset:16s} {name:8s} {shape:>12s} {rows:5d}{cells}{ratios}")


if __name__ == "__main__":
    main()
