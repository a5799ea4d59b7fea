// Row argmax on the CPU: x [R, V] fp32 (rows contiguous) -> int64 [R], the first index of each
// row's largest value, a NaN counting as the largest (torch's max(dim=-1).indices, which the
// sampler's greedy pick was). Built by lab/kernels/cpu_argmax.py, which holds that reference.
//
// Why: a greedy decode step's whole sampling is this reduction over the vocabulary, and ATen's
// max(dim) keeps a value and an index per element, far from the memory's rate; here 16 lanes
// keep their best value and its index (a compare and two blends per 16 logits), then the lanes
// are reduced, one task per row. Measured: experiments/results/2026-12-05-cpu-kernels-option.md.

// ATen's core and the ops used, not ATen/ATen.h (every op's header: a slower build)
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>  // the dispatcher (not pybind11: torch/python.h doubled the build)

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// NaN tests on the bits: the build's -ffast-math lets the compiler assume no NaN in float math
inline bool is_nan(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return (b & 0x7fffffffu) > 0x7f800000u;
}

// the first index of the largest value of x[0..n), n >= 1; a NaN is largest (its first one)
int64_t row_argmax(const float* x, int64_t n) {
  int64_t i = 0, best_i = 0;
  float best = x[0];
#if defined(__AVX512F__)
  if (n >= 16) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    auto nans = [&](__m512 v) {
      return _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), abs_mask), inf);
    };
    __m512 bv = _mm512_loadu_ps(x);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i bi = idx;
    const __m512i step = _mm512_set1_epi32(16);
    __mmask16 nan = nans(bv);
    for (i = 16; i + 16 <= n; i += 16) {  // lane l keeps the best of elements l, l+16, ...
      idx = _mm512_add_epi32(idx, step);
      const __m512 v = _mm512_loadu_ps(x + i);
      const __mmask16 gt = _mm512_cmp_ps_mask(v, bv, _CMP_GT_OQ);
      nan |= nans(v);
      bv = _mm512_mask_blend_ps(gt, bv, v);
      bi = _mm512_mask_blend_epi32(gt, bi, idx);
    }
    if (nan) {  // rare: the first NaN is the answer
      for (int64_t j = 0; j < i; ++j)
        if (is_nan(x[j])) return j;
    }
    alignas(64) float vals[16];
    alignas(64) int32_t ids[16];
    _mm512_store_ps(vals, bv);
    _mm512_store_si512(ids, bi);
    best = vals[0];
    best_i = ids[0];
    for (int l = 1; l < 16; ++l)  // the largest lane; the smallest index among equals
      if (vals[l] > best || (vals[l] == best && ids[l] < best_i)) {
        best = vals[l];
        best_i = ids[l];
      }
  }
#endif
  for (; i < n; ++i) {  // the rest (the whole row without AVX-512): no NaN before i
    if (is_nan(x[i])) return i;
    if (x[i] > best) {
      best = x[i];
      best_i = i;
    }
  }
  return best_i;
}

}  // namespace

at::Tensor argmax_rows(at::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu() &&
              x.stride(1) == 1, "x must be a 2-D fp32 CPU tensor with contiguous rows");
  TORCH_CHECK(x.size(1) > 0, "x must have at least one column");
  auto out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  const float* p = x.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t n = x.size(1), ld = x.stride(0);
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = row_argmax(p + r * ld, n);
  });
  return out;
}

// this build's own op namespace (its module name, hash included: two builds never collide); the
// extra macro level expands TORCH_EXTENSION_NAME before TORCH_LIBRARY pastes it
#define LAB_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

LAB_LIBRARY(TORCH_EXTENSION_NAME, m) {
  // the first index of each row's largest value (NaN largest)
  m.def("argmax_rows(Tensor x) -> Tensor", &argmax_rows);
}
