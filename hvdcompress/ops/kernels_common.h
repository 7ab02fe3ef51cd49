// The helpers that the kernel sources (kernels_*.cpp) share: OpenMP slicing in fixed slices,
// the instruction-set dispatch, bit casts, the 16-lane double sums, the selection test and the
// index check. Internal to the library: the kernels' interface is kernels.h.
//
// The sources, one per section of the kernel table (hvdcompress/ops/table.py):
//   kernels_encode.cpp   encoders: signs, 2 bits, stochastic levels, natural, 16-bit floats, min-max
//   kernels_decode.cpp   decoders: the float32 sum of R payloads (codes, 16-bit floats, votes,
//                        min-max, sparse values)
//   kernels_select.cpp   reductions and selection: max |x|, l2 norm, count / select >= t,
//                        sampled threshold, exact top-k
//   kernels_update.cpp   state updates: error feedback, momentum correction, DGC's fused
//                        selection, fill_at
//   kernels_lowrank.cpp  state updates: PowerSGD's low-rank products
#pragma once

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HVDC_F16C 1  // binary16 conversion by F16C when the CPU has it (checked at run time)
#endif

// Hot block loops (the hashing ones, 2-bit and EF-sign quantisation, PowerSGD's products) are
// compiled twice on x86-64 Linux with GCC, for AVX2 and for the baseline, and picked at load time
// (function multi-versioning). Results are identical: no FMA contraction (-ffp-contract=off),
// elementwise float ops, and sums in fixed lanes. Vectorised sums whose order depends on the
// vector width (omp simd reduction) stay out of the clones.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HVDC_ISA_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HVDC_ISA_CLONES
#endif
#if defined(__GNUC__)
#define HVDC_INLINE inline __attribute__((always_inline))
#else
#define HVDC_INLINE inline
#endif

namespace hvdc {

constexpr int64_t kGrain = 1 << 16;  // elements below which a loop stays on one thread
constexpr int kMaxThreads = 256;
constexpr int64_t kBlock = 2048;  // elements per block: codes and sums stay in L1

// The instruction set for the loops compiled three times (HVDC_WIDE below, the DGC pass): 2 for
// AVX-512 (F and BW), 1 for AVX2, 0 for the baseline; HVDC_NO_AVX512 / HVDC_NO_AVX2 in the
// environment turn one off (tests compare them). Every version computes the same bits.
inline int cpu_isa() {
  static const int isa = [] {
#ifdef HVDC_F16C
    __builtin_cpu_init();
    if (std::getenv("HVDC_NO_AVX512") == nullptr && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw"))
      return 2;
    if (std::getenv("HVDC_NO_AVX2") == nullptr && __builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
  }();
  return isa;
}

template <class F>
F pick_isa(F avx512, F avx2, F base) {
  const int isa = cpu_isa();
  return isa == 2 ? avx512 : isa == 1 ? avx2 : base;
}

// HVDC_WIDE(name, (parameters), call): the function pointer `name`, set at load time to a copy
// of `call` (an HVDC_INLINE body) compiled for AVX-512 with 16 lanes, for AVX2, or for the
// baseline: for compute-bound elementwise loops (the counter hash: 32-bit multiplies), whose
// results are the same at any width.
#ifdef HVDC_F16C
#define HVDC_WIDE(name, params, call)                                                           \
  __attribute__((target("avx512f,avx512bw,prefer-vector-width=512"))) void name##_avx512 params { call; } \
  __attribute__((target("avx2"))) void name##_avx2 params { call; }                           \
  void name##_base params { call; }                                                             \
  const auto name = pick_isa(name##_avx512, name##_avx2, name##_base);
#else
#define HVDC_WIDE(name, params, call) \
  void name params { call; }
#endif

inline int threads_for(int64_t work) {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  int64_t t = std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(1, work / kGrain));
  return static_cast<int>(std::min<int64_t>(t, kMaxThreads));
#else
  (void)work;
  return 1;
#endif
}

// Calls f(slice, slices, begin, end) on `slices` contiguous slices of [0, units). The slices do
// not depend on how many threads OpenMP grants, so two calls with equal arguments cut alike.
template <class F>
void run_slices(int64_t units, int slices, F f) {
  if (slices <= 1) {
    f(0, 1, int64_t{0}, units);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(slices)
  {
    for (int s = omp_get_thread_num(); s < slices; s += omp_get_num_threads())
      f(s, slices, units * s / slices, units * (s + 1) / slices);
  }
#endif
}

// Parallel loop over [0, units) where one unit covers `per_unit` elements.
template <class F>
void parallel_for(int64_t units, int64_t per_unit, F f) {
  run_slices(units, threads_for(units * per_unit),
             [&](int, int, int64_t b, int64_t e) { f(b, e); });
}

// Parallel sum of f(begin, end) over slices, combined in slice order.
template <class F>
double parallel_sum(int64_t units, int64_t per_unit, F f) {
  double part[kMaxThreads] = {0.0};
  int used = threads_for(units * per_unit);
  run_slices(units, used, [&](int t, int, int64_t b, int64_t e) { part[t] = f(b, e); });
  double total = 0.0;
  for (int t = 0; t < used; ++t) total += part[t];
  return total;
}

// Sum over the kBlock-element blocks of [0, n) of f(i0, m) (a double; block i0 holds m elements):
// each thread adds its blocks in order, the threads' sums are added in slice order.
template <class F>
double block_sum(int64_t n, F f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return parallel_sum(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    double sum = 0.0;
    for (int64_t k = k0; k < k1; ++k) sum += f(k * kBlock, std::min(kBlock, n - k * kBlock));
    return sum;
  });
}

inline uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

inline float float_of(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// Calls f(i0, m) for blocks [i0, i0 + m) of kBlock elements, in parallel.
template <class F>
void parallel_blocks(int64_t n, F f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) f(k * kBlock, std::min(kBlock, n - k * kBlock));
  });
}

inline float finite_or_zero(float v) { return v - v == 0.0f ? v : 0.0f; }  // vectorisable isfinite

// sum over j < m of term(x[j]) in double, in 16 fixed lanes (lane l: j = l mod 16, in order) added
// in lane order, then the tail: the same sum at any vector width, so the loops that use it are
// compiled for each ISA (HVDC_WIDE).
template <class Term>
HVDC_INLINE double lanes16_sum(const float* x, int64_t m, Term term) {
  double lane[16] = {0.0};
  int64_t j = 0;
  for (; j + 16 <= m; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] += term(x[j + l]);
  double total = 0.0;
  for (int l = 0; l < 16; ++l) total += lane[l];
  for (; j < m; ++j) total += term(x[j]);
  return total;
}

// minmax_pack's and minmax_unpack_sum's arguments (kernels.h).
inline void check_minmax(const char* name, int64_t chunk, int bits) {
  if (chunk < 1) throw std::invalid_argument(std::string(name) + ": chunk must be >= 1");
  if (bits != 8 && bits != 4) throw std::invalid_argument(std::string(name) + ": bits must be 4 or 8");
  if (bits == 4 && chunk % 2) throw std::invalid_argument(std::string(name) + ": chunk must be even with bits = 4");
}

// Selection for the sparsifiers: |x[i]| >= t, or x[i] is NaN.
inline bool selected(float v, float t) { return !(std::fabs(v) < t); }

// Throws std::out_of_range naming the first index outside [0, n), if there is one.
template <class Index>
void check_indices(const char* what, const Index* indices, int64_t m, int64_t n) {
  int64_t bad = static_cast<int64_t>(parallel_sum(m, 1, [&](int64_t b, int64_t e) {
    int64_t c = 0;
    for (int64_t j = b; j < e; ++j) c += (indices[j] < 0 || indices[j] >= n) ? 1 : 0;
    return static_cast<double>(c);
  }));
  if (bad) {
    for (int64_t j = 0; j < m; ++j)
      if (indices[j] < 0 || indices[j] >= n)
        throw std::out_of_range(std::string(what) + ": index " + std::to_string(indices[j]) + " at position " +
                                std::to_string(j) + " is outside [0, " + std::to_string(n) + ")");
  }
}

#ifdef HVDC_F16C
inline bool cpu_has_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#endif

}  // namespace hvdc
