// hvdcompress kernels; semantics and byte layouts are documented in kernels.h.
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
namespace {

constexpr int64_t kGrain = 1 << 16;  // elements below which a loop stays on one thread
constexpr int kMaxThreads = 256;
constexpr int64_t kBlock = 2048;  // elements per block: codes and sums stay in L1

// The instruction set for the loops compiled three times (HVDC_WIDE below, the DGC pass): 2 for
// AVX-512 (F and BW), 1 for AVX2, 0 for the baseline; HVDC_NO_AVX512 / HVDC_NO_AVX2 in the
// environment turn one off (tests compare them). Every version computes the same bits.
int cpu_isa() {
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

int threads_for(int64_t work) {
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

// The uniforms of elements i0 + j, j = 0, 1, ... (kernels.h): base = uint32(i0) * kGolden + key,
// so that vectorised loops keep a 32-bit counter j.
inline uint32_t block_base(uint32_t key, int64_t i0) { return static_cast<uint32_t>(i0) * kGolden + key; }

inline uint32_t uniform24(uint32_t base, uint32_t j) { return fmix32(base + j * kGolden) >> 8; }

inline float uniform(uint32_t base, uint32_t j) {
  return static_cast<float>(uniform24(base, j)) * (1.0f / 16777216.0f);
}

// Calls f(i0, m) for blocks [i0, i0 + m) of kBlock elements, in parallel.
template <class F>
void parallel_blocks(int64_t n, F f) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) f(k * kBlock, std::min(kBlock, n - k * kBlock));
  });
}

// Round half to even for 0 <= y < 2^22, vectorisable (no libm call).
inline float rint_small(float y) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (y + magic) - magic;
}

inline int twobit_code(float v, float t) {
  return (v >= t ? 3 : 0) + (v <= -t ? 2 : 0) + (v != v ? 1 : 0);  // exclusive cases
}

inline float finite_or_zero(float v) { return v - v == 0.0f ? v : 0.0f; }  // vectorisable isfinite

// Stochastic rounding of r = |x| * inv to a level in [0, levels]; see kernels.h. Branch-free
// (selects only) so that the element loops vectorise.
template <bool Natural>
struct Levels {
  int levels;
  float smallest;  // natural: the smallest nonzero level, 2^(1 - levels)
  float stretch;   // natural: 2^(levels - 1), maps [0, smallest) onto [0, 1)

  explicit Levels(int levels_)
      : levels(levels_), smallest(std::ldexp(1.0f, 1 - levels_)), stretch(std::ldexp(1.0f, levels_ - 1)) {}

  int operator()(float r, float u) const {
    r = r >= 0.0f ? r : 0.0f;  // NaN -> 0
    if (Natural) {
      r = std::min(r, 2.0f);
      const uint32_t b = bits_of(r);
      const float p = float_of((b & 0x7FFFFFu) | 0x3F800000u) - 1.0f;  // 2m - 1 of frexp
      const int big = std::min(static_cast<int>(b >> 23) - 127 + levels + (u < p ? 1 : 0), levels);
      const int small = u < r * stretch ? 1 : 0;
      return r < smallest ? small : big;
    }
    const float top = static_cast<float>(levels) + 1.0f;
    r = r < top ? r : top;
    const float low = static_cast<float>(static_cast<int>(r));  // floor for r >= 0
    const int level = static_cast<int>(low + (u < r - low ? 1.0f : 0.0f));
    return level < levels ? level : levels;
  }
};

// One block of levels_pack / ternary_pack: m elements of x, uniforms from base.
template <bool Natural>
HVDC_INLINE void levels_block(const float* x, uint32_t m, float inv, int levels, uint32_t base,
                              uint8_t* out) {
  const Levels<Natural> level_of(levels);
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const float v = x[j];
    const int level = level_of(std::fabs(v) * inv, uniform(base, j));
    out[j] = static_cast<uint8_t>(v != v ? -128 : (v < 0 ? -level : level));
  }
}

HVDC_WIDE(levels_block_linear, (const float* x, uint32_t m, float inv, int levels, uint32_t base, uint8_t* out),
          levels_block<false>(x, m, inv, levels, base, out))
HVDC_WIDE(levels_block_natural, (const float* x, uint32_t m, float inv, int levels, uint32_t base, uint8_t* out),
          levels_block<true>(x, m, inv, levels, base, out))

HVDC_INLINE void ternary_body(const float* x, uint32_t m, float inv, uint32_t base, uint8_t* out) {
  const Levels<false> level_of(1);
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const float v = x[j];
    const int level = level_of(std::fabs(v) * inv, uniform(base, j));
    out[j] = static_cast<uint8_t>(v != v ? 1 : level * (v < 0 ? 2 : 3));
  }
}
HVDC_WIDE(ternary_block, (const float* x, uint32_t m, float inv, uint32_t base, uint8_t* out),
          ternary_body(x, m, inv, base, out))

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

HVDC_INLINE double abs_term(float v) { return static_cast<double>(std::fabs(v)); }

// c[j] = 1 iff the sign bit of v[j] is clear (+0 -> 1, -0 -> 0).
HVDC_INLINE void sign_codes(const float* v, int64_t m, uint8_t* c) {
  for (int64_t j = 0; j < m; ++j) c[j] = static_cast<uint8_t>((~bits_of(v[j])) >> 31);
}

// sign_pack's block: the codes of x into c, and *s = sum |x[j]| in 16 lanes (each |x[j]| is
// exact in double, so the sum barely depends on the order: its float32 mean equals any other
// double-accumulated sum's, e.g. the plain-torch fallback's).
HVDC_INLINE void sign_body(const float* x, int64_t m, uint8_t* c, double* s) {
  *s = lanes16_sum(x, m, abs_term);
  sign_codes(x, m, c);
}

// EF-signSGD's first pass over a block: *s = sum |residual[j] + x[j]| (as sign_body), writing
// nothing: the second pass reads x and the residual again rather than a stored sum (one write
// of n floats less, which costs more than the read).
HVDC_INLINE void ef_abs_body(const float* x, const float* residual, int64_t m, double* s) {
  alignas(64) float p[kBlock];
  for (int64_t j = 0; j < m; ++j) p[j] = residual[j] + x[j];
  *s = lanes16_sum(p, m, abs_term);
}

// Its second pass: p = residual + x, the sign bits of p into c, and
// res_out = p - (bit ? scale : -scale), non-finite results stored as 0.
HVDC_INLINE void ef_sign_body(const float* x, const float* residual, int64_t m, float scale, float* res_out,
                              uint8_t* c) {
  for (int64_t j = 0; j < m; ++j) {
    const float p = residual[j] + x[j];
    const uint32_t bit = (~bits_of(p)) >> 31;
    res_out[j] = finite_or_zero(p - (bit ? scale : -scale));
    c[j] = static_cast<uint8_t>(bit);
  }
}

HVDC_ISA_CLONES void sub_finite_block(const float* a, const float* b, int64_t m, float* out) {
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) out[j] = finite_or_zero(a[j] - b[j]);
}

// max over [0, m) of the magnitude keys bits(|x|) & 0x7FFFFFFF, which order like |x| with NaN
// above +inf. An integer max: exact in any order, so an ISA clone.
HVDC_ISA_CLONES uint32_t max_magnitude_key(const float* x, int64_t m) {
  uint32_t best = 0;
#pragma omp simd reduction(max : best)
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t key = bits_of(x[j]) & 0x7FFFFFFFu;
    best = key > best ? key : best;
  }
  return best;
}

// One chunk of minmax_pack (m elements): bounds[0..1] = min, max, and the m codes. Min, max
// and the elementwise quantisation are exact in any order, so an ISA clone.
HVDC_ISA_CLONES void minmax_chunk(const float* v, int64_t m, uint8_t* q, float* bounds) {
  float mn = v[0], mx = v[0], poison = 0.0f;
#pragma omp simd reduction(min : mn) reduction(max : mx) reduction(+ : poison)
  for (int64_t i = 0; i < m; ++i) {
    mn = v[i] < mn ? v[i] : mn;
    mx = v[i] > mx ? v[i] : mx;
    poison += v[i] * 0.0f;  // NaN iff some element is not finite
  }
  if (poison != 0.0f) {
    bounds[0] = bounds[1] = std::nanf("");
    std::fill(q, q + m, uint8_t{0});
    return;
  }
  bounds[0] = mn;
  bounds[1] = mx;
  const float range = mx - mn;
  const float inv = range > 0.0f ? 255.0f / range : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < m; ++i) {
    float y = rint_small((v[i] - mn) * inv);
    y = y < 0.0f ? 0.0f : (y > 255.0f ? 255.0f : y);
    q[i] = static_cast<uint8_t>(static_cast<int>(y));
  }
}

// o[j] (+)= the float32 value of the bfloat16 bit pattern b[j]; exact, so at any width.
HVDC_INLINE void bf16_body(const uint16_t* b, int64_t m, bool first, float* o) {
  if (first) {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) o[j] = 0.0f + float_of(static_cast<uint32_t>(b[j]) << 16);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) o[j] += float_of(static_cast<uint32_t>(b[j]) << 16);
  }
}
HVDC_WIDE(bf16_block, (const uint16_t* b, int64_t m, bool first, float* o), bf16_body(b, m, first, o))

// One block of twobit_pack: codes of x[0..m) (+ residual, the new residual into res_out, which
// may be residual, when given).
HVDC_ISA_CLONES void twobit_block(const float* x, const float* residual, uint32_t m, float t,
                                  uint8_t* c, float* res_out) {
  if (residual == nullptr) {
#pragma omp simd
    for (uint32_t j = 0; j < m; ++j) c[j] = static_cast<uint8_t>(twobit_code(x[j], t));
    return;
  }
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const float v = x[j] + residual[j];
    const int pos = v >= t, neg = v <= -t;
    res_out[j] = finite_or_zero(v - t * static_cast<float>(pos - neg));
    c[j] = static_cast<uint8_t>(3 * pos + 2 * neg + (v != v ? 1 : 0));
  }
}

// Compares are on int32 (every operand is below 2^31): AVX2 has no unsigned 32-bit compare.
HVDC_INLINE void natural_body(const float* x, uint32_t m, uint32_t base, uint8_t* out) {
#pragma omp simd
  for (uint32_t j = 0; j < m; ++j) {
    const uint32_t u = bits_of(x[j]);
    const int32_t a = static_cast<int32_t>(u & 0x7FFFFFFFu);
    const int32_t up = static_cast<int32_t>(uniform24(base, j)) < 2 * (a & 0x7FFFFF) ? 1 : 0;
    const int32_t e8 = (a >> 23) + up;
    int32_t c = e8 < 27 ? 0 : (e8 > 152 ? 127 : e8 - 26);
    c = (a >> 23) == 0 ? 0 : c;
    c |= static_cast<int32_t>(u >> 31) << 7;
    out[j] = static_cast<uint8_t>(a > 0x7F800000 ? 0x80 : c);
  }
}
HVDC_WIDE(natural_block, (const float* x, uint32_t m, uint32_t base, uint8_t* out), natural_body(x, m, base, out))


// The binary16 bits of v (kernels.h half_cast), in integer arithmetic: the code for CPUs without
// F16C, whose vcvtps2ph gives the same bits.
inline uint16_t fp16_bits(float v) {
  const uint32_t u = bits_of(v), a = u & 0x7FFFFFFFu;
  uint32_t h;
  if (a > 0x7F800000u) {  // NaN: quiet, with the top 10 bits of the payload
    h = 0x7E00u | ((a >> 13) & 0x3FFu);
  } else if (a >= 0x477FF000u) {  // 65520 (the midpoint above 65504, which is odd) or more
    h = 0x7C00u;
  } else if (a >= 0x38800000u) {  // 2^-14 or more: normal; rebias the exponent, round off 13 bits
    const uint32_t r = a - 0x38000000u;
    h = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  } else if (a >= 0x33000000u) {  // 2^-25 or more: a subnormal count of 2^-24, rounded
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - (a >> 23);  // |v| = m 2^-shift 2^-24
    h = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  } else {  // below half of 2^-24: zero
    h = 0;
  }
  return static_cast<uint16_t>(((u >> 16) & 0x8000u) | h);
}

void fp16_block(const float* x, int64_t m, uint16_t* out) {
  for (int64_t j = 0; j < m; ++j) out[j] = fp16_bits(x[j]);
}

#ifdef HVDC_F16C
// fp16_block by F16C (8 at a time; the tail through a zero-padded vector).
__attribute__((target("avx,f16c"))) void fp16_block_f16c(const float* x, int64_t m, uint16_t* out) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t j = 0;
  for (; j + 8 <= m; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm256_cvtps_ph(_mm256_loadu_ps(x + j), kRound));
  if (j < m) {
    float tail[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    uint16_t h[8];
    std::memcpy(tail, x + j, static_cast<size_t>(m - j) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm256_cvtps_ph(_mm256_loadu_ps(tail), kRound));
    std::memcpy(out + j, h, static_cast<size_t>(m - j) * sizeof(uint16_t));
  }
}

bool cpu_has_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#endif

// The float32 value of the binary16 pattern h (kernels.h fp16_sum): exact, in integer
// arithmetic, with the bits of F16C's vcvtph2ps (a NaN keeps its sign and payload, made quiet).
inline float fp16_value(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return float_of(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
  return float_of(sign | bits_of(static_cast<float>(m) * 0x1p-24f));  // subnormal (or zero): m 2^-24
}

// o[j] = (first) or += the float32 value of the binary16 pattern b[j].
void fp16_sum_block(const uint16_t* b, int64_t m, bool first, float* o) {
  if (first) {
    for (int64_t j = 0; j < m; ++j) o[j] = fp16_value(b[j]);
  } else {
    for (int64_t j = 0; j < m; ++j) o[j] += fp16_value(b[j]);
  }
}

#ifdef HVDC_F16C
// fp16_sum_block by F16C, 8 at a time (the tail by fp16_value: the same bits).
__attribute__((target("avx,f16c"))) void fp16_sum_block_f16c(const uint16_t* b, int64_t m, bool first,
                                                             float* o) {
  int64_t j = 0;
  for (; j + 8 <= m; j += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j)));
    _mm256_storeu_ps(o + j, first ? v : _mm256_add_ps(_mm256_loadu_ps(o + j), v));
  }
  fp16_sum_block(b + j, m - j, first, o + j);
}

// The same by AVX-512, 16 at a time.
__attribute__((target("avx512f"))) void fp16_sum_block_avx512(const uint16_t* b, int64_t m, bool first,
                                                              float* o) {
  int64_t j = 0;
  for (; j + 16 <= m; j += 16) {
    const __m512 v =  // (maskz: GCC 12 warns on the unmasked intrinsic's undefined source)
        _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + j)));
    _mm512_storeu_ps(o + j, first ? v : _mm512_add_ps(_mm512_loadu_ps(o + j), v));
  }
  fp16_sum_block(b + j, m - j, first, o + j);
}
#endif

// The bfloat16 bits of x[0..m) (kernels.h half_cast); integer arithmetic, so at any width.
HVDC_INLINE void bf16_cast_body(const float* x, int64_t m, uint16_t* out) {
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t u = bits_of(x[j]);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    out[j] = static_cast<uint16_t>(static_cast<int32_t>(u & 0x7FFFFFFFu) > 0x7F800000 ? 0xFFFFu : rounded);
  }
}
HVDC_WIDE(bf16_cast_block, (const float* x, int64_t m, uint16_t* out), bf16_cast_body(x, m, out))

// Packs the m codes of c (BITS bits each; c has room for padding up to a whole byte) into
// ceil(m * BITS / 8) bytes of o, 8 / BITS codes per byte by one multiplication.
template <int BITS>
HVDC_INLINE void pack_block(uint8_t* c, int64_t m, uint8_t* __restrict o) {
  constexpr int per = 8 / BITS;
  for (int64_t j = m; j < (m + per - 1) / per * per; ++j) c[j] = 0;
  for (int64_t b = 0; b < (m + per - 1) / per; ++b) {
    if (BITS == 1) {
      uint64_t v;
      std::memcpy(&v, c + 8 * b, 8);
      o[b] = static_cast<uint8_t>((v * 0x8040201008040201ull) >> 56);
    } else if (BITS == 2) {
      uint32_t v;
      std::memcpy(&v, c + 4 * b, 4);
      o[b] = static_cast<uint8_t>((static_cast<uint64_t>(v) * 0x40100401ull) >> 24);
    } else {
      o[b] = c[b];
    }
  }
}

// Packs BITS-bit codes, block by block: fill(i0, m, c) writes the codes of elements
// [i0, i0 + m) into the byte array c, then pack_block packs them.
template <int BITS, class Fill>
void pack_codes(int64_t n, uint8_t* __restrict out, Fill fill) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) uint8_t c[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      fill(i0, static_cast<uint32_t>(m), c);
      pack_block<BITS>(c, m, out + i0 / (8 / BITS));
    }
  });
}

// *s = sum of x[j]^2 in double, in 16 lanes as lanes16_sum.
HVDC_INLINE void squares_body(const float* x, int64_t m, double* s) {
  *s = lanes16_sum(x, m, [](float v) { return static_cast<double>(v) * static_cast<double>(v); });
}
HVDC_WIDE(sign_block, (const float* x, int64_t m, uint8_t* c, double* s), sign_body(x, m, c, s))
HVDC_WIDE(ef_abs_block, (const float* x, const float* residual, int64_t m, double* s),
          ef_abs_body(x, residual, m, s))
HVDC_WIDE(ef_sign_block, (const float* x, const float* residual, int64_t m, float scale, float* res_out, uint8_t* c),
          ef_sign_body(x, residual, m, scale, res_out, c))
HVDC_WIDE(squares_block, (const float* x, int64_t m, double* s), squares_body(x, m, s))

// Output blocks of the decoders: summed in an L1 buffer, then stored. Outputs of at least
// kStreamMin floats take streaming stores (16-byte aligned): a large output is not read before
// it is written (a third less memory traffic), nor kept in cache.
constexpr int64_t kStreamMin = int64_t{1} << 20;

inline void store_block(float* __restrict dst, const float* __restrict src, int64_t m, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    int64_t j = 0;
    for (; j < m && reinterpret_cast<uintptr_t>(dst + j) % 16; ++j) dst[j] = src[j];
    for (; j + 4 <= m; j += 4) _mm_stream_ps(dst + j, _mm_loadu_ps(src + j));
    for (; j < m; ++j) dst[j] = src[j];
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, static_cast<size_t>(m) * sizeof(float));
}

inline void stream_fence(bool stream) {
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
  (void)stream;
}

// Decodes and sums R payloads block by block, then applies finish(block, m) to each summed block
// while it is in L1. Codes of fewer than 8 bits are looked up a byte at a time when n is large:
// each rank's table widened to the 8 / BITS floats of every byte value (256 rows, built once per
// call), so a byte adds a short vector instead of 8 / BITS extracted lookups. The same floats are
// added in the same order either way.
template <int BITS, class Finish>
void unpack_sum_impl(const uint8_t* packed, int64_t n, const float* tables, int64_t R, float* out,
                     Finish finish) {
  constexpr int per = 8 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1;
  const int64_t nbytes = packed_bytes(n, BITS);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const bool widen = BITS < 8 && n >= 64 * 256 * per;
  std::vector<float> wide(widen ? static_cast<size_t>(R) * 256 * per : 0);
  for (int64_t r = 0; r < (widen ? R : 0); ++r)
    for (int byte = 0; byte < 256; ++byte)
      for (int j = 0; j < per; ++j)
        wide[(r * 256 + byte) * per + j] = tables[(r << BITS) + ((byte >> (8 - BITS * (j + 1))) & mask)];
  const bool stream = n >= kStreamMin;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) uint8_t c[kBlock];
    alignas(64) float o[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      if (BITS < 8 || R == 0)
        for (int64_t i = 0; i < m; ++i) o[i] = 0.0f;
      for (int64_t r = 0; r < R; ++r) {
        const uint8_t* p = packed + r * nbytes + i0 / per;
        const float* table = tables + (r << BITS);
        const uint8_t* code = p;
        int64_t done = 0;  // elements added through the widened table
        if (widen) {
          const float* w = wide.data() + r * 256 * per;
          for (; done + per <= m; done += per) {
            const float* row = w + p[done / per] * per;
#if defined(__SSE2__)
            for (int j = 0; j < per; j += 4)
              _mm_storeu_ps(o + done + j, _mm_add_ps(_mm_loadu_ps(o + done + j), _mm_loadu_ps(row + j)));
#else
            for (int j = 0; j < per; ++j) o[done + j] += row[j];
#endif
          }
        }
        if (BITS < 8) {
          for (int64_t b = done / per; b < (m + per - 1) / per; ++b)
            for (int j = 0; j < per; ++j) c[b * per + j] = (p[b] >> (8 - BITS * (j + 1))) & mask;
          code = c;
        }
        if (BITS == 8 && r == 0)  // the first rank's values onto +0.0 (no zeroing pass)
          for (int64_t i = 0; i < m; ++i) o[i] = 0.0f + table[code[i]];
        else
          for (int64_t i = done; i < m; ++i) o[i] += table[code[i]];
      }
      finish(o, m);
      store_block(out + i0, o, m, stream);
    }
    stream_fence(stream);
  });
}

// Selection for the sparsifiers: |x[i]| >= t, or x[i] is NaN.
inline bool selected(float v, float t) { return !(std::fabs(v) < t); }

// Counted in 32-bit lanes per chunk of 2^16 (vectorises on every SIMD width; an integer sum, so
// the clones agree), summed in 64 bits.
HVDC_ISA_CLONES int64_t count_selected(const float* x, int64_t b, int64_t e, float t) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  int64_t c = 0;
  for (int64_t i0 = b; i0 < e; i0 += kChunk) {
    const int64_t i1 = std::min(e, i0 + kChunk);
    int32_t chunk = 0;
#pragma omp simd reduction(+ : chunk)
    for (int64_t i = i0; i < i1; ++i) chunk += selected(x[i], t) ? 1 : 0;
    c += chunk;
  }
  return c;
}

// masks[g] bit j = selected(x[64 g + j], t), for g < groups: the selection's flags as bits.
void selected_masks(const float* x, int64_t groups, float t, uint64_t* masks) {
  for (int64_t g = 0; g < groups; ++g, x += 64) {
    uint64_t mask = 0;
#if defined(__SSE2__)
    const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
    const __m128 threshold = _mm_set1_ps(t);
    for (int q = 0; q < 16; ++q) {  // !(|x| < t): NaN is selected, as in selected()
      const __m128 a = _mm_and_ps(_mm_loadu_ps(x + 4 * q), magnitude);
      mask |= static_cast<uint64_t>(_mm_movemask_ps(_mm_cmpnlt_ps(a, threshold))) << (4 * q);
    }
#else
    for (int j = 0; j < 64; ++j) mask |= (selected(x[j], t) ? uint64_t{1} : 0) << j;
#endif
    masks[g] = mask;
  }
}

#ifdef HVDC_F16C
// selected_masks, eight lanes at a time (AVX2 CPUs).
__attribute__((target("avx2"))) void selected_masks_avx2(const float* x, int64_t groups, float t, uint64_t* masks) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 threshold = _mm256_set1_ps(t);
  for (int64_t g = 0; g < groups; ++g, x += 64) {
    uint64_t mask = 0;
    for (int q = 0; q < 8; ++q) {  // not-less-than, unordered: NaN is selected
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + 8 * q), magnitude);
      mask |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, threshold, _CMP_NLT_UQ))) << (8 * q);
    }
    masks[g] = mask;
  }
}
#endif

using MasksFn = void (*)(const float*, int64_t, float, uint64_t*);

MasksFn masks_kernel() {
#ifdef HVDC_F16C
  static const MasksFn chosen = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? selected_masks_avx2 : selected_masks;
  }();
  return chosen;
#else
  return selected_masks;
#endif
}

// Calls f(i) for the selected i in [b, e), ascending: the flags of 4,096 elements at a time as
// bit masks (vectorised), then one call per set bit, so a sparse selection costs about one read
// of x.
template <class F>
HVDC_INLINE void for_each_selected(const float* x, int64_t b, int64_t e, float t, F f) {
  constexpr int64_t kGroups = 64;
  uint64_t masks[kGroups];
  const MasksFn fill = masks_kernel();
  int64_t i = b;
  while (i + 64 <= e) {
    const int64_t groups = std::min(kGroups, (e - i) / 64);
    fill(x + i, groups, t, masks);
    for (int64_t g = 0; g < groups; ++g, i += 64)
      for (uint64_t mask = masks[g]; mask; mask &= mask - 1) f(i + __builtin_ctzll(mask));
  }
  for (; i < e; ++i)
    if (selected(x[i], t)) f(i);
}

// ---- exact top-k (topk_abs) ----------------------------------------------------------------------
// Magnitude keys: the bits of |v|, which order like |v| with NaN above +inf (below 2^31).
inline uint32_t magnitude_key(float v) { return bits_of(v) & 0x7FFFFFFFu; }

constexpr int64_t kTopkStored = int64_t{1} << 16;  // candidates kept in memory: max(this, k / 4)
constexpr int kTopkLowBits = 15;  // topk_abs's first histogram counts the top 16 bits of a key ...
constexpr int kTopkSmallLowBits = 20;  // ... or 11 when n < kTopkStored (2048 counters)

// h[key >> shift] += 1 over the keys of x[0..m).
void top_histogram(const float* x, int64_t m, int shift, uint32_t* h) {
  for (int64_t i = 0; i < m; ++i) ++h[magnitude_key(x[i]) >> shift];
}

// h[key & (2^kTopkLowBits - 1)] += 1 over the keys of x[0..m) whose top 16 bits are `top`.
void low_histogram(const float* x, int64_t m, uint32_t top, uint32_t* h) {
  for (int64_t i = 0; i < m; ++i) {
    const uint32_t key = magnitude_key(x[i]);
    if ((key >> kTopkLowBits) == top) ++h[key & ((1u << kTopkLowBits) - 1)];
  }
}

// The bucket, counted from the top, that holds the need-th largest key of the slices'
// histograms (slice s at h + s * width); need becomes the key's rank within that bucket.
uint32_t rank_bucket(const uint32_t* h, int slices, uint32_t width, int64_t& need) {
  uint32_t bucket = width - 1;
  for (;; --bucket) {
    int64_t c = 0;
    for (int s = 0; s < slices; ++s) c += h[static_cast<size_t>(s) * width + bucket];
    if (c >= need || bucket == 0) return bucket;
    need -= c;
  }
}

// Calls f(i, key) for the i in [b, e) whose magnitude key is >= lo, ascending; like
// for_each_selected, only groups of 16 holding such a key are walked. Keys and lo are below 2^31,
// so the group test is a signed compare (vectorised on any x86-64).
template <class F>
HVDC_INLINE void for_each_key_from(const float* x, int64_t b, int64_t e, uint32_t lo, F f) {
  constexpr int kGroup = 16;
  const int32_t low = static_cast<int32_t>(lo);
  int64_t i = b;
  for (; i + kGroup <= e; i += kGroup) {
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int j = 0; j < kGroup; ++j) any |= static_cast<int32_t>(magnitude_key(x[i + j])) >= low ? 1 : 0;
    if (!any) continue;
    for (int j = 0; j < kGroup; ++j) {
      const uint32_t key = magnitude_key(x[i + j]);
      if (key >= lo) f(i + j, key);
    }
  }
  for (; i < e; ++i) {
    const uint32_t key = magnitude_key(x[i]);
    if (key >= lo) f(i, key);
  }
}

// Keeps, in place and in their order, the `need` (1 <= need <= m) largest-keyed of the m
// candidates (v[j], idx[j]), ties to the earlier ones; returns need.
int64_t keep_largest(float* v, int64_t* idx, int64_t m, int64_t need) {
  if (need == m) return m;
  std::vector<uint32_t> keys(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) keys[j] = magnitude_key(v[j]);
  std::nth_element(keys.begin(), keys.begin() + (need - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t kth = keys[need - 1];
  int64_t ties = need;  // how many keys equal to kth are kept: need - #(keys > kth)
  for (int64_t j = 0; j < m; ++j) ties -= keys[j] > kth ? 1 : 0;
  int64_t w = 0;
  for (int64_t j = 0; j < m; ++j) {
    const uint32_t key = magnitude_key(v[j]);
    if (key > kth || (key == kth && ties-- > 0)) {
      v[w] = v[j];
      idx[w++] = idx[j];
    }
  }
  return w;
}

// q (cols x r, row-major) transposed: row k of the result is column k of q.
inline std::vector<float> transposed(const float* q, int64_t cols, int64_t r) {
  std::vector<float> qt(static_cast<size_t>(r * cols));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < r; ++k) qt[k * cols + j] = q[j * r + k];
  return qt;
}

// ---- PowerSGD blocks: len <= kBlock columns of one row; qt is q transposed (row stride cols).
// Elementwise in float32 (the same results with or without AVX2); dot products use 8 fixed
// lanes summed in lane order, whatever the vector width.
HVDC_ISA_CLONES void project_block(const float* eb, const float* gb, float* mb, const float* qt,
                                   int64_t cols, int64_t r, int64_t len, double* dot) {
  if (gb != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) mb[j] = eb[j] + gb[j];
  } else if (mb != eb) {
    std::memcpy(mb, eb, static_cast<size_t>(len) * sizeof(float));
  }
  for (int64_t k = 0; k < r; ++k) {
    const float* qk = qt + k * cols;
    float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = 0;
    for (; j + 8 <= len; j += 8)
      for (int l = 0; l < 8; ++l) lane[l] += mb[j + l] * qk[j + l];
    float s = 0.0f;
    for (int l = 0; l < 8; ++l) s += lane[l];
    for (; j < len; ++j) s += mb[j] * qk[j];
    dot[k] += s;
  }
}

// acc[k * kBlock + j] += p_i[k] * mb[j]
HVDC_ISA_CLONES void back_block(float* acc, const float* p_i, const float* mb, int64_t r, int64_t len) {
  for (int64_t k = 0; k < r; ++k) {
    const float pk = p_i[k];
    float* ak = acc + k * kBlock;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) ak[j] += pk * mb[j];
  }
}

// out[j] = row[j] - sum_k p_i[k] * qt[k][j], non-finite results stored as 0 (out may be row)
HVDC_ISA_CLONES void residual_block(const float* row, const float* p_i, const float* qt, int64_t cols,
                                    int64_t r, int64_t len, float* out) {
  alignas(64) float acc[kBlock];
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) acc[j] = p_i[0] * qt[j];
  for (int64_t k = 1; k < r; ++k) {
    const float pk = p_i[k];
    const float* qk = qt + k * cols;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) acc[j] += pk * qk[j];
  }
#pragma omp simd
  for (int64_t j = 0; j < len; ++j) out[j] = finite_or_zero(row[j] - acc[j]);
}

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

// out[0..m) = +0.0; streaming stores for a large output (kStreamMin floats or more), which is
// then not read before being written.
inline void zero_fill(float* out, int64_t m) {
#if defined(__SSE2__)
  if (m >= kStreamMin) {
    int64_t j = 0;
    for (; j < m && reinterpret_cast<uintptr_t>(out + j) % 16; ++j) out[j] = 0.0f;
    const __m128 zero = _mm_setzero_ps();
    for (; j + 4 <= m; j += 4) _mm_stream_ps(out + j, zero);
    for (; j < m; ++j) out[j] = 0.0f;
    _mm_sfence();
    return;
  }
#endif
  std::fill(out, out + m, 0.0f);
}

template <class Index>
void scatter_add_impl(const float* values, const Index* indices, int64_t m, int64_t n, float* out) {
  check_indices("scatter_add", indices, m, n);
  parallel_for(n, 1, [&](int64_t b, int64_t e) { zero_fill(out + b, e - b); });
  // Each thread owns a range of destinations and applies the entries that fall in it, in order.
  run_slices(n, std::min<int>(threads_for(m * 8), threads_for(n)), [&](int, int, int64_t b, int64_t e) {
    for (int64_t j = 0; j < m; ++j) {
      int64_t i = indices[j];
      if (i >= b && i < e) out[i] += values[j];
    }
  });
}

}  // namespace

int64_t packed_bytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

// ---- signs ------------------------------------------------------------------------------------
float sign_pack(const float* x, int64_t n, uint8_t* out) {
  const double total = block_sum(n, [&](int64_t i0, int64_t m) {  // one read of x
    alignas(64) uint8_t c[kBlock];
    double s;
    sign_block(x + i0, m, c, &s);
    pack_block<1>(c, m, out + i0 / 8);
    return s;
  });
  return static_cast<float>(total / static_cast<double>(std::max<int64_t>(1, n)));
}

float ef_sign_pack(const float* x, const float* residual, int64_t n, uint8_t* out, float* res_out) {
  const double total = block_sum(n, [&](int64_t i0, int64_t m) {
    double s;
    ef_abs_block(x + i0, residual + i0, m, &s);
    return s;
  });
  const float scale = n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
  pack_codes<1>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) {
    ef_sign_block(x + i0, residual + i0, m, scale, res_out + i0, c);
  });
  return scale;
}

// ---- 2 bits -----------------------------------------------------------------------------------
void twobit_pack(const float* x, const float* residual, int64_t n, float t, uint8_t* out, float* res_out) {
  if (residual != nullptr && res_out == nullptr)
    throw std::invalid_argument("twobit_pack: a residual needs an output buffer for the new residual");
  pack_codes<2>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) {
    twobit_block(x + i0, residual ? residual + i0 : nullptr, m, t, c, residual ? res_out + i0 : nullptr);
  });
}

// ---- stochastic levels ------------------------------------------------------------------------
void levels_pack(const float* x, int64_t n, float inv, int levels, bool natural, uint32_t key,
                 uint8_t* out) {
  if (levels < 1 || levels > 127)
    throw std::invalid_argument("levels_pack: levels=" + std::to_string(levels) + " is outside [1, 127]");
  const auto block = natural ? levels_block_natural : levels_block_linear;
  parallel_blocks(n, [=](int64_t i0, int64_t m) {
    block(x + i0, static_cast<uint32_t>(m), inv, levels, block_base(key, i0), out + i0);
  });
}

void ternary_pack(const float* x, int64_t n, float inv, uint32_t key, uint8_t* out) {
  pack_codes<2>(n, out, [=](int64_t i0, uint32_t m, uint8_t* c) {
    ternary_block(x + i0, m, inv, block_base(key, i0), c);
  });
}

void natural_pack(const float* x, int64_t n, uint32_t key, uint8_t* out) {
  parallel_blocks(n, [=](int64_t i0, int64_t m) {
    natural_block(x + i0, static_cast<uint32_t>(m), block_base(key, i0), out + i0);
  });
}

void unpack_sum(const uint8_t* packed, int64_t n, int bits, const float* tables, int64_t R,
                float* out) {
  const auto keep = [](float*, int64_t) {};
  switch (bits) {
    case 1: return unpack_sum_impl<1>(packed, n, tables, R, out, keep);
    case 2: return unpack_sum_impl<2>(packed, n, tables, R, out, keep);
    case 8: return unpack_sum_impl<8>(packed, n, tables, R, out, keep);
    default: throw std::invalid_argument("unpack_sum: bits=" + std::to_string(bits) + "; allowed: 1, 2, 8");
  }
}

void half_cast(const float* x, int64_t n, bool bf16, uint16_t* out) {
#ifdef HVDC_F16C
  static const bool f16c = cpu_has_f16c();
  void (*fp16)(const float*, int64_t, uint16_t*) = f16c ? fp16_block_f16c : fp16_block;
#else
  void (*fp16)(const float*, int64_t, uint16_t*) = fp16_block;
#endif
  parallel_blocks(n, [=](int64_t i0, int64_t m) { (bf16 ? bf16_cast_block : fp16)(x + i0, m, out + i0); });
}

// The R 16-bit payloads summed block by block: block(bits, m, first, o) adds (or, first, writes)
// m decoded values into the L1 block o, stored once summed.
template <class Block>
void half_sum(const uint16_t* bits, int64_t n, int64_t R, float* out, Block block) {
  const bool stream = n >= kStreamMin;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, kBlock, [&](int64_t k0, int64_t k1) {
    alignas(64) float o[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t i0 = k * kBlock, m = std::min(kBlock, n - i0);
      for (int64_t r = 0; r < R; ++r) block(bits + r * n + i0, m, r == 0, o);
      if (R == 0) std::fill(o, o + m, 0.0f);
      store_block(out + i0, o, m, stream);
    }
    stream_fence(stream);
  });
}

void bf16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out) { half_sum(bits, n, R, out, bf16_block); }

void fp16_sum(const uint16_t* bits, int64_t n, int64_t R, float* out) {
#ifdef HVDC_F16C  // AVX-512, F16C (on an AVX2 CPU; HVDC_NO_AVX2 selects the scalar code), or scalar
  static const auto block = cpu_isa() == 2 ? fp16_sum_block_avx512
                            : cpu_isa() == 1 && cpu_has_f16c() ? fp16_sum_block_f16c : fp16_sum_block;
#else
  const auto block = fp16_sum_block;
#endif
  half_sum(bits, n, R, out, block);
}

void sign_vote(const uint8_t* packed, int64_t n, int64_t R, float scale, float* out) {
  std::vector<float> tables(2 * R);
  for (int64_t r = 0; r < R; ++r) tables[2 * r] = -1.0f, tables[2 * r + 1] = 1.0f;
  unpack_sum_impl<1>(packed, n, tables.data(), R, out, [scale](float* o, int64_t m) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i)  // branch-free: the signs are random
      o[i] = static_cast<float>(static_cast<int>(o[i] > 0.0f) - static_cast<int>(o[i] < 0.0f)) * scale;
  });
}

// ---- min-max 8 bits ---------------------------------------------------------------------------
void minmax_pack(const float* x, int64_t n, int64_t chunk, uint8_t* codes, float* bounds) {
  if (chunk < 1) throw std::invalid_argument("minmax_pack: chunk must be >= 1");
  const int64_t chunks = (n + chunk - 1) / chunk;
  parallel_for(chunks, chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      minmax_chunk(x + c * chunk, std::min(chunk, n - c * chunk), codes + c * chunk, bounds + 2 * c);
  });
}

void minmax_unpack_sum(const uint8_t* codes, const float* bounds, int64_t n, int64_t chunk,
                       int64_t R, float* out) {
  if (chunk < 1) throw std::invalid_argument("minmax_unpack_sum: chunk must be >= 1");
  const int64_t chunks = (n + chunk - 1) / chunk;
  parallel_for(chunks, chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i0 = c * chunk, m = std::min(chunk, n - i0);
      float* o = out + i0;
      for (int64_t i = 0; i < m; ++i) o[i] = 0.0f;
      for (int64_t r = 0; r < R; ++r) {
        const float mn = bounds[2 * (r * chunks + c)], mx = bounds[2 * (r * chunks + c) + 1];
        const float step = (mx - mn) / 255.0f;
        const uint8_t* q = codes + r * n + i0;
        for (int64_t i = 0; i < m; ++i) o[i] += mn + static_cast<float>(q[i]) * step;
      }
    }
  });
}

// ---- reductions --------------------------------------------------------------------------------
float max_abs(const float* x, int64_t n) {
  uint32_t part[kMaxThreads] = {0};
  const int slices = threads_for(n);
  run_slices(n, slices, [&](int t, int, int64_t b, int64_t e) { part[t] = max_magnitude_key(x + b, e - b); });
  uint32_t m = 0;
  for (int t = 0; t < slices; ++t) m = std::max(m, part[t]);
  return m > 0x7F800000u ? std::nanf("") : float_of(m);  // keys above +inf's are NaNs
}

float l2_norm(const float* x, int64_t n) {
  const double total = block_sum(n, [&](int64_t i0, int64_t m) {
    double s;
    squares_block(x + i0, m, &s);
    return s;
  });
  return static_cast<float>(std::sqrt(total));
}

// ---- sparsification ---------------------------------------------------------------------------
int64_t count_ge(const float* x, int64_t n, float t) {
  return static_cast<int64_t>(parallel_sum(n, 1, [&](int64_t b, int64_t e) {
    return static_cast<double>(count_selected(x, b, e, t));
  }));
}

int64_t select_ge(const float* x, int64_t n, float t, int64_t cap, float* values, int64_t* indices) {
  const int threads = threads_for(n);
  std::vector<int64_t> offset(threads + 1, 0);
  if (threads > 1) {  // order-preserving: each slice writes from the count of the slices before
    run_slices(n, threads, [&](int th, int, int64_t b, int64_t e) { offset[th + 1] = count_selected(x, b, e, t); });
    for (int th = 0; th < threads; ++th) offset[th + 1] += offset[th];
  }
  int64_t total = 0;
  run_slices(n, threads, [&](int th, int, int64_t b, int64_t e) {
    int64_t w = offset[th];
    for_each_selected(x, b, e, t, [&](int64_t i) {
      if (w < cap) {
        values[w] = x[i];
        indices[w] = i;
      }
      ++w;
    });
    if (th == threads - 1) total = w;
  });
  return total;
}

void sub_finite(const float* a, const float* b, int64_t n, float* out) {
  parallel_blocks(n, [=](int64_t i0, int64_t m) { sub_finite_block(a + i0, b + i0, m, out + i0); });
}

// u' = m, v' = v + m (+ g) over [b, e); the arithmetic of kernels.h, one element at a time.
template <bool kNesterov>
HVDC_INLINE void momentum_elements(const float* g, const float* u, const float* v, int64_t b, int64_t e,
                                   float mu, float* u_out, float* v_out) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float m = kNesterov ? (u[i] + g[i]) * mu : u[i] * mu + g[i];
    v_out[i] = kNesterov ? (v[i] + m) + g[i] : v[i] + m;
    u_out[i] = m;
  }
}

// Into outputs other than u and v (TensorFlow's tensors are immutable): streaming stores, which
// skip reading each output line before writing it (7 memory streams become 5, as in place). The
// same operations as momentum_elements, four lanes at a time, so the bits are the same.
template <bool kNesterov>
void momentum_streamed(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu,
                       float* u_out, float* v_out) {
#if defined(__SSE2__)
  int64_t i = b;
  const int64_t head = std::min(e, b + static_cast<int64_t>(((16 - reinterpret_cast<uintptr_t>(u_out + b) % 16) % 16) / 4));
  momentum_elements<kNesterov>(g, u, v, b, head, mu, u_out, v_out);
  const __m128 m4 = _mm_set1_ps(mu);
  for (i = head; i + 4 <= e; i += 4) {
    const __m128 gi = _mm_loadu_ps(g + i), ui = _mm_loadu_ps(u + i), vi = _mm_loadu_ps(v + i);
    const __m128 m = kNesterov ? _mm_mul_ps(_mm_add_ps(ui, gi), m4) : _mm_add_ps(_mm_mul_ps(ui, m4), gi);
    _mm_stream_ps(v_out + i, kNesterov ? _mm_add_ps(_mm_add_ps(vi, m), gi) : _mm_add_ps(vi, m));
    _mm_stream_ps(u_out + i, m);
  }
  momentum_elements<kNesterov>(g, u, v, i, e, mu, u_out, v_out);
  _mm_sfence();
#else
  momentum_elements<kNesterov>(g, u, v, b, e, mu, u_out, v_out);
#endif
}

void momentum_correction(const float* g, const float* u, const float* v, int64_t n, float mu,
                         bool nesterov, float* u_out, float* v_out) {
  // streamed when the outputs are separate and equally aligned (both 16-byte steps from b)
  const bool stream = u_out != u && v_out != v && n >= kGrain &&
                      (reinterpret_cast<uintptr_t>(u_out) - reinterpret_cast<uintptr_t>(v_out)) % 16 == 0;
  parallel_for(n, 1, [&](int64_t b, int64_t e) {
    if (stream)
      nesterov ? momentum_streamed<true>(g, u, v, b, e, mu, u_out, v_out)
               : momentum_streamed<false>(g, u, v, b, e, mu, u_out, v_out);
    else
      nesterov ? momentum_elements<true>(g, u, v, b, e, mu, u_out, v_out)
               : momentum_elements<false>(g, u, v, b, e, mu, u_out, v_out);
  });
}

// ---- DGC: momentum correction fused with the selection ------------------------------------------
namespace {

// Where dgc_select's pass records the selected elements: the first `room` into the caller's
// values / indices, the later ones (when `keep_later`, a slice after the first) into lists, all
// of those cleared; with keep_later false, the later ones are only counted (not cleared). The u
// values it clears are kept, to be put back if the selection is not taken.
struct DgcSink {
  float* values = nullptr;
  int64_t* indices = nullptr;
  int64_t room = 0;
  bool keep_later = false;
  bool masking = false;
  int64_t count = 0;
  std::vector<int64_t> later_i;
  std::vector<float> later_v;
  std::vector<std::pair<int64_t, float>> cleared_u;

  // Records selected element i (v_new, u_new); returns whether it is cleared, and clears m, vn.
  HVDC_INLINE void take(int64_t i, float& vn, float& m) {
    if (count < room) {
      values[count] = vn;
      indices[count] = i;
    } else if (keep_later) {
      later_i.push_back(i);
      later_v.push_back(vn);
    } else {
      ++count;
      return;
    }
    ++count;
    vn = 0.0f;
    if (masking || !(m - m == 0.0f)) {
      cleared_u.emplace_back(i, m);
      m = 0.0f;
    }
  }
};

template <bool kNesterov>
HVDC_INLINE void dgc_values(float g, float u, float v, float mu, float& m, float& vn) {
  m = kNesterov ? (u + g) * mu : u * mu + g;
  vn = kNesterov ? (v + m) + g : v + m;
}

template <bool kNesterov>
HVDC_INLINE void dgc_elements(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu,
                              float t, float* u_out, float* v_out, DgcSink& sink) {
  for (int64_t i = b; i < e; ++i) {
    float m, vn;
    dgc_values<kNesterov>(g[i], u[i], v[i], mu, m, vn);
    if (selected(vn, t)) sink.take(i, vn, m);
    u_out[i] = m;
    v_out[i] = vn;
  }
}

// The pass over [b, e): scalar.
template <bool kNesterov, bool kStream>
void dgc_pass_scalar(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu, float t,
                     float* u_out, float* v_out, DgcSink& sink) {
  dgc_elements<kNesterov>(g, u, v, b, e, mu, t, u_out, v_out, sink);
}

#ifdef HVDC_F16C
// The vector registers of the SIMD pass: 8 lanes (AVX2) or 16 (AVX-512F). Each function carries
// its instruction set; the passes below are flattened into functions of the same one.
struct Lanes8 {
  using V = __m256;
  static constexpr int kWidth = 8;
  __attribute__((target("avx2"))) static V load(const float* p) { return _mm256_loadu_ps(p); }
  __attribute__((target("avx2"))) static V set1(float x) { return _mm256_set1_ps(x); }
  __attribute__((target("avx2"))) static V add(V a, V b) { return _mm256_add_ps(a, b); }
  __attribute__((target("avx2"))) static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  __attribute__((target("avx2"))) static void store(float* p, V a) { _mm256_storeu_ps(p, a); }
  __attribute__((target("avx2"))) static void stream(float* p, V a) { _mm256_stream_ps(p, a); }
  // bit j: lane j's |vn| >= t or NaN (selected())
  __attribute__((target("avx2"))) static unsigned selected(V vn, V t) {
    const V magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(vn, magnitude), t, _CMP_NLT_UQ)));
  }
};

struct Lanes16 {
  using V = __m512;
  static constexpr int kWidth = 16;
  __attribute__((target("avx512f"))) static V load(const float* p) { return _mm512_loadu_ps(p); }
  __attribute__((target("avx512f"))) static V set1(float x) { return _mm512_set1_ps(x); }
  __attribute__((target("avx512f"))) static V add(V a, V b) { return _mm512_add_ps(a, b); }
  __attribute__((target("avx512f"))) static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  __attribute__((target("avx512f"))) static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
  __attribute__((target("avx512f"))) static void stream(float* p, V a) { _mm512_stream_ps(p, a); }
  __attribute__((target("avx512f"))) static unsigned selected(V vn, V t) {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(vn), t, _CMP_NLT_UQ);
  }
};

// The pass over [b, e) in L::kWidth lanes, the same operations per element as dgc_elements;
// blocks holding a selected element go through a small buffer. kStream: u_out and v_out are
// separate from u and v and equally aligned (streaming stores from the first vector boundary of
// u_out).
// (Only ever flattened into dgc_pass_avx2 / dgc_pass_avx512, so the vector ABI of a separate
// copy, which GCC warns about, never applies.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <class L, bool kNesterov, bool kStream>
void dgc_pass_simd(const float* g, const float* u, const float* v, int64_t b, int64_t e, float mu, float t,
                   float* u_out, float* v_out, DgcSink& sink) {
  using V = typename L::V;
  constexpr int W = L::kWidth, kBytes = 4 * L::kWidth;
  int64_t i = b;
  if (kStream) {
    const int64_t head =
        std::min(e, b + static_cast<int64_t>(((kBytes - reinterpret_cast<uintptr_t>(u_out + b) % kBytes) % kBytes) / 4));
    dgc_elements<kNesterov>(g, u, v, b, head, mu, t, u_out, v_out, sink);
    i = head;
  }
  const V muv = L::set1(mu), tv = L::set1(t);
  for (; i + W <= e; i += W) {
    const V gi = L::load(g + i), ui = L::load(u + i), vi = L::load(v + i);
    V m = kNesterov ? L::mul(L::add(ui, gi), muv) : L::add(L::mul(ui, muv), gi);
    V vn = kNesterov ? L::add(L::add(vi, m), gi) : L::add(vi, m);
    unsigned mask = L::selected(vn, tv);
    if (mask) {
      alignas(64) float mb[W], vb[W];
      L::store(mb, m);
      L::store(vb, vn);
      for (; mask; mask &= mask - 1) {
        const int j = __builtin_ctz(mask);
        sink.take(i + j, vb[j], mb[j]);
      }
      m = L::load(mb);
      vn = L::load(vb);
    }
    if (kStream) {
      L::stream(u_out + i, m);
      L::stream(v_out + i, vn);
    } else {
      L::store(u_out + i, m);
      L::store(v_out + i, vn);
    }
  }
  dgc_elements<kNesterov>(g, u, v, i, e, mu, t, u_out, v_out, sink);
  if (kStream) _mm_sfence();
}
#pragma GCC diagnostic pop

template <bool kNesterov, bool kStream>
__attribute__((target("avx2"), flatten)) void dgc_pass_avx2(const float* g, const float* u, const float* v,
                                                           int64_t b, int64_t e, float mu, float t, float* u_out,
                                                           float* v_out, DgcSink& sink) {
  dgc_pass_simd<Lanes8, kNesterov, kStream>(g, u, v, b, e, mu, t, u_out, v_out, sink);
}

template <bool kNesterov, bool kStream>
__attribute__((target("avx512f"), flatten)) void dgc_pass_avx512(const float* g, const float* u, const float* v,
                                                                int64_t b, int64_t e, float mu, float t,
                                                                float* u_out, float* v_out, DgcSink& sink) {
  dgc_pass_simd<Lanes16, kNesterov, kStream>(g, u, v, b, e, mu, t, u_out, v_out, sink);
}
#endif

using DgcPass = void (*)(const float*, const float*, const float*, int64_t, int64_t, float, float, float*, float*,
                         DgcSink&);

// The pass for this CPU: [isa][nesterov][stream]; isa 0 scalar, 1 AVX2, 2 AVX-512F.
DgcPass dgc_pass(bool nesterov, bool stream) {
  const int isa = cpu_isa();
  static const DgcPass table[3][2][2] = {
      {{dgc_pass_scalar<false, false>, dgc_pass_scalar<false, true>},
       {dgc_pass_scalar<true, false>, dgc_pass_scalar<true, true>}},
#ifdef HVDC_F16C
      {{dgc_pass_avx2<false, false>, dgc_pass_avx2<false, true>},
       {dgc_pass_avx2<true, false>, dgc_pass_avx2<true, true>}},
      {{dgc_pass_avx512<false, false>, dgc_pass_avx512<false, true>},
       {dgc_pass_avx512<true, false>, dgc_pass_avx512<true, true>}},
#else
      {{nullptr, nullptr}, {nullptr, nullptr}},
      {{nullptr, nullptr}, {nullptr, nullptr}},
#endif
  };
  return table[isa][nesterov][stream];
}

// Step 1 of dgc_select: the threshold from v_new at the sample positions.
float dgc_threshold(const float* g, const float* u, const float* v, float mu, bool nesterov, int64_t start,
                    int64_t stride, int64_t count, int64_t top) {
  std::vector<uint32_t> keys(static_cast<size_t>(count));
  constexpr int64_t kAhead = 16;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t i = start + j * stride;
    if (j + kAhead < count) {
      const int64_t a = i + kAhead * stride;
      __builtin_prefetch(g + a);
      __builtin_prefetch(u + a);
      __builtin_prefetch(v + a);
    }
    float m, vn;
    if (nesterov)
      dgc_values<true>(g[i], u[i], v[i], mu, m, vn);
    else
      dgc_values<false>(g[i], u[i], v[i], mu, m, vn);
    keys[j] = bits_of(vn) & 0x7FFFFFFFu;
  }
  std::nth_element(keys.begin(), keys.begin() + (top - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t key = keys[top - 1];
  return key > 0x7F800000u ? INFINITY : float_of(key);
}

}  // namespace

int64_t dgc_select(const float* g, const float* u, const float* v, int64_t n, float mu, bool nesterov,
                   int64_t start, int64_t stride, int64_t top, int64_t cap, int64_t low, int64_t high,
                   bool masking, float* u_out, float* v_out, float* values, int64_t* indices, float* threshold) {
  if (stride < 1 || start < 0) throw std::invalid_argument("dgc_select: need start >= 0, stride >= 1");
  const int64_t samples = start < n ? (n - start + stride - 1) / stride : 0;
  if (top < 1 || top > samples)
    throw std::invalid_argument("dgc_select: top=" + std::to_string(top) + " is outside [1, " +
                                std::to_string(samples) + "]");
  if (cap < 0 || cap > n)
    throw std::invalid_argument("dgc_select: cap=" + std::to_string(cap) + " is outside [0, " + std::to_string(n) + "]");
  const float t = dgc_threshold(g, u, v, mu, nesterov, start, stride, samples, top);
  *threshold = t;
  // streamed when the outputs are separate and equally aligned (as momentum_correction)
  const bool stream = u_out != u && v_out != v && n >= kGrain &&
                      (reinterpret_cast<uintptr_t>(u_out) - reinterpret_cast<uintptr_t>(v_out)) % 64 == 0;
  const DgcPass pass = dgc_pass(nesterov, stream);
  const int slices = threads_for(n);
  std::vector<DgcSink> sinks(static_cast<size_t>(slices));
  for (int s = 0; s < slices; ++s) {
    sinks[s].masking = masking;
    sinks[s].keep_later = s > 0;
  }
  sinks[0].values = values;
  sinks[0].indices = indices;
  sinks[0].room = cap;
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) { pass(g, u, v, b, e, mu, t, u_out, v_out, sinks[s]); });
  int64_t total = 0;
  for (const DgcSink& s : sinks) total += s.count;
  const bool taken = low <= total && total <= high;
  // Puts back what slice s cleared from its j-th recorded element on (all of it: from = 0).
  auto put_back = [&](DgcSink& s, int64_t from) {
    const int64_t direct = std::min(s.count, s.room);
    int64_t first = -1;  // the first index put back
    for (int64_t j = from; j < direct; ++j) {
      v_out[s.indices[j]] = s.values[j];
      if (first < 0) first = s.indices[j];
    }
    for (size_t j = static_cast<size_t>(std::max(from - direct, int64_t{0})); j < s.later_i.size(); ++j) {
      v_out[s.later_i[j]] = s.later_v[j];
      if (first < 0) first = s.later_i[j];
    }
    if (first >= 0)
      for (const auto& c : s.cleared_u)
        if (c.first >= first) u_out[c.first] = c.second;
  };
  if (!taken) {
    for (DgcSink& s : sinks) put_back(s, 0);
    return total;
  }
  int64_t w = sinks[0].count;  // slice 0 wrote its first min(count, cap) itself
  for (int s = 1; s < slices; ++s) {
    DgcSink& k = sinks[s];
    const int64_t fit = std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(k.later_i.size()), cap - w));
    for (int64_t j = 0; j < fit; ++j) {
      values[w + j] = k.later_v[j];
      indices[w + j] = k.later_i[j];
    }
    put_back(k, fit);
    w += k.count;
  }
  return total;
}

void lowrank_project(const float* e, const float* g, const float* q, int64_t rows, int64_t cols,
                     int64_t r, float* m, float* p) {
  if (rows < 0 || cols < 0 || r < 1)
    throw std::invalid_argument("lowrank_project: need rows >= 0, cols >= 0, r >= 1");
  const std::vector<float> qt = transposed(q, cols, r);
  parallel_for(rows, cols, [&](int64_t i0, int64_t i1) {
    std::vector<double> dot(static_cast<size_t>(r));
    for (int64_t i = i0; i < i1; ++i) {
      std::fill(dot.begin(), dot.end(), 0.0);
      for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
        project_block(e + i * cols + j0, g ? g + i * cols + j0 : nullptr, m + i * cols + j0, qt.data() + j0,
                      cols, r, std::min(kBlock, cols - j0), dot.data());
      for (int64_t k = 0; k < r; ++k) p[i * r + k] = static_cast<float>(dot[k]);
    }
  });
}

void lowrank_project_back(const float* m, const float* p, int64_t rows, int64_t cols, int64_t r,
                          float* q) {
  if (rows < 0 || cols < 0 || r < 1)
    throw std::invalid_argument("lowrank_project_back: need rows >= 0, cols >= 0, r >= 1");
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  // Each thread owns whole column blocks, so every q[j, k] is summed over the rows in order.
  parallel_for(blocks, rows * kBlock, [&](int64_t b0, int64_t b1) {
    std::vector<float> acc(static_cast<size_t>(r * kBlock));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kBlock, len = std::min(kBlock, cols - j0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < rows; ++i) back_block(acc.data(), p + i * r, m + i * cols + j0, r, len);
      for (int64_t j = 0; j < len; ++j)
        for (int64_t k = 0; k < r; ++k) q[(j0 + j) * r + k] = acc[k * kBlock + j];
    }
  });
}

void lowrank_residual(const float* m, const float* p, const float* q, int64_t rows, int64_t cols, int64_t r,
                      float* out) {
  if (rows < 0 || cols < 0 || r < 1)
    throw std::invalid_argument("lowrank_residual: need rows >= 0, cols >= 0, r >= 1");
  const std::vector<float> qt = transposed(q, cols, r);
  parallel_for(rows, cols, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j0 = 0; j0 < cols; j0 += kBlock)
        residual_block(m + i * cols + j0, p + i * r, qt.data() + j0, cols, r, std::min(kBlock, cols - j0),
                       out + i * cols + j0);
  });
}

float sampled_threshold(const float* x, int64_t n, int64_t start, int64_t stride, int64_t top) {
  if (stride < 1 || start < 0) throw std::invalid_argument("sampled_threshold: need start >= 0, stride >= 1");
  const int64_t count = start < n ? (n - start + stride - 1) / stride : 0;
  if (top < 1 || top > count)
    throw std::invalid_argument("sampled_threshold: top=" + std::to_string(top) + " is outside [1, " +
                                std::to_string(count) + "]");
  std::vector<uint32_t> keys(count);
  for (int64_t j = 0; j < count; ++j) keys[j] = bits_of(x[start + j * stride]) & 0x7FFFFFFFu;
  std::nth_element(keys.begin(), keys.begin() + (top - 1), keys.end(), std::greater<uint32_t>());
  return float_of(keys[top - 1]);
}

// Two passes over x. Pass 1: per-slice histograms of the keys' top 16 bits (11 when n < 2^16,
// where 2^16 counters would cost more than the data); their totals give the bucket `top` that
// holds the k-th largest key, and `need`, that key's rank within it. Pass 2: each slice writes
// its keys above `top` (all taken) to the output and its keys in `top` (the candidates) to a
// buffer, both from the counts of the slices before it, so that both lists ascend. The `need`
// largest candidates (nth_element; ties to the lower index) are then merged into the output from
// the back. Memory: 256 KiB of counters per slice, and the candidates, which are kept only when
// there are at most max(2^16, k / 4) of them (always when n < 2^16; for smooth data a bucket,
// 1/256 of an octave, holds few). Otherwise (many equal or nearly equal magnitudes, e.g. zeros)
// a second pass counts the low 15 bits within `top`, which gives the k-th key exactly, and a
// third takes the keys above it and the first `need` equal to it.
void topk_abs(const float* x, int64_t n, int64_t k, float* values, int64_t* indices) {
  if (k < 0 || k > n)
    throw std::invalid_argument("topk_abs: k=" + std::to_string(k) + " is outside [0, " + std::to_string(n) + "]");
  if (k == 0) return;
  // Slices of fewer than 2^31 elements: uint32 counters.
  const int slices = static_cast<int>(std::max<int64_t>(threads_for(n), ((n - 1) >> 31) + 1));
  const int shift = n < kTopkStored ? kTopkSmallLowBits : kTopkLowBits;
  const uint32_t width = 1u << (31 - shift);
  std::vector<uint32_t> hist(static_cast<size_t>(slices) * width, 0);
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
    top_histogram(x + b, e - b, shift, hist.data() + static_cast<size_t>(s) * width);
  });
  int64_t need = k;
  const uint32_t top = rank_bucket(hist.data(), slices, width, need);
  std::vector<int64_t> above(slices + 1, 0), in_top(slices + 1, 0);  // prefix sums over slices
  for (int s = 0; s < slices; ++s) {
    const uint32_t* h = hist.data() + static_cast<size_t>(s) * width;
    above[s + 1] = above[s] + std::accumulate(h + top + 1, h + width, int64_t{0});
    in_top[s + 1] = in_top[s] + h[top];
  }
  const int64_t count = in_top[slices];
  if (count <= std::max(kTopkStored, k / 4)) {
    std::vector<float> cand_v(static_cast<size_t>(count));
    std::vector<int64_t> cand_i(static_cast<size_t>(count));
    const uint32_t lo = top << shift, hi = lo + (1u << shift);
    run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
      int64_t w = above[s], c = in_top[s];
      for_each_key_from(x, b, e, lo, [&](int64_t i, uint32_t key) {
        if (key >= hi) {
          values[w] = x[i];
          indices[w++] = i;
        } else {
          cand_v[c] = x[i];
          cand_i[c++] = i;
        }
      });
    });
    int64_t a = k - need - 1, c = keep_largest(cand_v.data(), cand_i.data(), count, need) - 1, w = k - 1;
    while (c >= 0) {  // merge the two ascending lists from the back, in place
      if (a >= 0 && indices[a] > cand_i[c]) {
        values[w] = values[a];
        indices[w--] = indices[a--];
      } else {
        values[w] = cand_v[c];
        indices[w--] = cand_i[c--];
      }
    }
    return;
  }
  constexpr uint32_t low_width = 1u << kTopkLowBits;
  std::vector<uint32_t> low(static_cast<size_t>(slices) * low_width, 0);
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
    low_histogram(x + b, e - b, top, low.data() + static_cast<size_t>(s) * low_width);
  });
  const uint32_t low_bucket = rank_bucket(low.data(), slices, low_width, need);
  const uint32_t kth = (top << kTopkLowBits) | low_bucket;  // take every key > kth, the first `need` == kth
  std::vector<int64_t> offset(slices), take(slices);
  int64_t pos = 0, left = need;
  for (int s = 0; s < slices; ++s) {
    const uint32_t* h = low.data() + static_cast<size_t>(s) * low_width;
    take[s] = std::min<int64_t>(left, h[low_bucket]);
    left -= take[s];
    offset[s] = pos;
    pos += above[s + 1] - above[s] + std::accumulate(h + low_bucket + 1, h + low_width, int64_t{0}) + take[s];
  }
  run_slices(n, slices, [&](int s, int, int64_t b, int64_t e) {
    int64_t w = offset[s], ties = take[s];
    for_each_key_from(x, b, e, kth, [&](int64_t i, uint32_t key) {
      if (key > kth || ties-- > 0) {
        values[w] = x[i];
        indices[w++] = i;
      }
    });
  });
}

void fill_at(float* x, int64_t n, const int64_t* indices, int64_t m, float value, bool non_finite_only) {
  check_indices("fill_at", indices, m, n);
  // Sparse indices into a large x miss the cache at every element, and no hardware prefetcher
  // follows them: each target is prefetched kAhead elements early.
  constexpr int64_t kAhead = 48;
  parallel_for(m, 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j + kAhead < e) __builtin_prefetch(x + indices[j + kAhead], 1);
      float& target = x[indices[j]];
      if (!non_finite_only || !(target - target == 0.0f)) target = value;  // NaN or +-inf
    }
  });
}

void scatter_add_i32(const float* values, const int32_t* indices, int64_t m, int64_t n, float* out) {
  scatter_add_impl(values, indices, m, n, out);
}

void scatter_add_i64(const float* values, const int64_t* indices, int64_t m, int64_t n, float* out) {
  scatter_add_impl(values, indices, m, n, out);
}

}  // namespace hvdc
