// fp32 GEMM for decode-sized batches on a weight packed once: y = x W^T (+ b), x [M, K] fp32,
// W [N, K] fp32, y [M, N] fp32. Built by lab/kernels/cpu_sgemm.py (which holds the PyTorch
// reference, F.linear, it is tested against).
//
// Why: fp32 has no AMX, so a decode step's fp32 linears run on the FMA units; at 16 rows an fp32
// weight element costs 16 FMA lanes, and two cores at one 512-bit FMA a cycle consume weights
// about as fast as DRAM delivers them, so a kernel's every loss shows (the rates of MKL's
// packed sgemm, oneDNN and F.linear: experiments/results/2026-12-05-cpu-fp32-ordered.md).
//
// Two kernels behind one op, the packed weight saying which (a 16-word header, then the data):
//
// - ORDERED (AVX-512): lab's own kernel, 8 rows x 48 columns of accumulators, the weight
//   packed as [N/16][K][16] (one contiguous stream per column block). Its sums over k follow a
//   layout: K in `parts` equal parts, each part in blocks of `kc` (or `kc` balanced); a block
//   is an FMA chain from zero, a part chains its blocks (part 0 starting at the bias), and the
//   parts are added in order. pack_layout() packs a given layout: kernels=cpu's default fp32
//   slot (BlockedGemm) packs one part in blocks of 128, an order chosen for speed and accuracy
//   (closer to float64 than F.linear's on the bench shapes), the same at any thread and row
//   count. pack() (the opt-in slot OrderedGemm) instead imitates MKL's sgemm (F.linear, and so
//   transformers), which for 16 to 127 rows sums in 2 parts at 2 threads, blocks of 384 (256
//   where a part is 512), found by emulating candidate orders in float64 against F.linear's
//   bits: it tries the candidate layouts on this weight at this thread count and keeps the
//   first whose output equals at::linear's bit for bit on probe rows (16 and 127), else packs
//   for MKL. Below 16 rows MKL changes kernels (no layout matches); the same layout runs there.
// - MKL: MKL's packed sgemm (cblas_sgemm_compute on a B packed once): what pack_mkl() packs
//   (kernels=cpu's fp32 slot for CPUs without AVX-512), and what pack() falls back to where no
//   candidate matches (another thread count, a K MKL splits otherwise: bench_llama's 1408) or
//   the CPU has no AVX-512. MKL's entry points come from libtorch_cpu, which links MKL
//   statically and exports them (LP64: MKL_INT is int).
//
// Side by side (one process, 16 rows, the bench presets' shapes; 2-core AVX-512 Xeon):
// experiments/results/2026-12-05-cpu-fp32-ordered.md (the kernel's tuning) and
// experiments/results/2026-12-06-fp32-blocked.md (the blocked default). From MAX_M rows on
// (prefill) at::linear on the dense weight is as fast or faster, and is F.linear itself.
//
// Built without -ffast-math (cpu_sgemm.py): the order of the adds is the point.

// ATen's core and the ops used, not ATen/ATen.h (every op's header: a slower build)
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>  // the dispatcher (not pybind11: torch/python.h doubled the build)

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc);
}

namespace {

constexpr int ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, PACKED = 151, B_MATRIX = 162;
constexpr int64_t PACK_M = 16;   // the M MKL's B is packed for (a decode batch)
constexpr int64_t MAX_M = 128;   // rows from which at::linear is as fast (lab/bench/cpu_gemm.py)
constexpr int64_t HEADER = 16;   // words before the packed data (64 bytes: keeps its alignment)
constexpr int32_t MAGIC = 0x6c616266;  // "labf"
enum Kind : int32_t { MKL = 1, ORDERED = 2 };
// The ordered kernel's tile: 8 rows x 3 column blocks of 16 = 24 accumulators, 3 weight vectors
// and a broadcast x: 28 of the 32 zmm registers (3 loads + 8 broadcasts per 24 FMAs); the
// fastest of the tiles tried (experiments/results/2026-12-05-cpu-fp32-ordered.md, "Tuning").
constexpr int64_t TILE_ROWS = 8, COLS = 16;  // rows a pass, columns a block (one zmm)
constexpr int TILE_NB = 3;                   // column blocks a tile
constexpr int64_t TILE_COLS = TILE_NB * COLS;

// the packed weight's header (its first HEADER words, as int32)
struct Header {
  int32_t magic, kind, n, k, parts, kc, balanced, threads;
};
static_assert(sizeof(Header) <= HEADER * sizeof(float), "header fits its words");

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu() &&
              w.is_contiguous(), "weight must be a contiguous 2-D fp32 CPU tensor [N, K]");
  TORCH_CHECK(w.size(0) < INT32_MAX && w.size(1) < INT32_MAX, "weight too large for MKL's LP64");
}

int64_t mkl_words(int64_t n, int64_t k) {
  return static_cast<int64_t>((cblas_sgemm_pack_get_size(B_MATRIX, PACK_M, n, k) + 3) / 4);
}

int64_t ordered_words(int64_t n, int64_t k) { return (n + COLS - 1) / COLS * k * COLS; }

Header header_of(const at::Tensor& packed) {
  Header h{};
  TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 1 && packed.is_contiguous()
              && packed.numel() >= HEADER, "packed must be pack(weight)");
  std::memcpy(&h, packed.data_ptr<float>(), sizeof(h));
  return h;
}

// ---------------------------------------------------------------------------------------------
// The summation layout: [lo, hi) ranges of k, per part
struct Layout {
  int parts, kc;
  bool balanced;
};

void check_layout(int64_t k, int64_t parts, int64_t kc) {
  TORCH_CHECK(parts >= 1 && k % parts == 0, "parts must divide K (", k, "), got ", parts);
  TORCH_CHECK(kc >= 1, "kc must be >= 1, got ", kc);
}

// the layout's block bounds over K, per part: part p is [p K/parts, (p+1) K/parts) in blocks of
// `kc` (the remainder last), or (balanced) as many as `kc` needs, of equal size rounded up to
// 16; bounds[p] = {lo of block 0, lo of block 1, ..., hi of the last}
std::vector<std::vector<int64_t>> layout_bounds(int64_t k, const Layout& l) {
  const int64_t len = k / l.parts;
  int64_t size = l.kc;
  if (l.balanced) {
    const int64_t nb = (len + l.kc - 1) / l.kc;
    size = ((len + nb - 1) / nb + 15) / 16 * 16;
  }
  std::vector<std::vector<int64_t>> out(l.parts);
  for (int64_t p = 0; p < l.parts; ++p) {
    for (int64_t lo = p * len; lo < (p + 1) * len; lo += size) out[p].push_back(lo);
    out[p].push_back((p + 1) * len);
  }
  return out;
}

// the candidate layouts pack() tries, most likely first (what MKL was seen to do at 1 and 2
// threads on AVX-512: 384-blocks, a 512-long part as two 256-blocks)
std::vector<Layout> candidates(int64_t k) {
  std::vector<Layout> out;
  for (int parts : {2, 1, 4})
    for (const Layout& l : {Layout{parts, 384, false}, Layout{parts, 384, true},
                            Layout{parts, 256, false}, Layout{parts, 512, false},
                            Layout{parts, 192, false}, Layout{parts, 128, false}})
      if (k % parts == 0 && k / parts >= 16) out.push_back(l);
  return out;
}

#ifdef __AVX512F__
constexpr bool HAVE_ORDERED = true;
// Software prefetch PF_K k's (cache lines of a column block) ahead into L1: without it the
// weight stream and the FMAs take turns (1/(1/DRAM + 1/FMA) of the two rates); the distances
// tried: experiments/results/2026-12-05-cpu-fp32-ordered.md, "Tuning".
constexpr int64_t PF_K = 32;
// k's a row pass runs before the next pass takes the same weights (then still in L1); the
// accumulators carry over in memory, so the FMA chains and the sums are the same (the sizes
// tried: experiments/results/2026-12-05-cpu-fp32-ordered.md, "Tuning")
constexpr int64_t SUB_K = 64;

// acc[r][j] = sum over k in [k0, k1) of x[r, k] * W[k, 16j..16j+15], one FMA chain from zero
// per lane; w points at the tile's first column block ([K][16]), the next one wstride further
template <int R, int NB>
inline void block_dot(const float* x, int64_t ldx, const float* w, int64_t wstride, int64_t k0,
                      int64_t k1, const float* resume, __m512 (&acc)[TILE_ROWS][TILE_NB]) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j)
      acc[r][j] = resume ? _mm512_loadu_ps(resume + r * TILE_COLS + j * COLS) : _mm512_setzero_ps();
  for (int64_t k = k0; k < k1; ++k) {
    __m512 wv[NB];
    for (int j = 0; j < NB; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(w + j * wstride + (k + PF_K) * COLS), _MM_HINT_T0);
      wv[j] = _mm512_loadu_ps(w + j * wstride + k * COLS);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + k]);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_fmadd_ps(xb, wv[j], acc[r][j]);
    }
  }
}

// chain[r] (first block: = start[r], or 0) += this block's sums, for R rows from row r0
template <int R, int NB>
void block_pass(const float* x, int64_t ldx, const float* w, int64_t wstride, int64_t k0,
                int64_t k1, bool resume, bool finish, float* carry, bool first, const float* start,
                float* chain) {
  __m512 acc[TILE_ROWS][TILE_NB];
  block_dot<R, NB>(x, ldx, w, wstride, k0, k1, resume ? carry : nullptr, acc);
  if (!finish) {
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NB; ++j) _mm512_storeu_ps(carry + r * TILE_COLS + j * COLS, acc[r][j]);
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j) {
      float* c = chain + r * TILE_COLS + j * COLS;
      const __m512 base = first ? (start ? _mm512_loadu_ps(start + j * COLS) : acc[r][j])
                                : _mm512_loadu_ps(c);
      _mm512_storeu_ps(c, first && !start ? acc[r][j] : _mm512_add_ps(base, acc[r][j]));
    }
}

using PassFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, bool,
                        bool, float*, bool, const float*, float*);

template <int NB, int... R>
PassFn pick_pass(int rows, std::integer_sequence<int, R...>) {
  PassFn fns[] = {&block_pass<R + 1, NB>...};
  return fns[rows - 1];
}

template <int... NB>
PassFn pick_nb(int nb, int rows, std::integer_sequence<int, NB...>) {
  PassFn fns[] = {pick_pass<NB + 1>(rows, std::make_integer_sequence<int, TILE_ROWS>{})...};
  return fns[nb - 1];
}

// the pass for `nb` column blocks (1..TILE_NB) of `rows` rows (1..TILE_ROWS)
PassFn pass_for(int nb, int rows) {
  return pick_nb(nb, rows, std::make_integer_sequence<int, TILE_NB>{});
}

// one tile of columns [n0, n0 + 16 nb) over all M rows in the layout's order; out: [M][TILE_COLS]
void ordered_tile(const float* x, int64_t ldx, int64_t M, const float* w, int64_t K, int nb,
                  const std::vector<std::vector<int64_t>>& bounds, const float* bias32,
                  float* out, float* part, float* carry) {
  for (size_t p = 0; p < bounds.size(); ++p) {
    float* chain = p == 0 ? out : part;  // part 0 chains in the output, the others beside it
    for (size_t b = 0; b + 1 < bounds[p].size(); ++b) {
      const int64_t k0 = bounds[p][b], k1 = bounds[p][b + 1];
      for (int64_t ks = k0; ks < k1; ks += SUB_K) {
        const int64_t ke = std::min(k1, ks + SUB_K);
        for (int64_t r0 = 0; r0 < M; r0 += TILE_ROWS) {
          const int rows = static_cast<int>(std::min(TILE_ROWS, M - r0));
          const PassFn fn = pass_for(nb, rows);
          fn(x + r0 * ldx, ldx, w, K * COLS, ks, ke, ks > k0, ke == k1, carry + r0 * TILE_COLS,
             b == 0, p == 0 ? bias32 : nullptr, chain + r0 * TILE_COLS);
        }
      }
    }
    if (p > 0)
      for (int64_t i = 0; i < M * TILE_COLS; i += COLS)
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i),
                                                _mm512_loadu_ps(part + i)));
  }
}

void ordered_gemm(const float* x, int64_t ldx, int64_t M, const float* w, int64_t N, int64_t K,
                  const Layout& l, const float* bias, float* y) {
  const int64_t blocks = (N + COLS - 1) / COLS, tiles = (blocks + TILE_NB - 1) / TILE_NB;
  const auto bounds = layout_bounds(K, l);
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> out(M * TILE_COLS), part(M * TILE_COLS), carry(M * TILE_COLS);
    float bias32[TILE_COLS];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * TILE_COLS, cols = std::min<int64_t>(TILE_COLS, N - n0);
      const int nb = static_cast<int>((cols + COLS - 1) / COLS);
      if (bias) {
        std::fill(bias32, bias32 + TILE_COLS, 0.0f);
        std::copy(bias + n0, bias + n0 + cols, bias32);
      }
      ordered_tile(x, ldx, M, w + (n0 / COLS) * K * COLS, K, nb, bounds,
                   bias ? bias32 : nullptr, out.data(), part.data(), carry.data());
      for (int64_t r = 0; r < M; ++r) std::copy_n(out.data() + r * TILE_COLS, cols, y + r * N + n0);
    }
  });
}
#else
constexpr bool HAVE_ORDERED = false;

void ordered_gemm(const float*, int64_t, int64_t, const float*, int64_t, int64_t, const Layout&,
                  const float*, float*) {
  TORCH_CHECK(false, "lab's ordered fp32 kernel needs AVX-512 (this build has none)");
}
#endif

// ---------------------------------------------------------------------------------------------
// W [N, K] -> [N/16][K][16] (columns past N zero) after a header for `l`
at::Tensor pack_ordered(const at::Tensor& weight, const Layout& l) {
  const int64_t n = weight.size(0), k = weight.size(1), blocks = (n + COLS - 1) / COLS;
  auto out = at::zeros({HEADER + ordered_words(n, k)}, weight.options());
  Header h{MAGIC, ORDERED, static_cast<int32_t>(n), static_cast<int32_t>(k), l.parts, l.kc,
           l.balanced, static_cast<int32_t>(at::get_num_threads())};
  std::memcpy(out.data_ptr<float>(), &h, sizeof(h));
  const float* src = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>() + HEADER;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t j = 0; j < COLS && b * COLS + j < n; ++j)
        for (int64_t kk = 0; kk < k; ++kk)
          dst[(b * k + kk) * COLS + j] = src[(b * COLS + j) * k + kk];
  });
  return out;
}

void set_layout(at::Tensor& packed, const Layout& l) {
  auto* h = reinterpret_cast<Header*>(packed.data_ptr<float>());
  h->parts = l.parts, h->kc = l.kc, h->balanced = l.balanced;
}

// W [N, K] -> MKL's packed weight (what pack() falls back to; tests and benchmarks call it too)
at::Tensor pack_mkl(at::Tensor weight) {
  check_weight(weight);
  const int n = weight.size(0), k = weight.size(1);
  auto out = at::empty({HEADER + mkl_words(n, k)}, weight.options());
  Header h{MAGIC, MKL, n, k, 0, 0, 0, static_cast<int32_t>(at::get_num_threads())};
  std::memcpy(out.data_ptr<float>(), &h, sizeof(h));
  cblas_sgemm_pack(ROW_MAJOR, B_MATRIX, TRANS, PACK_M, n, k, 1.0f, weight.data_ptr<float>(), k,
                   out.data_ptr<float>() + HEADER);
  return out;
}

}  // namespace

at::Tensor gemm(at::Tensor x, at::Tensor packed, at::Tensor weight, std::optional<at::Tensor> bias);

namespace {

// whether the packed weight's output equals at::linear's bit for bit on probe rows
bool matches_linear(const at::Tensor& packed, const at::Tensor& weight) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20261205);  // its own: no global state
  for (int64_t m : {PACK_M, MAX_M - 1}) {
    const auto x = at::randn({m, weight.size(1)}, gen, weight.options());
    if (!at::equal(gemm(x, packed, weight, std::nullopt), at::linear(x, weight))) return false;
  }
  return true;
}

}  // namespace

// W [N, K] -> the packed weight: lab's ordered kernel in the first candidate layout that gives
// at::linear's bits here (at this thread count), else MKL's packed sgemm
at::Tensor pack(at::Tensor weight) {
  check_weight(weight);
  const int64_t k = weight.size(1);
  if (HAVE_ORDERED && k > 0 && weight.size(0) > 0) {
    const auto cands = candidates(k);
    if (!cands.empty()) {
      auto packed = pack_ordered(weight, cands.front());
      for (const Layout& l : cands) {
        set_layout(packed, l);
        if (matches_linear(packed, weight)) return packed;
      }
    }
  }
  return pack_mkl(weight);
}

// W [N, K] -> the ordered kernel's packed weight in a given layout (tests, benchmarks)
at::Tensor pack_layout(at::Tensor weight, int64_t parts, int64_t kc, bool balanced) {
  check_weight(weight);
  TORCH_CHECK(HAVE_ORDERED, "lab's ordered fp32 kernel needs AVX-512 (this build has none)");
  check_layout(weight.size(1), parts, kc);
  return pack_ordered(weight, Layout{static_cast<int>(parts), static_cast<int>(kc), balanced});
}

// whether this build has the ordered kernel (AVX-512)
bool has_ordered() { return HAVE_ORDERED; }

// the layouts pack() tries for a K, in order, flat: parts, kc, balanced (0/1) of each
std::vector<int64_t> candidate_layouts(int64_t k) {
  std::vector<int64_t> out;
  for (const Layout& l : candidates(k)) out.insert(out.end(), {l.parts, l.kc, l.balanced});
  return out;
}

// what pack() chose: "mkl", or "ordered: <parts> x blocks of <kc> [balanced]"
std::string describe(at::Tensor packed) {
  const Header h = header_of(packed);
  TORCH_CHECK(h.magic == MAGIC, "packed must be pack(weight)");
  if (h.kind == MKL) return "mkl";
  return "ordered: " + std::to_string(h.parts) + " parts x blocks of " + std::to_string(h.kc) +
         (h.balanced ? " (balanced)" : "");
}

// the block bounds of one part of a layout (the kernel's, for the PyTorch emulation of its order)
std::vector<int64_t> layout_blocks(int64_t k, int64_t parts, int64_t kc, bool balanced,
                                   int64_t part) {
  check_layout(k, parts, kc);
  TORCH_CHECK(part >= 0 && part < parts, "part must be in [0, parts)");
  return layout_bounds(k, Layout{static_cast<int>(parts), static_cast<int>(kc), balanced})[part];
}

// y = x W^T (+ bias): x [M, K] fp32, packed = pack(W), W the dense weight (from MAX_M rows on)
at::Tensor gemm(at::Tensor x, at::Tensor packed, at::Tensor weight,
                std::optional<at::Tensor> bias) {
  check_weight(weight);
  const int64_t N = weight.size(0), K = weight.size(1), M = x.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat,
              "x must be fp32 [M, ", K, "] (the weight's K)");
  const Header h = header_of(packed);
  const int64_t words = h.kind == ORDERED ? ordered_words(N, K) : mkl_words(N, K);
  TORCH_CHECK(h.magic == MAGIC && h.n == N && h.k == K && packed.numel() == HEADER + words,
              "packed must be pack(weight)");
  TORCH_CHECK(!bias || (bias->numel() == N && bias->scalar_type() == at::kFloat),
              "bias must be fp32 [N]");
  if (M >= MAX_M) return at::linear(x, weight, bias);
  const float* data = packed.data_ptr<float>() + HEADER;
  // both kernels read rows lda >= K apart: other layouts (a broadcast row: stride 0) are copied
  const auto xc = x.stride(1) == 1 && x.stride(0) >= K ? x : x.contiguous();
  auto y = at::empty({M, N}, x.options());  // a new tensor: never the bias itself (M = 1)
  if (h.kind == ORDERED) {
    const auto bc = bias ? bias->contiguous() : at::Tensor();
    if (M > 0)
      ordered_gemm(xc.data_ptr<float>(), xc.stride(0), M, data, N, K,
                   Layout{h.parts, h.kc, h.balanced != 0}, bias ? bc.data_ptr<float>() : nullptr,
                   y.data_ptr<float>());
    return y;
  }
  // MKL: C starts as the bias and the product is added to it (beta 1), as F.linear's addmm does
  if (bias) y.copy_(bias->reshape({1, N}).expand({M, N}));
  if (M == 0) return y;
  cblas_sgemm_compute(ROW_MAJOR, NO_TRANS, PACKED, M, N, K, xc.data_ptr<float>(), xc.stride(0),
                      data, K, bias ? 1.0f : 0.0f, y.data_ptr<float>(), N);
  return y;
}

// the dispatcher's op (C++ kernel: a compiled graph calls it without going through Python)
TORCH_LIBRARY_FRAGMENT(lab_cpu, m) {
  m.def("gemm_fp32(Tensor x, Tensor packed, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(lab_cpu, CPU, m) { m.impl("gemm_fp32", &gemm); }

// this build's own op namespace (its module name, hash included: two builds never collide); the
// extra macro level expands TORCH_EXTENSION_NAME before TORCH_LIBRARY pastes it
#define LAB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

LAB_LIBRARY(TORCH_EXTENSION_NAME, m) {
  // W [N, K] fp32 -> the packed weight (ordered where it gives F.linear's bits here, else MKL's)
  m.def("pack(Tensor weight) -> Tensor", &pack);
  // W [N, K] fp32 -> the ordered kernel's weight in a layout
  m.def("pack_layout(Tensor weight, int parts, int kc, bool balanced) -> Tensor", &pack_layout);
  m.def("pack_mkl(Tensor weight) -> Tensor", &pack_mkl);  // W [N, K] fp32 -> MKL's packed weight
  m.def("describe(Tensor packed) -> str", &describe);  // 'mkl' or the ordered layout it runs
  m.def("has_ordered() -> bool", &has_ordered);  // this build has the ordered kernel (AVX-512)
  m.def("candidate_layouts(int k) -> int[]", &candidate_layouts);  // what pack() tries, in order
  m.def("layout_blocks(int k, int parts, int kc, bool balanced, int part) -> int[]",
        &layout_blocks);
  // y = x W^T (+ bias) through the packed weight
  m.def("gemm(Tensor x, Tensor packed, Tensor weight, Tensor? bias) -> Tensor", &gemm);
}
