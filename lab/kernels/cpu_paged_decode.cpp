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
// All arithmetic in fp32; bf16 inputs are widened on load and the output rounded once. The
// `omp simd` loops (reductions, exp) vectorize under the flags cpu_paged_decode.py builds with
// (-O3 -march=native -fopenmp -ffast-math).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t PREFETCH_BLOCKS = 2;  // how many blocks ahead the rows are asked for

// ask for a later block's rows while this one is read: the blocks of a request are scattered
// over the cache, so the hardware prefetcher cannot guess the next one
template <typename T>
inline void prefetch_rows(const T* first, int64_t rows, int64_t row, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    const char* p = reinterpret_cast<const char*>(first + r * row);
    for (int64_t byte = 0; byte < D * static_cast<int64_t>(sizeof(T)); byte += 64)
      __builtin_prefetch(p + byte);
  }
}

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

struct Shape {
  int64_t B, H, Hkv, D, BS, num_blocks, max_blocks, q_stride;
};

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
            const Shape& sh, float scale) {
  const int64_t H = sh.H, Hkv = sh.Hkv, D = sh.D, BS = sh.BS, g = H / Hkv;
  const int64_t row = Hkv * D;                        // elements between two tokens of a block
  const int64_t v_off = sh.num_blocks * BS * row;     // V's first element
  at::parallel_for(0, sh.B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs(g * D), buf(D), acc(g * D), s;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Hkv, kh = task % Hkv;
      const int64_t L = seq_lens[b];
      const int32_t* blocks = table + b * sh.max_blocks;
      const float* qb = as_float(q + b * sh.q_stride + kh * g * D, qs.data(), g * D);
      for (int64_t i = 0; i < g * D; ++i) qs[i] = qb[i] * scale;
      s.resize(g * L);
      // key j of the request: block blocks[j / BS], slot j % BS, walked block by block
      auto for_each_key = [&](int64_t first, auto&& visit) {
        auto block_rows = [&](int64_t start) {
          return kv + first + blocks[start / BS] * BS * row + kh * D;
        };
        for (int64_t ahead = 0; ahead < std::min(L, PREFETCH_BLOCKS * BS); ahead += BS)
          prefetch_rows(block_rows(ahead), std::min(BS, L - ahead), row, D);
        for (int64_t start = 0; start < L; start += BS) {
          const T* base = block_rows(start);
          const int64_t ahead = start + PREFETCH_BLOCKS * BS;
          if (ahead < L) prefetch_rows(block_rows(ahead), std::min(BS, L - ahead), row, D);
          const int64_t n = std::min(BS, L - start);
          for (int64_t o = 0; o < n; ++o) visit(start + o, base + o * row);
        }
      };
      for_each_key(0, [&](int64_t j, const T* k) {  // pass 1: scores
        const float* kf = as_float(k, buf.data(), D);
        for (int64_t h = 0; h < g; ++h) s[h * L + j] = dot(qs.data() + h * D, kf, D);
      });
      for (int64_t h = 0; h < g; ++h) {  // softmax per query head
        float* sh_ = s.data() + h * L;
        const float m = *std::max_element(sh_, sh_ + L);
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < L; ++j) total += (sh_[j] = std::exp(sh_[j] - m));
        const float inv = 1.f / total;
        for (int64_t j = 0; j < L; ++j) sh_[j] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for_each_key(v_off, [&](int64_t j, const T* v) {  // pass 2: p @ V
        const float* vf = as_float(v, buf.data(), D);
        for (int64_t h = 0; h < g; ++h) axpy(s[h * L + j], vf, acc.data() + h * D, D);
      });
      T* o = out + (b * H + kh * g) * D;
      for (int64_t i = 0; i < g * D; ++i) o[i] = static_cast<T>(acc[i]);
    }
  });
}

// a token's heads must be contiguous: [T, heads, D] with strides (any, D, 1)
void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), name,
              " must be [T, heads, D] with each token's heads contiguous");
}

}  // namespace

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                           torch::Tensor kv_cache, torch::Tensor slots, torch::Tensor block_table,
                           torch::Tensor seq_lens, int64_t num_reqs, int64_t num_tokens,
                           double scale) {
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
  auto out = torch::empty({q.size(0), sh.H, sh.D}, q.options());
  AT_DISPATCH_SWITCH(dtype, "paged_decode",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      write_rows(k.data_ptr<float>(), v.data_ptr<float>(), k.stride(0), v.stride(0),
                 slots.data_ptr<int64_t>(), num_tokens, kv_cache.data_ptr<float>(), sh);
      decode(q.data_ptr<float>(), kv_cache.data_ptr<float>(), block_table.data_ptr<int32_t>(),
             seq_lens.data_ptr<int32_t>(), out.data_ptr<float>(), sh, static_cast<float>(scale));
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      using BF = at::BFloat16;
      write_rows(k.data_ptr<BF>(), v.data_ptr<BF>(), k.stride(0), v.stride(0),
                 slots.data_ptr<int64_t>(), num_tokens, kv_cache.data_ptr<BF>(), sh);
      decode(q.data_ptr<BF>(), kv_cache.data_ptr<BF>(), block_table.data_ptr<int32_t>(),
             seq_lens.data_ptr<int32_t>(), out.data_ptr<BF>(), sh, static_cast<float>(scale));
    }));
  if (q.size(0) > num_reqs) out.narrow(0, num_reqs, q.size(0) - num_reqs).zero_();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode,
        "write the step's K/V rows, then paged decode attention in place over the cache");
}
