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
//   window    int                           > 0: a sliding window, the last `window` keys only
//   sinks     [H] fp32 or none              a logit per query head in the softmax's denominator
//   softcap   float                         > 0: scores s -> softcap * tanh(s / softcap)
//   -> out    [T, H, D]                     token b < B is request b's query; rows B.. are zero
//
// First the step's rows t < num_tokens are copied into their slots. Then one task per request
// (or per span of its KV heads where requests are fewer than 4 per thread: span_heads), spread
// over torch's own thread pool (at::parallel_for); each KV head's g = H / Hkv query heads share
// every K and V row it reads. Two passes over the keys it sees (keys lo .. L - 1, lo = L - window
// with a sliding window, else 0: the blocks below are never read, nor their block-table
// entries), block by block:
//
//   1. s[h][j] = scale * q_h . k_j                 (a bf16 row widened to fp32 once)
//   2. p = softmax(s[h]) per head (soft-capped first; max-subtracted, fp32; a sink adds
//      exp(sink_h - max) to the denominator only), out_h = sum_j p[h][j] v_j
//
// All arithmetic in fp32; bf16 inputs are widened on load and the output rounded once. A task
// runs with AVX-512 intrinsics where the compiler targets AVX-512 and (group, head_dim) is one
// of the pairs compiled in (head_dim 64 or 128, group 1, 2, 4 or 8), else the portable loops,
// whose `omp simd` reductions and exp vectorize under the flags cpu_paged_decode.py builds with
// (-O3 -march=native -fopenmp -ffast-math); `portable` forces those (the tests run both).

// ATen's core and the ops used, not ATen/ATen.h (every op's header: a slower build)
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>  // the dispatcher (not pybind11: torch/python.h doubled the build)

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace {

// A task prefetches each row it reads one block ahead (the same row and head of the next block:
// the blocks of a request are scattered over the cache, so the hardware prefetcher cannot guess
// the next one; a whole block asked for at once fills the core's miss buffers and stalls it).
// Into L2 (prefetcht1): more misses in flight than L1 takes. Past K's last block it prefetches
// V's first. One task per request one block ahead (below) beat one task per KV head two blocks
// ahead (experiments/results/2026-12-05-cpu-kernels-option.md).
constexpr int64_t PREFETCH_BLOCKS = 1;

template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64)
    __builtin_prefetch(p + byte, 0, 2);
}

struct Shape {
  int64_t B, H, Hkv, D, BS, num_blocks, max_blocks, q_stride;
};

// One request's KV heads kh .. kh + hc - 1 (a span): their hc * g query heads q [hc * g, D], its
// keys lo .. L - 1 through `blocks` (n = L - lo of them), s [hc * g, n] scratch, out
// [hc * g, D]. A key's row holds every KV head ([BS, Hkv, D] blocks), so a span reads each
// block's rows as one stretch of hc * D values.
template <typename T>
struct Task {
  const T* q;
  const T* kv;
  const int32_t* blocks;
  int64_t lo, L, kh, hc;
  float* s;
  T* out;
  int64_t n() const { return L - lo; }
};

// Walk the span's K (pass 0) or V (pass 1) over the blocks holding keys lo .. L - 1, and within
// a block head by head: enter(h), then visit(h, j, head h's row of key lo + j) for the block's
// keys, then leave(h) (a task keeps a head's registers only while it reads that head's rows of
// one block). Each row read prefetches the same row and head PREFETCH_BLOCKS blocks ahead (from
// K's end: V's first block).
template <typename T, typename Enter, typename Visit, typename Leave>
inline void for_each_block(const Task<T>& t, const Shape& sh, int pass, Enter&& enter,
                           Visit&& visit, Leave&& leave) {
  const int64_t BS = sh.BS, D = sh.D, row = sh.Hkv * D, L = t.L;
  const int64_t first = t.lo / BS, nblk = (L + BS - 1) / BS, count = nblk - first;
  const T* heads = t.kv + t.kh * D;
  auto block = [&](int64_t p, int64_t b) {
    return heads + p * sh.num_blocks * BS * row + t.blocks[b] * BS * row;
  };
  for (int64_t b = first; b < nblk; ++b) {
    const T* rows = block(pass, b);
    const int64_t ahead = b + PREFETCH_BLOCKS;
    const T* pre = ahead < nblk                        ? block(pass, ahead)
                   : pass == 0 && ahead < nblk + count ? block(1, ahead - count)
                                                       : nullptr;
    const int64_t o0 = std::max<int64_t>(0, t.lo - b * BS), o1 = std::min(BS, L - b * BS);
    for (int64_t h = 0; h < t.hc; ++h) {
      enter(h);
      for (int64_t o = o0; o < o1; ++o) {
        if (pre) prefetch_row(pre + o * row + h * D, D);
        visit(h, b * BS + o - t.lo, rows + o * row + h * D);
      }
      leave(h);
    }
  }
}

// The softmax's options: soft cap (> 0) and each of the task's query heads' sink (or none)
struct Softmax {
  float softcap;
  const float* sinks;
};

// softmax over each of the rows of s [rows, n], in place: soft-capped first (softcap > 0), then
// max-subtracted, fp32; row h's sink (sinks[h]) counts in the denominator only
inline void softmax_rows(float* s, int64_t rows, int64_t n, const Softmax& opt) {
  for (int64_t h = 0; h < rows; ++h) {
    float* r = s + h * n;
    if (opt.softcap > 0.f) {
      const float cap = opt.softcap, inv_cap = 1.f / opt.softcap;
      for (int64_t j = 0; j < n; ++j) r[j] = cap * std::tanh(r[j] * inv_cap);
    }
    float m = *std::max_element(r, r + n);
    if (opt.sinks) m = std::max(m, opt.sinks[h]);
    float total = opt.sinks ? std::exp(opt.sinks[h] - m) : 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) total += (r[j] = std::exp(r[j] - m));
    const float inv = 1.f / total;
    for (int64_t j = 0; j < n; ++j) r[j] *= inv;
  }
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

// work: 2 * hc * g * D floats (the scaled q, the accumulators)
template <typename T>
void task_portable(const Task<T>& t, const Shape& sh, float scale, const Softmax& opt,
                   float* work) {
  const int64_t g = sh.H / sh.Hkv, D = sh.D, L = t.n(), n = t.hc * g * D;
  float *qs = work, *acc = work + n;
  std::vector<float> buf(D);
  const float* qf = as_float(t.q, acc, n);
  for (int64_t i = 0; i < n; ++i) qs[i] = qf[i] * scale;
  std::fill(acc, acc + n, 0.f);
  auto none = [](int64_t) {};
  for_each_block(t, sh, 0, none, [&](int64_t h, int64_t j, const T* k) {  // pass 1: scores
    const float* kf = as_float(k, buf.data(), D);
    for (int64_t i = h * g; i < (h + 1) * g; ++i) t.s[i * L + j] = dot(qs + i * D, kf, D);
  }, none);
  softmax_rows(t.s, t.hc * g, L, opt);
  for_each_block(t, sh, 1, none, [&](int64_t h, int64_t j, const T* v) {  // pass 2: p @ V
    const float* vf = as_float(v, buf.data(), D);
    for (int64_t i = h * g; i < (h + 1) * g; ++i) axpy(t.s[i * L + j], vf, acc + i * D, D);
  }, none);
  for (int64_t i = 0; i < n; ++i) t.out[i] = static_cast<T>(acc[i]);
}

// ---- AVX-512: head_dim 16 * NC and group G known at compile time ----
#if defined(__AVX512F__)
// A head's q (pass 1) or accumulators (pass 2) and a K/V row sit in registers while the task
// reads that head's rows of a block (the portable loop goes through memory for every row and
// reduces every dot product alone: slower, python -m lab.bench.cpu_decode --portable).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {  // bf16 -> fp32: zero-extend, shift to the top
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

template <int G, int NC, typename T>
void task_avx512(const Task<T>& t, const Shape& sh, float scale, const Softmax& opt,
                 float* work) {
  constexpr int D = 16 * NC;
  const int64_t L = t.n(), n = t.hc * G * D;
  float* qs = work;  // the span's q, scaled; then its accumulators
  for (int64_t i = 0; i < n; i += 16)
    _mm512_storeu_ps(qs + i, _mm512_mul_ps(load16(t.q + i), _mm512_set1_ps(scale)));
  __m512 r[G][NC];
  auto load = [&](int64_t h) {
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < NC; ++c) r[g][c] = _mm512_loadu_ps(qs + (h * G + g) * D + 16 * c);
  };
  auto store = [&](int64_t h) {
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(qs + (h * G + g) * D + 16 * c, r[g][c]);
  };
  for_each_block(t, sh, 0, load, [&](int64_t h, int64_t j, const T* k) {  // pass 1: scores
    __m512 kc[NC];
    for (int c = 0; c < NC; ++c) kc[c] = load16(k + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 a = _mm512_mul_ps(r[g][0], kc[0]);
      for (int c = 1; c < NC; ++c) a = _mm512_fmadd_ps(r[g][c], kc[c], a);
      t.s[(h * G + g) * L + j] = _mm512_reduce_add_ps(a);
    }
  }, [](int64_t) {});
  softmax_rows(t.s, t.hc * G, L, opt);
  std::fill(qs, qs + n, 0.f);
  for_each_block(t, sh, 1, load, [&](int64_t h, int64_t j, const T* v) {  // pass 2: p @ V
    __m512 vc[NC];
    for (int c = 0; c < NC; ++c) vc[c] = load16(v + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 p = _mm512_set1_ps(t.s[(h * G + g) * L + j]);
      for (int c = 0; c < NC; ++c) r[g][c] = _mm512_fmadd_ps(p, vc[c], r[g][c]);
    }
  }, store);
  for (int64_t i = 0; i < n; ++i) t.out[i] = static_cast<T>(qs[i]);
}
#endif

template <typename T>
using TaskFn = void (*)(const Task<T>&, const Shape&, float, const Softmax&, float*);

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

// KV heads per task: all of a request's (its blocks read as whole stretches) unless that leaves
// fewer than 4 tasks per thread; then the fewest spans (a divisor of Hkv) that give that many
int64_t span_heads(int64_t B, int64_t Hkv) {
  const int64_t want = 4 * static_cast<int64_t>(at::get_num_threads());
  int64_t spans = 1;
  while (spans < Hkv && B * spans < want)
    do ++spans; while (Hkv % spans);
  return Hkv / spans;
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
            const Shape& sh, float scale, bool portable, int64_t window, const float* sinks,
            float softcap) {
  const int64_t H = sh.H, Hkv = sh.Hkv, D = sh.D, g = H / Hkv;
  const int64_t hc = span_heads(sh.B, Hkv), spans = Hkv / hc;
  const TaskFn<T> run = pick_task<T>(g, D, portable);
  at::parallel_for(0, sh.B * spans, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s, work(2 * hc * g * D);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / spans, kh = task % spans * hc;
      T* o = out + (b * H + kh * g) * D;
      if (seq_lens[b] <= 0) {  // no keys: zero rows, as the reference gives
        std::fill(o, o + hc * g * D, T(0));
        continue;
      }
      const int64_t L = seq_lens[b], lo = window > 0 ? std::max<int64_t>(0, L - window) : 0;
      s.resize(hc * g * (L - lo));
      run(Task<T>{q + b * sh.q_stride + kh * g * D, kv, table + b * sh.max_blocks, lo, L, kh,
                  hc, s.data(), o},
          sh, scale, Softmax{softcap, sinks ? sinks + kh * g : nullptr}, work.data());
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
                           double scale, bool portable, int64_t window,
                           std::optional<at::Tensor> sinks, double softcap) {
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
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none)");
  const float* sink_ptr = nullptr;
  if (sinks.has_value()) {
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() &&
                sinks->dim() == 1 && sinks->size(0) == sh.H,
                "sinks must be fp32 [num_heads], contiguous");
    sink_ptr = sinks->data_ptr<float>();
  }
  const float cap = static_cast<float>(softcap);
  auto out = at::empty({q.size(0), sh.H, sh.D}, q.options());
  AT_DISPATCH_SWITCH(dtype, "paged_decode",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      write_rows(k.data_ptr<float>(), v.data_ptr<float>(), k.stride(0), v.stride(0),
                 slots.data_ptr<int64_t>(), num_tokens, kv_cache.data_ptr<float>(), sh);
      decode(q.data_ptr<float>(), kv_cache.data_ptr<float>(), block_table.data_ptr<int32_t>(),
             seq_lens.data_ptr<int32_t>(), out.data_ptr<float>(), sh, static_cast<float>(scale),
             portable, window, sink_ptr, cap);
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      using BF = at::BFloat16;
      write_rows(k.data_ptr<BF>(), v.data_ptr<BF>(), k.stride(0), v.stride(0),
                 slots.data_ptr<int64_t>(), num_tokens, kv_cache.data_ptr<BF>(), sh);
      decode(q.data_ptr<BF>(), kv_cache.data_ptr<BF>(), block_table.data_ptr<int32_t>(),
             seq_lens.data_ptr<int32_t>(), out.data_ptr<BF>(), sh, static_cast<float>(scale),
             portable, window, sink_ptr, cap);
    }));
  if (q.size(0) > num_reqs) out.narrow(0, num_reqs, q.size(0) - num_reqs).zero_();
  return out;
}

// this build's own op namespace (its module name, hash included: two builds never collide); the
// extra macro level expands TORCH_EXTENSION_NAME before TORCH_LIBRARY pastes it
#define LAB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

LAB_LIBRARY(TORCH_EXTENSION_NAME, m) {
  // write the step's K/V rows into the cache, then paged decode attention over it
  m.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, Tensor slots, "
        "Tensor block_table, Tensor seq_lens, int num_reqs, int num_tokens, float scale, "
        "bool portable, int window, Tensor? sinks, float softcap) -> Tensor", &paged_decode);
}
