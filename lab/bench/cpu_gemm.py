"""The CPU's GEMMs at decode batch sizes: lab's kernels against oneDNN, one process.

    python -m lab.bench.cpu_gemm                       # bench_llama and bench_qwen3_06b shapes
    python -m lab.bench.cpu_gemm --rows 1 16 64 256    # row counts (tokens in the step)
    python -m lab.bench.cpu_gemm --dtype float32       # fp32: lab's op (cpu_sgemm) and MKL's

For each linear of the two bench presets (qkv, o, gate_up, down, LM head: [N, K] from their
configs) and each row count, the median time of one call of

    amx       bf16: lab/kernels/cpu_gemm.py (packed once; above 64 rows it is oneDNN inside
              the op); fp32: lab/kernels/cpu_sgemm.py as pack() chooses (its ordered
              AVX-512 kernel where that gives F.linear's bits, else MKL's packed sgemm; from
              128 rows at::linear inside the op)
    mkl       fp32 only: the same op on MKL's packed sgemm (cpu_sgemm.pack_mkl), side by side
    onednn    torch.ops.mkldnn._linear_pointwise on a weight prepacked for oneDNN (what lab's
              linears ran before, eager, and what inductor's freezing calls, compile=true)
    F.linear  ATen's bf16 linear on the dense weight

over `--weights` copies of the weight called in turn (4: a layer's weights stay in L3, as in
bench_llama; the "cold" row per preset runs every linear of every layer in turn, the step's
whole weight stream, as a decode step does), with GB/s = weight bytes / time. Correctness is
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


def _median_time(fn, calls: int, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times)


def _impls(weights: list[torch.Tensor], rows: int):
    kernel = cpu_gemm if weights[0].dtype == torch.bfloat16 else cpu_sgemm
    amx = [kernel.pack(w) for w in weights]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    impls = {
        "amx": lambda x, i: kernel.gemm(x, amx[i], weights[i]),
        "onednn": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none",
                                                                  [], ""),
        "F.linear": lambda x, i: F.linear(x, weights[i]),
    }
    if kernel is cpu_sgemm:
        mkl = [cpu_sgemm.pack_mkl(w) for w in weights]
        impls["mkl"] = lambda x, i: cpu_sgemm.gemm(x, mkl[i], weights[i])
    return impls


def bench_linear(n: int, k: int, rows: int, copies: int, repeats: int,
                 dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Seconds per call of each implementation, `copies` weights [n, k] called in turn."""
    weights = [torch.randn(n, k).to(dtype) for _ in range(copies)]
    x = torch.randn(rows, k).to(dtype)
    want = F.linear(x.float(), weights[0].float())
    out = {}
    for name, fn in _impls(weights, rows).items():
        err = (fn(x, 0).float() - want).abs().max() / want.abs().max()
        if err > 1e-2:
            raise AssertionError(f"{name}: relative error {err:.2e} for [{n}, {k}] x {rows} rows")
        out[name] = _median_time(lambda fn=fn: [fn(x, i) for i in range(copies)], copies, repeats)
    return out


def bench_step(preset: str, rows: int, repeats: int,
               dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Seconds per decode step's linears (every layer's, LM head excluded), weights cold."""
    shapes = SHAPES[preset][:-1]
    layers = [[torch.randn(n, k).to(dtype) for _, n, k in shapes]
              for _ in range(LAYERS[preset])]
    xs = [torch.randn(rows, k).to(dtype) for _, _, k in shapes]
    flat = [w for layer in layers for w in layer]
    out = {}
    for name, fn in _impls(flat, rows).items():
        def step(fn=fn):
            for i in range(len(flat)):
                fn(xs[i % len(shapes)], i)
        out[name] = _median_time(step, 1, repeats)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--weights", type=int, default=4, help="weight copies called in turn")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--presets", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="bf16: the AMX kernel; fp32: MKL's packed sgemm (the amx column)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if dtype == torch.bfloat16 and not cpu_gemm.available():
        raise SystemExit("the AMX kernel is not available here (no AMX-BF16, or no compiler)")
    if dtype == torch.float32 and not cpu_sgemm.available():
        raise SystemExit("MKL's packed sgemm is not available here (no MKL, or no compiler)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}; us per "
          "call (GB/s of weight read)")
    mkl = "mkl" if dtype == torch.float32 else ""
    print(f"{'preset':16s} {'linear':8s} {'[N, K]':>12s} {'rows':>5s}"
          f" {'amx':>15s} {'onednn':>15s} {'F.linear':>15s} {mkl:>15s}  amx/onednn"
          + ("  amx/mkl" if mkl else ""))
    for preset in args.presets:
        for rows in args.rows:
            for name, n, k in SHAPES[preset]:
                t = bench_linear(n, k, rows, args.weights, args.repeats, dtype)
                _row(preset, name, f"[{n}, {k}]", rows, t, n * k * dtype.itemsize)
            t = bench_step(preset, rows, max(3, args.repeats // 4), dtype)
            size = sum(n * k * dtype.itemsize for _, n, k in SHAPES[preset][:-1]) * LAYERS[preset]
            _row(preset, "cold", f"{LAYERS[preset]} layers", rows, t, size)


def _row(preset: str, name: str, shape: str, rows: int, t: dict[str, float], nbytes: int):
    cells = "".join(f" {t[k] * 1e6:8.1f} ({nbytes / t[k] / 1e9:3.0f})" for k in
                    ("amx", "onednn", "F.linear", "mkl") if k in t)
    ratios = f"  {t['amx'] / t['onednn']:.2f}" + (f"  {t['amx'] / t['mkl']:.2f}" if "mkl" in t else "")
    print(f"{preset:16s} {name:8s} {shape:>12s} {rows:5d}{cells}{ratios}")


if __name__ == "__main__":
    main()
