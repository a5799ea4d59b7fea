// fp32 GEMM for decode-sized batches through MKL's packed sgemm: y = x W^T (+ b), x [M, K] fp32,
// W [N, K] fp32 packed once (pack()), y [M, N] fp32. Built by lab/kernels/cpu_sgemm.py (which
// holds the PyTorch reference, F.linear, it is tested against).
//
// Why: fp32 has no AMX, so a decode step's fp32 linears run on the FMA units, and at 16 rows
// MKL's sgemm on a weight it packed once beats oneDNN's prepacked matmul (what inductor's
// freezing and lab's eager linears used): bench_llama's qkv / o / gate_up / down / LM head
// 41 / 31 / 178 / 80 / 1085 us against 59 / 48 / 224 / 101 / 1182 us (2-core AVX-512 Xeon,
// from cache; python -m lab.bench.cpu_gemm --dtype float32). MKL's packed weight is an mkldnn
// tensor in torch (torch.ops.mkl._mkl_reorder_linear_weight), which cannot enter a compiled
// graph; here the packed bytes live in a plain tensor, so a compiled graph calls this op with
// them as a constant, as it calls lab_cpu::gemm_bf16.
//
// MKL packs B (= W^T) for a GEMM shape; the packed B serves every M (MKL's packed format of B
// depends on n and k; tests/kernels/test_cpu_sgemm.py checks M = 1..MAX_M against F.linear).
// From MAX_M rows on (prefill) at::linear on the dense weight is as fast or faster.
//
// MKL's packed-GEMM entry points come from libtorch_cpu, which links MKL statically and
// exports them (LP64: MKL_INT is int).

#include <ATen/ATen.h>
#include <torch/python.h>  // pybind11 + Tensor casters; not torch/extension.h (~7 s more to build)
#include <torch/library.h>

extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc);
}

namespace {

constexpr int ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, PACKED = 151, B_MATRIX = 162;
constexpr int64_t PACK_M = 16;   // the M the weight is packed for (a decode batch)
constexpr int64_t MAX_M = 128;   // rows from which at::linear is as fast (lab/bench/cpu_gemm.py)

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu() &&
              w.is_contiguous(), "weight must be a contiguous 2-D fp32 CPU tensor [N, K]");
  TORCH_CHECK(w.size(0) < INT32_MAX && w.size(1) < INT32_MAX, "weight too large for MKL's LP64");
}

}  // namespace

// W [N, K] -> MKL's packed B (= W^T), as fp32 words
at::Tensor pack(at::Tensor weight) {
  check_weight(weight);
  const int n = weight.size(0), k = weight.size(1);
  const size_t bytes = cblas_sgemm_pack_get_size(B_MATRIX, PACK_M, n, k);
  auto out = at::empty({static_cast<int64_t>((bytes + 3) / 4)}, weight.options());
  cblas_sgemm_pack(ROW_MAJOR, B_MATRIX, TRANS, PACK_M, n, k, 1.0f, weight.data_ptr<float>(), k,
                   out.data_ptr<float>());
  return out;
}

// y = x W^T (+ bias): x [M, K] fp32, packed = pack(W), W the dense weight (from MAX_M rows on)
at::Tensor gemm(at::Tensor x, at::Tensor packed, at::Tensor weight, std::optional<at::Tensor> bias) {
  check_weight(weight);
  const int64_t N = weight.size(0), K = weight.size(1), M = x.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat,
              "x must be fp32 [M, ", K, "] (the weight's K)");
  const size_t bytes = cblas_sgemm_pack_get_size(B_MATRIX, PACK_M, N, K);
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 1 &&
              packed.numel() == static_cast<int64_t>((bytes + 3) / 4), "packed must be pack(weight)");
  TORCH_CHECK(!bias || (bias->numel() == N && bias->scalar_type() == at::kFloat),
              "bias must be fp32 [N]");
  if (M >= MAX_M) return at::linear(x, weight, bias);
  // MKL reads rows lda >= K apart: other layouts (a broadcast row: stride 0) are copied first
  const auto xc = x.stride(1) == 1 && x.stride(0) >= K ? x : x.contiguous();
  // C starts as the bias and the product is added to it (beta 1), as F.linear's addmm does
  auto y = at::empty({M, N}, x.options());  // a new tensor: never the bias itself (M = 1)
  if (bias) y.copy_(bias->reshape({1, N}).expand({M, N}));
  if (M == 0) return y;
  cblas_sgemm_compute(ROW_MAJOR, NO_TRANS, PACKED, M, N, K, xc.data_ptr<float>(), xc.stride(0),
                      packed.data_ptr<float>(), K, bias ? 1.0f : 0.0f, y.data_ptr<float>(), N);
  return y;
}

// the dispatcher's op (C++ kernel: a compiled graph calls it without going through Python)
TORCH_LIBRARY_FRAGMENT(lab_cpu, m) {
  m.def("gemm_fp32(Tensor x, Tensor packed, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(lab_cpu, CPU, m) { m.impl("gemm_fp32", &gemm); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "W [N, K] fp32 -> MKL's packed W^T (fp32 words)");
  m.def("gemm", &gemm, "y = x W^T (+ bias) through the packed weight");
}
