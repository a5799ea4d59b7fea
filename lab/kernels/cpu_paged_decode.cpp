// Paged decode attention for the CPU: one query token per request over its cached K/V, read in
// place from the paged cache (no gather), with the step's own K/V rows written first. Built by
// lab/kernels/cpu_paged_decode.py (torch's cpp_extension, -O3 -march=native), which also holds
// the PyTorch reference it is tested against.
//
//   q, k, v   [T, H | Hkv, D]             a token's heads contiguous (any stride between tokens)
//   kv_cache  [2, num_blocks, BS, Hkv, D]   K then V; one dtype with q, k, v: fp32 or bf16
//   slots     [T] int64                     token t's K/V go to slot slots[t] (< 0: not written)
//   table     [>= B, max_blocks] int32      request b's key j lives in block table[b][j / BS]
//   seq_lens  [>= B] int32                  keys 0 .. seq_lens[b] - 1 (the step's own included)
//   -> out    [T, H, D]                     token b < B is request b's query; rows B.. are zero
//
// First the step's rows t < num_tokens are copied into their slots. Then one task per
// (request, KV head), spread over torch's own thread pool (at::parallel_for): the task's
// g = H / Hkv query heads share every K and V row it reads. Two passes over the keys:
//
//   1. s[h][j] = scale * q_h . k_j                 (a bf16 row widened to fp32 once)
//   2. p = softmax(s[h]) per head (max-subtracted, fp32), out_h = sum_j p[h][j] v_j
//
// All arithmetic in fp32; bf16 inputs are widened on load and the output rounded once. A task
// runs with AVX-512 intrinsics where the compiler targets AVX-512 and (group, head_dim) is one
// of the pairs compiled in (head_dim 64 or 128, group 1, 2, 4 or 8), else the portable loops,
// whose `omp simd` reductions and exp vectorize under the flags cpu_paged_decode.py builds with
// (-O3 -march=native -fopenmp -ffast-math); `portable` forces those (the tests run both).

#include <ATen/ATen.h>
#include <torch/python.h>  // pybind11 + Tensor casters; not torch/extension.h (~7 s more to build)

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// A task prefetches the rows of the block PREFETCH_BLOCKS ahead of the one it reads, one row per
// row read (the blocks of a request are scattered over the cache, so the hardware prefetcher
// cannot guess the next one; a whole block asked for at once fills the core's miss buffers and
// stalls it). Into L2 (prefetcht1): more misses in flight than L1 takes. bench_qwen3_06b bf16,
// per layer: 1027 us with a block asked for at once, 550-610 us spread over the rows.
constexpr int64_t PREFETCH_BLOCKS = 2;

template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64)
    __builtin_prefetch(p + byte, 0, 2);
}

struct Shape {
  int64_t B, H, Hkv, D, BS, num_blocks, max_blocks, q_stride;
};

// One (request, KV head): its g query heads q [g, D], its L keys through `blocks`, s [g * L]
// scratch, out [g, D].
template <typename T>
struct Task {
  const T* q;
  const T* kv;
  const int32_t* blocks;
  int64_t L, kh;
  float* s;
  T* out;
};

// Walk the task's keys (first = 0: K, v_off: V) block by block, calling visit(j, row of key j)
// and prefetching the block PREFETCH_BLOCKS ahead; `then`, where not null, is the first block of
// what comes next (V after K), prefetched while the last blocks are read.
template <typename T, typename Visit>
inline void for_each_key(const Task<T>& t, const Shape& sh, int64_t first, const T* then,
                         Visit&& visit) {
  const int64_t BS = sh.BS, row = sh.Hkv * sh.D, L = t.L;
  auto block_rows = [&](int64_t start) {
    return t.kv + first + t.blocks[start / BS] * BS * row + t.kh * sh.D;
  };
  for (int64_t ahead = 0; ahead < std::min(L, PREFETCH_BLOCKS * BS); ++ahead)
    prefetch_row(block_rows(ahead) + (ahead % BS) * row, sh.D);
  for (int64_t start = 0; start < L; start += BS) {
    const T* base = block_rows(start);
    const int64_t ahead = start + PREFETCH_BLOCKS * BS;
    const T* pre = ahead < L ? block_rows(ahead) : (start + BS >= L ? then : nullptr);
    const int64_t n = std::min(BS, L - start);
    for (int64_t o = 0; o < n; ++o) {
      if (pre) prefetch_row(pre + o * row, sh.D);
      visit(start + o, base + o * row);
    }
  }
}

// softmax over each of the g rows of s [g, L], in place (max-subtracted, fp32)
inline void softmax_rows(float* s, int64_t g, int64_t L) {
  for (int64_t h = 0; h < g; ++h) {
    float* r = s + h * L;
    const float m = *std::max_element(r, r + L);
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < L; ++j) total += (r[j] = std::exp(r[j] - m));
    const float inv = 1.f / total;
    for (int64_t j = 0; j < L; ++j) r[j] *= inv;
  }
}

template <typename T>
inline const T* first_v_row(const Task<T>& t, const Shape& sh) {
  return t.kv + sh.num_blocks * sh.BS * sh.Hkv * sh.D + t.blocks[0] * sh.BS * sh.Hkv * sh.D +
         t.kh * sh.D;
}

// ---- portable: any head_dim and group, loops the compiler vectorizes ----

// y += a * x
inline void axpy(float a, const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// n elements of src as fp32: bf16 widened into buf, fp32 read where it is (no copy)
inline const float* as_float(const float* src, float*, int64_t) { return src; }

inline const float* as_float(const at::BFloat16* src, float* buf, int64_t n) {
  // a bf16 is the top half of an fp32: widen by shifting the bits (a loop that vectorizes)
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(buf);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
  return buf;
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename T>
void task_portable(const Task<T>& t, const Shape& sh, float scale) {
  const int64_t g = sh.H / sh.Hkv, D = sh.D, L = t.L;
  std::vector<float> qs(g * D), buf(D), acc(g * D, 0.f);
  const float* qf = as_float(t.q, qs.data(), g * D);
  for (int64_t i = 0; i < g * D; ++i) qs[i] = qf[i] * scale;
  for_each_key(t, sh, 0, first_v_row(t, sh), [&](int64_t j, const T* k) {  // pass 1: scores
    const float* kf = as_float(k, buf.data(), D);
    for (int64_t h = 0; h < g; ++h) t.s[h * L + j] = dot(qs.data() + h * D, kf, D);
  });
  softmax_rows(t.s, g, L);
  for_each_key(t, sh, sh.num_blocks * sh.BS * sh.Hkv * D, static_cast<const T*>(nullptr),
               [&](int64_t j, const T* v) {  // pass 2: p @ V
    const float* vf = as_float(v, buf.data(), D);
    for (int64_t h = 0; h < g; ++h) axpy(t.s[h * L + j], vf, acc.data() + h * D, D);
  });
  for (int64_t i = 0; i < g * D; ++i) t.out[i] = static_cast<T>(acc[i]);
}

// ---- AVX-512: head_dim 16 * NC and group G known at compile time ----
#if defined(__AVX512F__)
// q, the accumulators and a K/V row stay in registers (the portable loop goes through memory
// for every row and reduces every dot product alone: 2-2.5x slower on a cache in L2).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {  // bf16 -> fp32: zero-extend, shift to the top
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

template <int G, int NC, typename T>
void task_avx512(const Task<T>& t, const Shape& sh, float scale) {
  constexpr int D = 16 * NC;
  const int64_t L = t.L;
  __m512 qv[G][NC];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < NC; ++c)
      qv[h][c] = _mm512_mul_ps(load16(t.q + h * D + 16 * c), _mm512_set1_ps(scale));
  for_each_key(t, sh, 0, first_v_row(t, sh), [&](int64_t j, const T* k) {  // pass 1: scores
    __m512 kc[NC];
    for (int c = 0; c < NC; ++c) kc[c] = load16(k + 16 * c);
    for (int h = 0; h < G; ++h) {
      __m512 a = _mm512_mul_ps(qv[h][0], kc[0]);
      for (int c = 1; c < NC; ++c) a = _mm512_fmadd_ps(qv[h][c], kc[c], a);
      t.s[h * L + j] = _mm512_reduce_add_ps(a);
    }
  });
  softmax_rows(t.s, G, L);
  __m512 acc[G][NC];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < NC; ++c) acc[h][c] = _mm512_setzero_ps();
  for_each_key(t, sh, sh.num_blocks * sh.BS * sh.Hkv * D, static_cast<const T*>(nullptr),
               [&](int64_t j, const T* v) {  // pass 2: p @ V
    __m512 vc[NC];
    for (int c = 0; c < NC; ++c) vc[c] = load16(v + 16 * c);
    for (int h = 0; h < G; ++h) {
      const __m512 p = _mm512_set1_ps(t.s[h * L + j]);
      for (int c = 0; c < NC; ++c) acc[h][c] = _mm512_fmadd_ps(p, vc[c], acc[h][c]);
    }
  });
  alignas(64) float row[16];
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < NC; ++c) {
      _mm512_store_ps(row, acc[h][c]);
      for (int i = 0; i < 16; ++i) t.out[h * D + 16 * c + i] = static_cast<T>(row[i]);
    }
}
#endif

template <typename T>
using TaskFn = void (*)(const Task<T>&, const Shape&, float);

// the AVX-512 task compiled for this (group, head_dim), else the portable one
template <typename T>
TaskFn<T> pick_task(int64_t g, int64_t D, bool portable) {
#if defined(__AVX512F__)
#define LAB_TASK(G_, NC_) \
  if (!portable && g == G_ && D == 16 * NC_) return &task_avx512<G_, NC_, T>;
  LAB_TASK(1, 4) LAB_TASK(2, 4) LAB_TASK(4, 4) LAB_TASK(8, 4)
  LAB_TASK(1, 8) LAB_TASK(2, 8) LAB_TASK(4, 8) LAB_TASK(8, 8)
#undef LAB_TASK
#endif
  return &task_portable<T>;
}

template <typename T>
void write_rows(const T* k, const T* v, int64_t k_stride, int64_t v_stride, const int64_t* slots,
                int64_t num_tokens, T* kv, const Shape& sh) {
  const int64_t row = sh.Hkv * sh.D, v_off = sh.num_blocks * sh.BS * row;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0) continue;
    std::copy(k + t * k_stride, k + t * k_stride + row, kv + slots[t] * row);
    std::copy(v + t * v_stride, v + t * v_stride + row, kv + v_off + slots[t] * row);
  }
}

template <typename T>
void decode(const T* q, const T* kv, const int32_t* table, const int32_t* seq_lens, T* out,
            const Shape& sh, float scale, bool portable) {
  const int64_t H = sh.H, Hkv = sh.Hkv, D = sh.D, g = H / Hkv;
  const TaskFn<T> run = pick_task<T>(g, D, portable);
  at::parallel_for(0, sh.B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Hkv, kh = task % Hkv;
      if (seq_lens[b] <= 0) {  // no keys: a zero row, as the reference gives
        std::fill(out + (b * H + kh * g) * D, out + (b * H + kh * g + g) * D, T(0));
        continue;
      }
      s.resize(g * seq_lens[b]);
      run(Task<T>{q + b * sh.q_stride + kh * g * D, kv, table + b * sh.max_blocks, seq_lens[b],
                  kh, s.data(), out + (b * H + kh * g) * D},
          sh, scale);
    }
  });
}

// a token's heads must be contiguous: [T, heads, D] with strides (any, D, 1)
void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), name,
              " must be [T, heads, D] with each token's heads contiguous");
}

}  // namespace

at::Tensor paged_decode(at::Tensor q, at::Tensor k, at::Tensor v,
                           at::Tensor kv_cache, at::Tensor slots, at::Tensor block_table,
                           at::Tensor seq_lens, int64_t num_reqs, int64_t num_tokens,
                           double scale, bool portable) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  TORCH_CHECK(kv_cache.is_contiguous() && kv_cache.dim() == 5, "kv_cache must be contiguous "
              "[2, num_blocks, block_size, num_kv_heads, head_dim]");
  TORCH_CHECK(block_table.stride(1) == 1 && block_table.scalar_type() == at::kInt &&
              seq_lens.is_contiguous() && seq_lens.scalar_type() == at::kInt,
              "block_table (rows contiguous) and seq_lens must be int32");
  TORCH_CHECK(slots.is_contiguous() && slots.scalar_type() == at::kLong, "slots must be int64");
  const auto dtype = q.scalar_type();
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype &&
              kv_cache.scalar_type() == dtype, "q, k, v and kv_cache must share one dtype");
  const Shape sh{num_reqs, q.size(1), kv_cache.size(3), q.size(2), kv_cache.size(2),
                 kv_cache.size(1), block_table.stride(0), q.stride(0)};
  TORCH_CHECK(kv_cache.size(4) == sh.D && k.size(1) == sh.Hkv && sh.H % sh.Hkv == 0 &&
              q.size(0) >= num_reqs && num_tokens <= k.size(0) && num_tokens <= slots.size(0) &&
              block_table.size(0) >= num_reqs && seq_lens.size(0) >= num_reqs,
              "paged_decode: shapes do not match");
  auto out = at::empty({q.size(0), sh.H, sh.D}, q.options());
  AT_DISPATCH_SWITCH(dtype, "paged_decode",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      write_rows(k.data_ptr<float>(), v.data_ptr<float>(), k.stride(0), v.stride(0),
                 slots.data_ptr<int64_t>(), num_tokens, kv_cache.data_ptr<float>(), sh);
      decode(q.data_ptr<float>(), kv_cache.data_ptr<float>(), block_table.data_ptr<int32_t>(),
             seq_lens.data_ptr<int32_t>(), out.data_ptr<float>(), sh, static_cast<float>(scale),
             portable);
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      using BF = at::BFloat16;
      write_rows(k.data_ptr<BF>(), v.data_ptr<BF>(), k.stride(0), v.stride(0),
                 slots.data_ptr<int64_t>(), num_tokens, kv_cache.data_ptr<BF>(), sh);
      decode(q.data_ptr<BF>(), kv_cache.data_ptr<BF>(), block_table.data_ptr<int32_t>(),
             seq_lens.data_ptr<int32_t>(), out.data_ptr<BF>(), sh, static_cast<float>(scale),
             portable);
    }));
  if (q.size(0) > num_reqs) out.narrow(0, num_reqs, q.size(0) - num_reqs).zero_();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode,
        "write the step's K/V rows, then paged decode attention in place over the cache",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kv_cache"), py::arg("slots"),
        py::arg("block_table"), py::arg("seq_lens"), py::arg("num_reqs"), py::arg("num_tokens"),
        py::arg("scale"), py::arg("portable") = false);
}
