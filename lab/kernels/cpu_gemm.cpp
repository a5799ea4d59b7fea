// bf16 GEMM for decode-sized batches on the CPU's AMX tiles: y = x W^T (+ b), x [M, K] bf16,
// W [N, K] bf16 prepacked once, y [M, N] bf16 (fp32 accumulation, rounded once). Built by
// lab/kernels/cpu_gemm.py (which holds the PyTorch reference, F.linear, it is tested against).
//
// Why: at M = 16 a step's GEMMs stream their weights once and do little arithmetic, so the
// time is how fast the weights arrive. This loop, one contiguous weight stream per thread and
// one AMX tile product per 1 KiB of weight, reads them faster than oneDNN's prepacked matmul
// (python -m lab.bench.cpu_gemm; experiments/results/2026-12-04-cpu-kernels-amx.md).
//
// Packed layout (pack()): the N columns in groups of 64 (4 tiles of 16; the last group may hold
// fewer), and within a group, for each 32-deep slice of K, its tiles back to back, each tile the
// VNNI layout AMX reads, [16 pairs of k][16 columns][2]:
//
//   packed = | group 0: k 0-31: tile0 tile1 tile2 tile3 | k 32-63: tile0 .. | ... | group 1: ...
//   tile t of group g, slice s, row p, column n, element e = W[64g + 16t + n][32s + 2p + e]
//
// A thread takes whole groups (at::parallel_for): for each, C tiles 0..3 (m rows x 16 fp32)
// += A (m x 32 rows of x) . B (the slice's tiles), over K, then rows of C are rounded to bf16
// (+ bias in fp32). M above 16 runs in 16-row chunks inside the group (its weights stay in
// L2); above MAX_M rows (prefill) the weights would be re-read too often and oneDNN's matmul
// (at::linear on the dense weight) is faster: it takes those.
//
// Needs AMX-BF16 and AVX512-BF16 at compile time (-march=native on such a CPU) and the
// kernel's permission for tile data (arch_prctl, asked once); elsewhere amx_ready() is false
// and the Python side never packs.

// ATen's core and the ops used, not ATen/ATen.h (every op's header: a slower build)
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>  // the dispatcher (not pybind11: torch/python.h doubled the build)

#include <ATen/Parallel.h>

#include <algorithm>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__linux__)
#define LAB_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr int64_t TN = 16;     // columns per tile
constexpr int64_t TK = 32;     // k per tile (16 pairs)
constexpr int64_t GROUP = 4;   // tiles per group: C tiles 0..3
constexpr int64_t TILE = TK * TN;  // elements per packed tile (1 KiB)
constexpr int64_t MAX_M = 64;  // rows above which at::linear is faster (lab/bench/cpu_gemm.py)

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu(),
              "weight must be a 2-D bf16 CPU tensor [N, K]");
  TORCH_CHECK(w.size(0) % TN == 0 && w.size(1) % TK == 0, "weight [N, K] needs N % 16 == 0 and "
              "K % 32 == 0, got [", w.size(0), ", ", w.size(1), "]");
}

#ifdef LAB_AMX
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool request_tiles() {  // Linux gives a process AMX tile state only when asked
  constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

// tiles 0-3: C, m x 16 fp32; 4: A, m x 32 bf16; 5, 6: B, 16 pairs x 16 columns
void configure(int m) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = m;
    cfg.colsb[t] = TN * 4;
  }
  cfg.rows[4] = m;
  cfg.colsb[4] = TK * 2;
  cfg.rows[5] = cfg.rows[6] = TK / 2;
  cfg.colsb[5] = cfg.colsb[6] = TN * 4;
  _tile_loadconfig(&cfg);
}

// C (NT tiles, m rows) = x[m, K] . the group's slices; c [m][64] fp32
template <int NT>
void group_product(const at::BFloat16* x, int64_t ldx, const at::BFloat16* w, int64_t KB,
                   float* c) {
  _tile_zero(0);
  if (NT > 1) _tile_zero(1);
  if (NT > 2) _tile_zero(2);
  if (NT > 3) _tile_zero(3);
  for (int64_t kb = 0; kb < KB; ++kb) {
    const at::BFloat16* b = w + kb * NT * TILE;
    _tile_loadd(4, x + kb * TK, ldx * 2);
    _tile_loadd(5, b, TN * 4);
    _tile_dpbf16ps(0, 4, 5);
    if (NT > 1) { _tile_loadd(6, b + TILE, TN * 4); _tile_dpbf16ps(1, 4, 6); }
    if (NT > 2) { _tile_loadd(5, b + 2 * TILE, TN * 4); _tile_dpbf16ps(2, 4, 5); }
    if (NT > 3) { _tile_loadd(6, b + 3 * TILE, TN * 4); _tile_dpbf16ps(3, 4, 6); }
  }
  constexpr int ldc = GROUP * TN * 4;
  _tile_stored(0, c, ldc);
  if (NT > 1) _tile_stored(1, c + TN, ldc);
  if (NT > 2) _tile_stored(2, c + 2 * TN, ldc);
  if (NT > 3) _tile_stored(3, c + 3 * TN, ldc);
}

// rows of c (+ bias, bf16 widened to fp32) rounded to bf16 into y
void store_rows(const float* c, int m, int64_t cols, const at::BFloat16* bias, at::BFloat16* y,
                int64_t ldy) {
  for (int r = 0; r < m; ++r)
    for (int64_t i = 0; i < cols; i += 16) {
      __m512 v = _mm512_loadu_ps(c + r * GROUP * TN + i);
      if (bias) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + i));
        v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * ldy + i),
                          (__m256i)_mm512_cvtneps_pbh(v));
    }
}

void amx_gemm(const at::BFloat16* x, int64_t ldx, int64_t M, int64_t K, const at::BFloat16* w,
              int64_t N, const at::BFloat16* bias, at::BFloat16* y) {
  const int64_t KB = K / TK, tiles = N / TN, groups = (tiles + GROUP - 1) / GROUP;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float c[TN * GROUP * TN];
    int configured = -1;  // tile configuration is per thread
    for (int64_t g = begin; g < end; ++g) {
      const int64_t nt = std::min(GROUP, tiles - g * GROUP);
      const at::BFloat16* wg = w + g * GROUP * KB * TILE;
      for (int64_t m0 = 0; m0 < M; m0 += TN) {  // the group's weights stay in L2 meanwhile
        const int m = static_cast<int>(std::min(TN, M - m0));
        if (m != configured) configure(configured = m);
        const at::BFloat16* xm = x + m0 * ldx;
        switch (nt) {
          case 4: group_product<4>(xm, ldx, wg, KB, c); break;
          case 3: group_product<3>(xm, ldx, wg, KB, c); break;
          case 2: group_product<2>(xm, ldx, wg, KB, c); break;
          default: group_product<1>(xm, ldx, wg, KB, c); break;
        }
        store_rows(c, m, nt * TN, bias ? bias + g * GROUP * TN : nullptr,
                   y + m0 * N + g * GROUP * TN, N);
      }
    }
    _tile_release();
  });
}
#endif

}  // namespace

bool amx_ready() {
#ifdef LAB_AMX
  static const bool ok = request_tiles();
  return ok;
#else
  return false;
#endif
}

// W [N, K] -> the packed layout above, flat [N * K]
at::Tensor pack(at::Tensor weight) {
  check_weight(weight);
  const int64_t N = weight.size(0), K = weight.size(1), KB = K / TK, tiles = N / TN;
  const auto w = weight.contiguous();
  auto out = at::empty({N * K}, w.options());
  const at::BFloat16* src = w.data_ptr<at::BFloat16>();
  at::BFloat16* dst = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, (tiles + GROUP - 1) / GROUP, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t nt = std::min(GROUP, tiles - g * GROUP);
      for (int64_t kb = 0; kb < KB; ++kb)
        for (int64_t t = 0; t < nt; ++t) {
          at::BFloat16* tile = dst + g * GROUP * KB * TILE + (kb * nt + t) * TILE;
          for (int64_t p = 0; p < TK / 2; ++p)
            for (int64_t n = 0; n < TN; ++n)
              for (int64_t e = 0; e < 2; ++e)
                tile[(p * TN + n) * 2 + e] = src[(g * GROUP * TN + t * TN + n) * K + kb * TK + 2 * p + e];
        }
    }
  });
  return out;
}

// y = x W^T (+ bias): x [M, K] bf16 (rows contiguous), packed = pack(W), W the dense weight
// (used above MAX_M rows), bias [N] or None
at::Tensor gemm(at::Tensor x, at::Tensor packed, at::Tensor weight,
                   std::optional<at::Tensor> bias) {
  check_weight(weight);
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kBFloat16,
              "x must be bf16 [M, ", K, "] (the weight's K)");
  TORCH_CHECK(packed.numel() == N * K && packed.scalar_type() == at::kBFloat16,
              "packed must be pack(weight)");
  TORCH_CHECK(!bias || (bias->numel() == N && bias->dim() == 1 && bias->is_contiguous() &&
                        bias->scalar_type() == at::kBFloat16), "bias must be bf16 [N]");
#ifdef LAB_AMX
  TORCH_CHECK(amx_ready(), "this process may not use AMX tiles (arch_prctl refused)");
  const int64_t M = x.size(0);
  if (M > MAX_M) return at::linear(x, weight, bias);
  const auto xc = x.stride(1) == 1 ? x : x.contiguous();
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  amx_gemm(xc.data_ptr<at::BFloat16>(), xc.stride(0), M, K, packed.data_ptr<at::BFloat16>(), N,
           bias ? bias->data_ptr<at::BFloat16>() : nullptr, y.data_ptr<at::BFloat16>());
  return y;
#else
  TORCH_CHECK(false, "cpu_gemm was built without AMX-BF16 (this CPU or compiler lacks it)");
#endif
}

// the dispatcher's op (C++ kernel: a compiled graph calls it without going through Python)
TORCH_LIBRARY_FRAGMENT(lab_cpu, m) {
  m.def("gemm_bf16(Tensor x, Tensor packed, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(lab_cpu, CPU, m) { m.impl("gemm_bf16", &gemm); }

// this build's own op namespace (its module name, hash included: two builds never collide); the
// extra macro level expands TORCH_EXTENSION_NAME before TORCH_LIBRARY pastes it
#define LAB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

LAB_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("amx_ready() -> bool", &amx_ready);  // AMX-BF16 compiled in and this process may use it
  m.def("pack(Tensor weight) -> Tensor", &pack);  // W [N, K] bf16 -> the AMX layout (flat [N * K])
  // y = x W^T (+ bias) through the packed weight
  m.def("gemm(Tensor x, Tensor packed, Tensor weight, Tensor? bias) -> Tensor", &gemm);
}
